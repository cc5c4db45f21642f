"""How far each solver's plans are from Moccasin's proven optimum (issue 13 part 2).

For each model: one capture (one profile), one Planner (remat_dsl.solve.driver), and for
budgets of 100/70/50/30% of the autograd peak and for each solver's smallest budget, every
solver's plan (rotor, rockmate, hiremate, twremat, checkmate where it accepts the graph,
moccasin).  Prints each plan's predicted time (microseconds) over moccasin's at the same
budget: `x1.032` when moccasin proved its optimum there; `x1.032 over bound` over its
best bound (time x (1 - gap)) when it did not: the ratio over the optimum is at most that;
`-` when moccasin has no plan.  The driver may solve below the budget (NOTE: [Budget
correction]), so moccasin's figure is the optimum at the target it was given.  That
optimum is over plans that write nothing in place and run the backward in the captured
order; the other solvers' plans, which may do both (NOTE: [In-place outputs] in
remat_dsl/plan/inplace.py), can come out below x1.000.

Moccasin's size limit (Moccasin.MAX_OPS) is lifted here with `--max-ops`, and each CP-SAT
solve gets `--time-limit` seconds (default 600): with a time limit the figures depend on
the machine's speed.  `--bound-time S` also gives the stage relaxation's first solve S
seconds alone at each budget (Moccasin.stage_bound; a moccasin solve gives it a quarter
of its time limit): where its bound is higher than moccasin's, the ratios are over it
(`over relaxation bound`).  `--moment-time S` gives the moment relaxation S seconds at each
budget (Moccasin.moment_bound, NOTE: [Moment relaxation]: fewer memory rows, so HiGHS
bounds larger graphs in minutes); the ratios are over the highest bound proven.

Usage: python bench/optimality.py [MODEL ...] [--time-limit S] [--max-ops N]
           [--fractions 0.5,0.3] [--solvers auto,rockmate] [--no-smallest] [--bound-time S]
           [--moment-time S]
       (default models: examples/transformer.py examples/gpt2.py, the latter 4 layers;
       --solvers: those compared with moccasin, `auto` included when named;
       --no-smallest: only the fractions, not each solver's smallest budget)

Moccasin's optimum, its bounds and each solver's smallest budget are the driver's: this
script uses the driver's Planner, the API for the capture.  Writes its section of
docs/measurements.md (bench/_common.py), unless `--no-write`.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import ROOT, Report, add_write_flag, relative  # noqa: E402

import remat_dsl  # noqa: E402
from remat_dsl.plan.errors import RematError  # noqa: E402
from remat_dsl.solve.driver import Planner  # noqa: E402
from remat_dsl.solve.solvers.moccasin import Moccasin  # noqa: E402
from remat_dsl.workflow import capture_model  # noqa: E402

ABOUT = """Every solver's predicted time over Moccasin's proven optimum at the same budget
(`x1.032`), or over the best proven bound when Moccasin's CP-SAT solve stopped at its time
limit (`over bound`: the ratio over the optimum is at most that), from one capture per
model.  With a time limit the figures depend on the machine's speed."""

SOLVERS = ("rotor", "rockmate", "hiremate", "twremat", "checkmate", "moccasin")
FRACTIONS = (1.0, 0.7, 0.5, 0.3)


def plan_or_none(planner: Planner, budget: int, solver: str):
    """(plan, seconds), or (None, error's first line) when the solver refuses."""
    start = time.perf_counter()
    try:
        return planner.plan(budget, solver), time.perf_counter() - start
    except RematError as error:
        return None, str(error).splitlines()[0][:90]


def ratio(plan, reference, stage_bound: int | None = None) -> str:
    """`plan`'s predicted time over moccasin's optimum, or over the best proven bound:
    moccasin's (its time x (1 - gap)) or `stage_bound` (microseconds), the higher."""
    if plan is None or reference is None:
        return "-"
    r = plan.header.time_us / reference.header.time_us
    if reference.header.status == "optimal":
        return f"x{r:.3f}"
    bound = reference.header.time_us * (1 - (reference.header.gap or 0.0))
    if stage_bound is not None and stage_bound > bound:
        return f"x{plan.header.time_us / stage_bound:.3f} over relaxation bound (x{r:.3f} over moccasin's plan)"
    return f"x{plan.header.time_us / bound:.3f} over bound (x{r:.3f} over its plan)"


def bench(report: Report, model: str, time_limit: float, fractions=FRACTIONS, solvers=SOLVERS[:-1], smallest=True,
          bound_time: float | None = None, moment_time: float | None = None) -> None:  # fmt: skip
    model_file = remat_dsl.model_of(model)
    start = time.perf_counter()
    captured = capture_model(model_file, repeats=3)
    planner = Planner(captured.graph, model=model_file.spec, device=captured.device, time_limit=time_limit)
    peak = planner.autograd_peak
    report.line(
        f"\n== {relative(model)}: {len(captured.graph.ops)} ops, autograd peak {peak} B (capture"
        f" {time.perf_counter() - start:.0f} s)"
    )
    budgets = [(f"{f:.0%}", int(peak * f)) for f in fractions]
    for solver in [*solvers, "moccasin"] if smallest else ():
        try:
            budgets.append((f"min {solver}", planner.smallest_budget(solver)))
        except RematError as error:
            report.line(f"  {solver}: no smallest budget ({str(error).splitlines()[0][:90]})")
    for label, budget in budgets:
        reference, seconds = plan_or_none(planner, budget, "moccasin")
        if reference is None:
            report.line(f"  {label:>14} {budget:>10} B  moccasin: {seconds}")
        else:
            h = reference.header
            gap = f" gap {h.gap:.2%}" if h.gap else ""
            report.line(f"  {label:>14} {budget:>10} B  moccasin {h.time_us} us, {h.status}{gap}, {seconds:.0f} s")
        stage_bound = None
        if bound_time and reference is not None and reference.header.status != "optimal":
            began = time.perf_counter()
            stage_bound = planner.solver("moccasin").stage_bound(budget, bound_time)
            report.line(f"  {'':>14} stage bound {stage_bound} us ({time.perf_counter() - began:.0f} s)")
        if moment_time and reference is not None and reference.header.status != "optimal":
            began = time.perf_counter()
            moment_bound = planner.solver("moccasin").moment_bound(budget, moment_time)
            report.line(f"  {'':>14} moment bound {moment_bound} us ({time.perf_counter() - began:.0f} s)")
            stage_bound = max((b for b in (stage_bound, moment_bound) if b is not None), default=None)
        for solver in solvers:
            plan, seconds = plan_or_none(planner, budget, solver)
            if plan is None:
                report.line(f"  {'':>14} {solver:>10}: {seconds}")
                continue
            shown = ratio(plan, reference, stage_bound)
            report.line(f"  {'':>14} {solver:>10}: {plan.header.time_us} us  {shown}  ({seconds:.0f} s)")


def main() -> int:
    parser = add_write_flag(argparse.ArgumentParser(description=__doc__.splitlines()[0]))
    parser.add_argument(
        "models", nargs="*", default=[str(ROOT / "examples/transformer.py"), str(ROOT / "examples/gpt2.py")]
    )
    parser.add_argument("--time-limit", type=float, default=600.0, help="seconds per CP-SAT solve")
    parser.add_argument("--max-ops", type=int, default=None, help="lift moccasin's size limit to this many ops")
    parser.add_argument(
        "--fractions", default=",".join(map(str, FRACTIONS)), help="budgets, fractions of the autograd peak"
    )
    parser.add_argument(
        "--solvers", default=",".join(SOLVERS[:-1]), help="solvers compared with moccasin (auto allowed)"
    )
    parser.add_argument("--no-smallest", action="store_true", help="skip each solver's smallest budget")
    parser.add_argument("--bound-time", type=float, default=None, help="seconds for the stage relaxation's bound alone")
    parser.add_argument("--moment-time", type=float, default=None, help="seconds for the moment relaxation's bound")
    args = parser.parse_args()
    if args.max_ops:
        Moccasin.MAX_OPS = args.max_ops
    fractions = tuple(float(f) for f in args.fractions.split(","))
    solvers = tuple(s for s in args.solvers.split(",") if s and s != "moccasin")
    report = Report("bench/optimality.py", "Moccasin against the default solver", ABOUT)
    for model in args.models:
        bench(
            report, model, args.time_limit, fractions, solvers, not args.no_smallest, args.bound_time, args.moment_time
        )
    report.write(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
