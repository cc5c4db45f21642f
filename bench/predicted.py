"""Each solver's predicted time and smallest budget from one profile, for comparing solver
changes: run it once with the change and once with `PYTHONPATH` at a worktree of the commit
before it (this script imports `remat_dsl` from the path, not from its own tree); both read
the same cached profile and block solutions (REMAT_CACHE_DIR, NOTE: [Solution cache]), so
only the solvers differ.

For MODEL.py (`path.py:factory` selects a factory) it prints, per solver, the compute time
(every op once, ms), the smallest feasible budget over the autograd peak, and at each
fraction of the autograd peak the plan's predicted time over that compute time ("inf" when
the budget is refused) and its solver text's last word when it names a fallback
(`gradients=uncounted`, NOTE: [Two chain models]).

Usage: python bench/predicted.py MODEL.py [--fractions 0.3,0.5,0.7] [--solvers rotor,rockmate,auto]
"""

from __future__ import annotations

import argparse
import sys

from remat_dsl.capture.model_file import load_model_file
from remat_dsl.capture.pipeline import capture_graph
from remat_dsl.plan.cache import default_cache
from remat_dsl.solve.api import BudgetError
from remat_dsl.solve.driver import Planner


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model")
    parser.add_argument("--fractions", default="0.3,0.5,0.7")
    parser.add_argument("--solvers", default="rotor,rockmate,auto")
    args = parser.parse_args()
    model_file = load_model_file(args.model)
    cache = default_cache()
    captured = capture_graph(model_file, cache=cache)
    planner = Planner(captured.graph, model=model_file.spec, device=captured.device, cache=cache)
    peak = planner.autograd_peak
    compute = sum(op.time_us for op in captured.graph.ops)  # every op once
    for solver in args.solvers.split(","):
        row = []
        for fraction in (float(f) for f in args.fractions.split(",")):
            try:
                header = planner.plan(int(peak * fraction), solver).header
            except BudgetError:
                row.append(f"{fraction:.2f}: inf")
                continue
            note = " (uncounted)" if header.solver.endswith("gradients=uncounted") else ""
            row.append(f"{fraction:.2f}: {header.time_us / compute:.4f}{note}")
        smallest = planner.smallest_budget(solver) / peak
        print(f"{solver:<9} compute {compute / 1000:.1f} ms  smallest {smallest:.4f}  " + "  ".join(row), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
