"""The same plan at any load (NOTE: [Load-independent costs] in remat_dsl/capture/pipeline.py).

For each model and budget, `remat plan MODEL --budget B --no-cache` runs as a user types
it, once on the machine as it is and once while one busy process per core spins (`while
True: pass`, started before the plan and stopped after it), and the two plans are
compared byte for byte.  Prints, per model and budget, the load average seen during each
run, the seconds each took, the plans' predicted peak and time, and whether they are
identical (and if not, the first line that differs).  With `--measure` the same runs time
every op here (`remat plan --measure`): the plans then show the load.  Exits 1 when two
default-costed plans differ.

Usage: python bench/load_independence.py [MODEL ...] [--budgets 50%,100%] [--measure] [--no-write]
       (default models: examples/gpt2.py bench/models/llama_d512.py)
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import ROOT, Report, add_write_flag  # noqa: E402

MODELS = ["examples/gpt2.py", "bench/models/llama_d512.py"]
ABOUT = """Each model planned twice per budget with `remat plan --no-cache` as a subprocess: idle
(the machine as it was) and loaded (one spinning process per core for the whole run).
`same` means the two plan files are byte-identical."""


def _spin() -> None:
    while True:
        pass


def plan(model: str, budget: str, out: Path, measure: bool) -> tuple[float, float, str]:
    """(seconds, 1-minute load average at the end, the plan's text) of one `remat plan`."""
    command = [sys.executable, "-m", "remat_dsl", "plan", model, "--budget", budget, "--no-cache", "-o", str(out)]
    start = time.perf_counter()
    result = subprocess.run(
        command + (["--measure"] if measure else []), cwd=ROOT, capture_output=True, text=True, timeout=1800
    )
    if result.returncode != 0:
        raise SystemExit(f"remat plan {model} --budget {budget} failed:\n{result.stderr[-2000:]}")
    return time.perf_counter() - start, os.getloadavg()[0], out.read_text()


def loaded(function, *args):
    """`function(*args)` while one spinning process per core runs."""
    spinners = [multiprocessing.Process(target=_spin, daemon=True) for _ in range(os.cpu_count() or 1)]
    for spinner in spinners:
        spinner.start()
    try:
        time.sleep(1)  # the spinners have the cores before the plan starts
        return function(*args)
    finally:
        for spinner in spinners:
            spinner.terminate()
            spinner.join()


def header_value(text: str, key: str) -> str:
    line = next((line for line in text.splitlines() if line.strip().startswith(key + " ")), "")
    return line.strip()[len(key) :].strip()


def first_difference(a: str, b: str) -> str:
    for number, (x, y) in enumerate(zip(a.splitlines(), b.splitlines()), 1):
        if x != y:
            return f"line {number}: {x.strip()!r} / {y.strip()!r}"
    return "lengths differ"


def main() -> None:
    parser = add_write_flag(
        argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    )
    parser.add_argument("models", nargs="*", default=MODELS)
    parser.add_argument("--budgets", default="50%,100%")
    parser.add_argument("--measure", action="store_true", help="time every op here (remat plan --measure)")
    parser.add_argument("--workdir", type=Path, default=None, help="where the plans are written (default: a temp dir)")
    args = parser.parse_args()
    report = Report("bench/load_independence.py", "The same plan at any load", ABOUT)
    report.line(f"costs: {'measured here (--measure)' if args.measure else 'default (roofline times, measured sizes)'}")
    workdir = args.workdir or Path(os.environ.get("TMPDIR", "/tmp")) / f"remat-load-{os.getpid()}"
    workdir.mkdir(parents=True, exist_ok=True)
    differ = 0
    for model in args.models:
        for budget in args.budgets.split(","):
            stem = Path(model).stem + "-" + budget.rstrip("%")
            idle_s, idle_load, idle = plan(model, budget, workdir / f"{stem}-idle.plan", args.measure)
            busy_s, busy_load, busy = loaded(plan, model, budget, workdir / f"{stem}-loaded.plan", args.measure)
            same = idle == busy
            differ += not same
            report.line(
                f"{model} {budget}: idle {idle_s:5.1f} s (load {idle_load:.2f}), loaded {busy_s:5.1f} s"
                f" (load {busy_load:.2f}); peak {header_value(idle, 'peak').split(' at ')[0]},"
                f" time {header_value(idle, 'time')}; "
                + ("same" if same else f"DIFFER, {first_difference(idle, busy)}")
            )
    report.write(args)
    if differ and not args.measure:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
