"""Each solver's predicted time and smallest budget from one profile, for comparing solver
changes: run it once with the change and once with `PYTHONPATH` at a worktree of the commit
before it (this script imports `remat_dsl` from the path, not from its own tree); both read
the same cached profile and block solutions (REMAT_CACHE_DIR, NOTE: [Solution cache]), so
only the solvers differ.  `--device NAME` predicts the costs for that device instead of
measuring them (docs/devices.md): the figures then do not depend on the machine's load.

For MODEL.py (`path.py:factory` selects a factory) it prints, per solver, the compute time
(every op once, ms), the smallest feasible budget over the autograd peak, and at each
fraction of the autograd peak the plan's predicted time over that compute time ("inf" when
the budget is refused) and its solver text's last word when it names a fallback
(`gradients=uncounted`, NOTE: [Two chain models]).

Writes its section of docs/measurements.md (bench/_common.py), unless `--no-write`.

Usage: python bench/predicted.py MODEL.py [--device cpu] [--fractions 0.3,0.5,0.7]
           [--solvers rotor,rockmate,auto] [--no-write]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import Report, add_write_flag  # noqa: E402

import remat_dsl  # noqa: E402
from remat_dsl.workflow import capture_model  # noqa: E402

# The Planner is no part of the API: one Planner answers every budget and each solver's
# smallest budget from one graph, with the cache's block solutions.
from remat_dsl.plan.cache import default_cache  # noqa: E402
from remat_dsl.solve.driver import Planner  # noqa: E402

ABOUT = """Each solver's plans from one profile: the smallest feasible budget over the autograd
peak, and at each fraction of it the predicted time over every op run once (`inf`:
refused; `(uncounted)`: the chain model's fallback).  Predicted, not measured."""


def main() -> int:
    parser = add_write_flag(argparse.ArgumentParser(description=__doc__.splitlines()[0]))
    parser.add_argument("model")
    parser.add_argument("--device", default=None, help="predict the costs for this device (default: measure them here)")
    parser.add_argument("--fractions", default="0.3,0.5,0.7")
    parser.add_argument("--solvers", default="rotor,rockmate,auto")
    args = parser.parse_args()
    report = Report("bench/predicted.py", "Each solver's predicted time", ABOUT)
    model_file = remat_dsl.model_of(args.model)
    captured = capture_model(model_file, device=args.device, cache=args.device is None)
    planner = Planner(captured.graph, model=model_file.spec, device=captured.device, cache=default_cache())
    peak = planner.autograd_peak
    compute = sum(op.time_us for op in captured.graph.ops)  # every op once
    report.line(f"{Path(args.model).name}: {len(captured.graph.ops)} ops, costs {captured.costs or 'measured'}")
    for solver in args.solvers.split(","):
        row = []
        for fraction in (float(f) for f in args.fractions.split(",")):
            try:
                header = planner.plan(int(peak * fraction), solver).header
            except remat_dsl.BudgetError:
                row.append(f"{fraction:.2f}: inf")
                continue
            note = " (uncounted)" if header.solver.endswith("gradients=uncounted") else ""
            row.append(f"{fraction:.2f}: {header.time_us / compute:.4f}{note}")
        smallest = planner.smallest_budget(solver) / peak
        report.line(f"{solver:<9} compute {compute / 1000:.1f} ms  smallest {smallest:.4f}  " + "  ".join(row))
    report.write(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
