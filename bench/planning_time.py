"""Planning time of stock models, as a user runs `remat plan` (issue 10: each under 2 minutes).

For each model file it runs, as subprocesses through the shell, `remat plan MODEL --budget
1%` (refused: the error names the smallest feasible budget; where 1% is below the proven
bound and refused before the solve, the refusal timed is the bound's), then `remat plan MODEL
--budget 100%` and `remat plan MODEL --budget B` with B 110% of that smallest budget, and
prints the wall time of each, the solver the header names and the predicted peak.  The
three share a cache directory made empty for each model (REMAT_CACHE_DIR, as a user's
sweep shares ~/.cache/remat-dsl), so the refusal is a first, cold plan and the others reuse
its measured op times and block solutions; the last column plans 110% again with
`--no-cache`: that budget as a user's first plan.  Run it on an idle machine: on 2 cores
another job slows every solve.

Writes its section of docs/measurements.md (bench/_common.py), unless `--no-write`.

Usage: python bench/planning_time.py [--no-write] [MODEL.py ...]   (default: tests/models/hf_*.py)
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import ROOT, Report, add_write_flag  # noqa: E402

BIN = ROOT / ".venv" / "bin"
ABOUT = """`remat plan` of stock Hugging Face models as a user runs it, through the shell, each
model with a fresh cache directory: the refusal of 1% (which finds the smallest feasible
budget), then 100% and 110% of the smallest with the refusal's cache, then 110% again with
`--no-cache` (a user's first plan).  Issue 10's goal: each under 2 minutes."""


def run(command: str, cwd: str) -> tuple[float, subprocess.CompletedProcess]:
    env = {
        **os.environ,
        "PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}",
        "HF_HUB_OFFLINE": "1",
        "REMAT_CACHE_DIR": str(Path(cwd) / "cache"),
    }
    start = time.perf_counter()
    result = subprocess.run(["bash", "-c", command], cwd=cwd, env=env, capture_output=True, text=True)
    return time.perf_counter() - start, result


def header(plan: str, key: str) -> str:
    found = re.search(rf"^  {key} +(.*)$", plan, re.M)
    return found.group(1).strip('"') if found else "?"


def main() -> int:
    parser = add_write_flag(argparse.ArgumentParser(description=__doc__.splitlines()[0]))
    parser.add_argument("models", nargs="*")
    args = parser.parse_args()
    models = [str(Path(m).resolve()) for m in args.models] or sorted(
        str(p) for p in (ROOT / "tests" / "models").glob("hf_*.py")
    )
    report = Report("bench/planning_time.py", "Large blocks and planning time", ABOUT)
    report.line(
        f"{'model':<28} {'smallest':>12} {'refusal':>8} {'100%':>8} {'110% min':>9} {'cold':>8}  solver at 110% of the"
        " smallest"
    )
    for model in models:
        with tempfile.TemporaryDirectory() as cwd:
            refusal_s, refused = run(f"remat plan {model} --budget 1% > refused.plan", cwd)
            bound = re.search(r"no plan can peak below [^(]*\((\d+) B\)", refused.stderr)  # refused before the solve
            if bound:
                refusal_s, refused = run(f"remat plan {model} --budget {bound[1]}B > refused.plan", cwd)
            found = re.search(r"smallest feasible budget is [^(]*\((\d+) B\)", refused.stderr)
            if refused.returncode != 2 or not found:
                report.line(f"{Path(model).stem:<28} refusal failed: {refused.stderr[-500:]}")
                continue
            smallest = int(found.group(1))
            full_s, full = run(f"remat plan {model} --budget 100% > full.plan", cwd)
            min_s, near = run(f"remat plan {model} --budget {smallest * 11 // 10}B > near.plan", cwd)
            cold_s, cold = run(f"remat plan {model} --budget {smallest * 11 // 10}B --no-cache > cold.plan", cwd)
            if full.returncode or near.returncode or cold.returncode:
                report.line(f"{Path(model).stem:<28} plan failed: {(full.stderr + near.stderr + cold.stderr)[-500:]}")
                continue
            plan = (Path(cwd) / "near.plan").read_text()
            report.line(
                f"{Path(model).stem:<28} {smallest / 2**20:>8.2f} MiB {refusal_s:>7.1f}s {full_s:>7.1f}s {min_s:>8.1f}s"
                f" {cold_s:>7.1f}s  {header(plan, 'solver')}"
            )
    report.write(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
