"""What polish and repair gain (NOTE: [Polish and repair] in remat_dsl/solve/driver.py).

For each model: one capture, one Planner, and for each solver and budget (fractions of
the autograd peak, or `min`: the solver's smallest budget), the plan the driver gave
before polish and repair (the first candidate whose budget-corrected plan fits, as it
was) and the plan it gives now (`Planner.plan`), in the same process from the same
profile.  Prints each one's predicted time (microseconds), that time over every op run
once, the ratio now/before, what was done (the header's `; repaired` / `; polished`) and
the seconds `plan` took.  Predicted, not measured: bench/decoder.py times plans.

Costs: `--device cpu` (default: the roofline model of this machine kind, deterministic),
another device name, or `measured` (profile every op here: figures vary with the load).

The plan before polish and repair is the driver's inside (Planner._candidates and
Planner._fit): this script uses the driver's Planner, the API for the capture.  Writes its
section of docs/measurements.md (bench/_common.py), unless `--no-write`.

Usage: python bench/polish.py [MODEL ...] [--device cpu] [--solvers auto,twremat]
           [--fractions 0.7,0.5,0.3,min] [--no-write]
       (default models: examples/gpt2.py examples/transformer.py examples/unet.py)
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import ROOT, Report, add_write_flag  # noqa: E402

import remat_dsl  # noqa: E402
from remat_dsl.solve.api import BudgetError  # noqa: E402
from remat_dsl.solve.driver import Planner  # noqa: E402
from remat_dsl.workflow import capture_model  # noqa: E402

MODELS = ["examples/gpt2.py", "examples/transformer.py", "examples/unet.py"]
ABOUT = """Each example planned with each solver, from one capture in one process, as the
driver planned before polish and repair (the first candidate's budget-corrected plan that
fits) and as it plans now: predicted times in microseconds and over every op run once
(`xR`), their ratio, what was done, and the seconds `plan` took.  Predicted, not measured;
with `--device cpu` the costs are the roofline model's, so only the seconds depend on the
machine's load."""


def unimproved(planner: Planner, budget: int, solver: str):
    """The plan before polish and repair: the first candidate's budget-corrected plan that
    fits (Planner._fit), or None."""
    for candidate in planner._candidates(planner.solver(planner.chosen(solver))):
        try:
            return planner._fit(candidate, budget)[0]
        except BudgetError:
            continue
    return None


def main() -> None:
    parser = add_write_flag(
        argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    )
    parser.add_argument("models", nargs="*", default=MODELS)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--solvers", default="auto,twremat")
    parser.add_argument("--fractions", default="0.7,0.5,0.3,min")
    args = parser.parse_args()
    report = Report("bench/polish.py", "Polish and repair", ABOUT)
    report.line(f"costs: {args.device}; times in us, `xR`: over every op once; `now/before`: the ratio")
    for spec in args.models:
        model_file = remat_dsl.model_of(str(ROOT / spec) if not Path(spec).is_absolute() else spec)
        captured = capture_model(model_file, device=None if args.device == "measured" else args.device)
        planner = Planner(captured.graph, model=model_file.spec, device=captured.device)
        once = sum(op.time_us for op in captured.graph.ops)
        report.line(f"\n== {spec}: {len(captured.graph.ops)} ops, autograd peak {planner.autograd_peak} B")
        for solver in args.solvers.split(","):
            for fraction in args.fractions.split(","):
                if fraction == "min":
                    budget, label = planner.smallest_budget(planner.chosen(solver)), "smallest"
                    label = f"smallest ({100 * budget / planner.autograd_peak:.1f}%)"
                else:
                    budget, label = int(planner.autograd_peak * float(fraction)), f"{100 * float(fraction):.0f}%"
                before = unimproved(planner, budget, solver)
                start = time.perf_counter()
                try:
                    now = planner.plan(budget, solver)
                except BudgetError:
                    report.line(f"  {solver:9s} {label:17s} refused")
                    continue
                seconds = time.perf_counter() - start
                done = " ".join(w.split()[0] for w in now.header.solver.split("; ")[1:]) or "-"
                b, n = before.header.time_us, now.header.time_us
                report.line(f"  {solver:9s} {label:17s} before {b:9d} x{b / once:.3f}   now {n:9d} x{n / once:.3f}"
                            f"   now/before {n / b:.3f}   {done:17s} {seconds:5.1f} s")  # fmt: skip
    report.write(args)


if __name__ == "__main__":
    main()
