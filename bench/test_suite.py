"""How long the test suite takes: `make test`'s pytest command, timed, with each test
file's summed durations from its JUnit XML.

Runs `python -m pytest -q -n 2 --dist loadfile --no-loadscope-reorder` (as `make test`
does, one OpenMP thread per worker) with `--junitxml`, then prints the wall time, the
counts (passed, failed, skipped) and the ten test files whose tests took longest in all.
Extra arguments go to pytest (`python bench/test_suite.py tests/test_units.py` times one
file).  Run it on an idle machine: the suite's time follows the machine's load.

Writes its section of docs/measurements.md (bench/_common.py), unless `--no-write`.

Usage: python bench/test_suite.py [--no-write] [PYTEST ARGS ...]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ElementTree
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import ROOT, Report, add_write_flag  # noqa: E402

PYTEST = ["-m", "pytest", "-q", "-n", "2", "--dist", "loadfile", "--no-loadscope-reorder"]
ABOUT = """`make test`'s pytest run (two workers, one test file each at a time, one OpenMP
thread per worker): wall time, counts, and the test files that took longest (seconds
summed over their tests, from the JUnit XML)."""


def main() -> int:
    parser = add_write_flag(argparse.ArgumentParser(description=__doc__.splitlines()[0]))
    args, extra = parser.parse_known_args()
    report = Report("bench/test_suite.py", "The test suite", ABOUT)
    with tempfile.TemporaryDirectory() as where:
        junit = Path(where) / "junit.xml"
        start = time.perf_counter()
        result = subprocess.run(
            [sys.executable, *PYTEST, f"--junitxml={junit}", *extra],
            cwd=ROOT,
            env={**os.environ, "OMP_NUM_THREADS": "1"},
        )
        seconds = time.perf_counter() - start
        if not junit.exists():
            print(f"pytest wrote no JUnit XML (exit status {result.returncode}): nothing to report", file=sys.stderr)
            return 1
        counts, by_file = Counter(), Counter()
        for case in ElementTree.parse(junit).getroot().iter("testcase"):
            outcome = next((child.tag for child in case if child.tag in ("failure", "error", "skipped")), "passed")
            counts[outcome] += 1
            parts = case.get("classname", "?").split(".")  # tests.test_x or tests.test_x.TestClass
            by_file[parts[1] if parts[0] == "tests" and len(parts) > 1 else parts[0]] += float(case.get("time", 0))
    shown = ", ".join(f"{n} {outcome}" for outcome, n in sorted(counts.items()))
    report.line(f"{int(seconds // 60)} min {seconds % 60:02.0f} s wall, exit status {result.returncode}: {shown}")
    report.line(f"{sum(by_file.values()):,.0f} s summed over the workers; the longest files:")
    for name, total in by_file.most_common(10):
        report.line(f"  {total:8.1f} s  tests/{name}.py")
    report.write(args)
    return result.returncode


if __name__ == "__main__":
    sys.exit(main())
