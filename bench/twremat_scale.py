"""TW-Remat on graphs of any size (issue 13: a 20,000-op graph planned in under 60 s).

Builds a layered random DAG as an FB-graph (tests/synthetic_graphs.py: layers of WIDTH
ops, each adding two outputs of the layer before; one backward op per forward op that
reads its gradient and its saved inputs), then, in one process, times: the tree
decomposition, the candidate orders (TW-Remat(k) for k = B, B/2, ... bags), and whole
`Planner.plan` calls (lowering and exact simulation included) at 50% and 30% of the
store-all peak and at the smallest budget twremat reaches.  Prints the width, the
candidates' lengths and peaks, and each plan's peak and predicted time over store-all.

The graph is made, not captured, and the solver's decomposition and candidates are its
own: this script uses the driver's Planner, not the API.  Writes its section of
docs/measurements.md (bench/_common.py), unless `--no-write`.

Usage: python bench/twremat_scale.py [OPS] [WIDTH] [--no-write]     (default 20000 4)
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import ROOT, Report, add_write_flag  # noqa: E402

sys.path.insert(0, str(ROOT / "tests"))

from remat_dsl.solve.api import BudgetError  # noqa: E402
from remat_dsl.solve.driver import Planner  # noqa: E402
from synthetic_graphs import layered_fb_graph  # noqa: E402

ABOUT = """TW-Remat on a layered random DAG made as an FB-graph (tests/synthetic_graphs.py; every
op 10 us): the tree decomposition's and the candidate orders' seconds, then whole plans
(lowering, exact simulation and polish included) at 50% and 30% of the store-all peak and
at twremat's smallest budget, with each plan's peak and predicted time over every op once.
Issue 13's goal: a 20,000-op graph planned in under 60 s."""


def main() -> int:
    parser = add_write_flag(argparse.ArgumentParser(description=__doc__.splitlines()[0]))
    parser.add_argument("ops", nargs="?", type=int, default=20000)
    parser.add_argument("width", nargs="?", type=int, default=4)
    args = parser.parse_args()
    report = Report("bench/twremat_scale.py", "TW-Remat on large graphs", ABOUT)
    ops, width = args.ops, args.width
    start = time.perf_counter()
    graph = layered_fb_graph(ops, width)
    planner = Planner(graph, device="cpu")
    store_all = planner.autograd_peak
    t0 = time.perf_counter()
    solver = planner.solver("twremat")
    t1 = time.perf_counter()
    candidates = solver.candidates
    t2 = time.perf_counter()
    report.line(
        f"{len(graph.ops)} ops, layers of {width}: {solver.describe()}; decomposition {t1 - t0:.1f} s, candidates"
        f" {t2 - t1:.1f} s"
    )
    for c in candidates:
        report.line(f"  k={c.leaf_bags:>6}  {len(c.order):>7} ops  estimated peak {c.peak / store_all:6.1%}")
    smallest = planner.smallest_budget("twremat")
    for label, budget in (("50%", store_all // 2), ("30%", store_all * 3 // 10), ("smallest", smallest)):
        t = time.perf_counter()
        try:
            plan = planner.plan(budget, "twremat")
        except BudgetError as error:  # a small graph's 30% can be below twremat's smallest
            report.line(f"  {label:>8}: refused, smallest {error.smallest / store_all:.1%} of store-all")
            continue
        h = plan.header
        base = len(graph.ops) * 10  # every op is 10 us in the synthetic graph
        report.line(
            f"  {label:>8}: plan in {time.perf_counter() - t:5.1f} s, peak {h.peak_bytes / store_all:6.1%} of"
            f" store-all, time x{h.time_us / base:.2f}"
        )
    report.line(f"total {time.perf_counter() - start:.1f} s")
    report.write(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
