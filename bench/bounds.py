"""The smallest feasible budget against the proven lower bound (the two figures an
infeasible budget's error states; docs/plan-language.md, "What the budget counts").

For each MODEL:SOLVER pair, one capture with costs predicted for `--device` (default cpu:
the figures do not depend on the machine's load; a budget is bytes, which costs change
only through the solver's choices), then the solver's smallest feasible budget and the
bound no plan that keeps its tensors on the device can go below, with its reason.

Writes its section of docs/measurements.md (bench/_common.py), unless `--no-write`.

Usage: python bench/bounds.py [--device cpu] [--no-write] [MODEL.py:SOLVER ...]
       (default: tests/models/tiny_mlp.py:checkmate examples/gpt2.py:auto)
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import ROOT, Report, add_write_flag  # noqa: E402

import remat_dsl  # noqa: E402
from remat_dsl.plan.units import human_bytes  # noqa: E402
from remat_dsl.workflow import capture_model  # noqa: E402

# The smallest budget and the bound are the driver's (Planner.smallest_budget,
# Planner.peak_lower_bound): no part of the API, which states them in its errors.
from remat_dsl.solve.driver import Planner  # noqa: E402

PAIRS = ["tests/models/tiny_mlp.py:checkmate", "examples/gpt2.py:auto"]
ABOUT = """Each model's smallest feasible budget for one solver beside the proven lower bound
on any plan's peak (what an infeasible budget's error states), in bytes and as a share of
the autograd peak.  Where the bound is far below, it says little."""


def main() -> int:
    parser = add_write_flag(argparse.ArgumentParser(description=__doc__.splitlines()[0]))
    parser.add_argument("pairs", nargs="*", default=PAIRS, metavar="MODEL.py:SOLVER")
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args()
    report = Report("bench/bounds.py", "Smallest budgets and the proven bound", ABOUT)
    for pair in args.pairs:
        model, solver = pair.rsplit(":", 1)
        model_file = remat_dsl.model_of(str(ROOT / model))
        captured = capture_model(model_file, device=args.device)
        planner = Planner(captured.graph, model=model_file.spec, device=captured.device)
        smallest, (bound, why) = planner.smallest_budget(solver), planner.peak_lower_bound
        peak = planner.autograd_peak
        report.line(f"{model} ({solver}), autograd peak {human_bytes(peak)} ({peak:,} B):")
        report.line(f"  smallest feasible budget {human_bytes(smallest):>11} ({smallest:,} B, {smallest / peak:.1%})")
        report.line(f"  proven lower bound       {human_bytes(bound):>11} ({bound:,} B, {bound / peak:.1%}): {why}")
    report.write(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
