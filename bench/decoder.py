"""The Llama-style decoder at 40% of the autograd peak (issue 13 acceptance): the default
solver's measured time over eager's, side by side in one process, on one thread.

For bench/models/llama_d512.py (stock Hugging Face LlamaForCausalLM, d=512, 4 layers,
batch 4 x 256) with torch.set_num_threads(1): captures and profiles the step on that one
thread (so the plan is made from the costs it runs at), plans it with `--solver auto` at
each budget, generates the module, and times, interleaved round by round:

* eager PyTorch (the baseline of every ratio);
* the generated module;
* torch.utils.checkpoint (non-reentrant) around every decoder layer.

It prints each one's median step time over eager's, the median and quartiles of its
per-round ratios (its time over eager's in the same round: how much the machine's noise
moves the ratio), and its measured peak (the profiler's
allocator events, as the budget counts it) over eager's, beside the plan's predicted time
and that time over its compute (every op once: the recomputation it predicts).  A budget below the default
solver's smallest is reported and planned at that smallest budget.  Goal: at most 1.10x eager at 40%.
With `--bound S`, it also gives each budget S seconds of HiGHS on the moment relaxation
(NOTE: [Moment relaxation] in remat_dsl/solve/solvers/stage_relaxation.py) and prints the proven
bound over every op once: no plan that runs the forward once and the backward in the
captured order, recomputing in between and writing nothing in place, predicts less at
that budget (the default solver's plans write in place and move backward ops up, NOTE:
[In-place outputs] in remat_dsl/plan/inplace.py: they can predict less).

Writes its section of docs/measurements.md (bench/_common.py), unless `--no-write`.

Usage: python bench/decoder.py [--rounds 11] [--budgets 40] [--bound S] [--no-write] [MODEL.py]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

import statistics  # noqa: E402

from _common import ROOT, Report, add_write_flag, checkpoint_every_block, fast_module, interleaved_samples  # noqa: E402

import remat_dsl  # noqa: E402
from remat_dsl.capture.measure import step_peak  # noqa: E402
from remat_dsl.plan.units import human_bytes  # noqa: E402
from remat_dsl.workflow import capture_model  # noqa: E402

# The API's solve_captured refuses a budget below the proven bound before any solve; this
# script plans such a budget at the default solver's smallest, which the driver's Planner
# finds (Planner.plan raises BudgetError with it).
from remat_dsl.solve.driver import Planner  # noqa: E402

ABOUT = """A stock Hugging Face LlamaForCausalLM on one thread, planned with the default
solver (`auto`) at each budget (a budget below its smallest is planned at the smallest),
timed interleaved round by round against eager PyTorch and torch.utils.checkpoint around
every decoder layer: the median step over eager's, the median and quartiles of the
per-round ratios (how much the machine's noise moves the ratio), the measured peak over
eager's, and the plan's predicted time over every op run once.  Goal: at most 1.10x
eager at 40%."""


def main() -> int:
    parser = add_write_flag(argparse.ArgumentParser(description=__doc__.splitlines()[0]))
    parser.add_argument("model", nargs="?", default=str(ROOT / "bench" / "models" / "llama_d512.py"))
    parser.add_argument("--rounds", type=int, default=11)
    parser.add_argument("--budgets", default="40", help="comma-separated percentages of the autograd peak")
    parser.add_argument("--bound", type=float, default=None, help="seconds of HiGHS for a proven bound at each budget")
    args = parser.parse_args()
    report = Report("bench/decoder.py", "Llama decoders at 40% of the autograd peak", ABOUT)
    torch.set_num_threads(1)
    model_file = remat_dsl.model_of(args.model)
    captured = capture_model(model_file)
    inputs = model_file.sample_inputs()
    eager = model_file.build_model()
    modules = {"eager": eager, "checkpoint": checkpoint_every_block(model_file.build_model())}
    predicted = {}
    planner = Planner(captured.graph, model=model_file.spec, device=captured.device)
    with tempfile.TemporaryDirectory() as workdir:
        for percent in (int(p) for p in args.budgets.split(",")):
            try:
                plan = planner.plan(planner.autograd_peak * percent // 100, "auto")
            except remat_dsl.BudgetError as error:  # below the default solver's smallest budget: plan at it
                report.line(
                    f"{percent}%: {error.args[0]}; planned at the smallest"
                    f" ({error.smallest / planner.autograd_peak:.1%})"
                )
                plan = planner.plan(error.smallest, "auto")
            name = f"{plan.header.solver} {percent}%"
            modules[name] = fast_module(plan, Path(workdir) / f"fast_{percent}.py", model_file.build_model())
            predicted[name] = plan.header
            if args.bound:
                report.line(moment_bound(planner, plan, percent, args.bound))
        samples = interleaved_samples(modules, inputs, args.rounds)
    times = {name: statistics.median(values) for name, values in samples.items()}
    ratios = {name: [t / e for t, e in zip(values, samples["eager"])] for name, values in samples.items()}
    eager_peak = step_peak(eager, inputs)
    report.line(
        f"{Path(args.model).name}, one thread, {args.rounds} interleaved rounds; eager step {times['eager'] * 1000:.1f}"
        f" ms, peak {human_bytes(eager_peak)}"
    )
    report.line(
        f"{'module':<44} {'time / eager':>12} {'per round: median [q1, q3]':>27} {'peak / eager':>12}"
        f" {'predicted time (over every op once)':>36}"
    )
    for name, module in modules.items():
        peak = step_peak(module, inputs)
        header = predicted.get(name)
        guess = (
            f"{header.time_us / 1000:.1f} ms (x{header.time_us / header.compute_us:.3f})" if header is not None else ""
        )
        q1, q2, q3 = statistics.quantiles(ratios[name], n=4) if len(ratios[name]) > 1 else ratios[name] * 3
        spread = f"{q2:.3f} [{q1:.3f}, {q3:.3f}]"
        report.line(
            f"{name:<44} {times[name] / times['eager']:>12.3f} {spread:>27} {peak / eager_peak:>12.3f} {guess:>36}"
        )
    report.write(args)
    return 0


def moment_bound(planner: Planner, plan, percent: int, seconds: float) -> str:
    """The moment relaxation's proven bound at `plan`'s budget after `seconds` of HiGHS,
    as a line.  Moccasin's relaxation is no part of the API: its solver is the driver's,
    its size limit lifted (a bound, not a plan: any size)."""
    from remat_dsl.solve.solvers.moccasin import Moccasin

    Moccasin.MAX_OPS = max(Moccasin.MAX_OPS, len(planner.problem.graph.ops))
    bound = planner.solver("moccasin").moment_bound(plan.header.budget, seconds)
    shown = "none proven in time" if bound is None else f"x{bound / plan.header.compute_us:.4f} of every op once"
    return (
        f"{percent}%: plan predicts x{plan.header.time_us / plan.header.compute_us:.4f}; moment relaxation's bound "
        f"({seconds:.0f} s): {shown}"
    )


if __name__ == "__main__":
    sys.exit(main())
