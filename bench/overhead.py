"""Overhead of generated modules: time relative to eager and to per-block checkpointing.

For examples/gpt2.py and examples/resnet.py at 100%, 70% and 50% of the autograd peak,
plans with rotor, generates the module, and measures in this one run (this machine is
noisy, so every ratio compares timings taken here, interleaved round by round):

* iteration time (forward + backward) relative to eager PyTorch;
* relative to torch.utils.checkpoint on every block (the largest group of sibling modules
  of one class: GPT-2's `transformer.h.*`, the ResNet's `layer1..layer4`; non-reentrant);
* measured peak (bytes the step allocates above parameters and inputs, profiler events),
  beside the plan's prediction and eager's peak.

Writes its section of docs/measurements.md (bench/_common.py), unless `--no-write`.

Usage: python bench/overhead.py [--rounds 30] [--no-write] [MODEL.py ...]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import ROOT, Report, add_write_flag, checkpoint_every_block, fast_module, interleaved_medians  # noqa: E402

import remat_dsl  # noqa: E402
from remat_dsl.capture.measure import step_peak  # noqa: E402
from remat_dsl.plan.units import human_bytes  # noqa: E402
from remat_dsl.workflow import capture_model, solve_captured  # noqa: E402

EXAMPLES = ["examples/gpt2.py", "examples/resnet.py"]
FRACTIONS = [100, 70, 50]
ABOUT = """Rotor plans of the examples at 100%, 70% and 50% of the autograd peak: the generated
module's step time over eager's ("vs eager") and over torch.utils.checkpoint around every
block ("vs ckpt"), timed interleaved round by round in one run, and the measured peaks
(what the budget counts) beside the plan's prediction.  The 100% plan runs eager's
operations: its ratio is the module's own cost, noise around 1."""


def bench_example(path: str, rounds: int, workdir: Path) -> list[tuple]:
    model_file = remat_dsl.model_of(path)
    captured = capture_model(model_file)
    inputs = model_file.sample_inputs()
    rows = []
    for fraction in FRACTIONS:
        plan = solve_captured(
            captured.graph, fraction, "rotor", percent=True, model=model_file.spec, device=captured.device
        )
        eager = model_file.build_model()
        fast = fast_module(plan, workdir / f"fast_{Path(path).stem}_{fraction}.py", model_file.build_model())
        checkpointed = checkpoint_every_block(model_file.build_model())
        times = interleaved_medians({"eager": eager, "fast": fast, "checkpoint": checkpointed}, inputs, rounds)
        rows.append(
            (
                Path(path).stem,
                f"{fraction}%",
                times["fast"] / times["eager"],
                times["fast"] / times["checkpoint"],
                step_peak(fast, inputs),
                plan.header.peak_bytes,
                step_peak(eager, inputs),
                step_peak(checkpointed, inputs),
                times["eager"],
            )
        )
    return rows


def main() -> int:
    parser = add_write_flag(argparse.ArgumentParser(description=__doc__.splitlines()[0]))
    parser.add_argument("models", nargs="*", default=EXAMPLES)
    parser.add_argument("--rounds", type=int, default=30)
    args = parser.parse_args()
    report = Report("bench/overhead.py", "Generated-module overhead", ABOUT)
    torch.manual_seed(0)
    rows = []
    with tempfile.TemporaryDirectory() as workdir:
        for path in args.models:
            rows += bench_example(str(ROOT / path), args.rounds, Path(workdir))
    report.line(
        f"{'model':<8} {'budget':>6} {'vs eager':>9} {'vs ckpt':>8} {'measured peak':>14} {'predicted':>11}"
        f" {'eager peak':>11} {'ckpt peak':>11} {'eager step':>11}"
    )
    for name, label, vs_eager, vs_ckpt, measured, predicted, eager_peak, ckpt_peak, eager_s in rows:
        report.line(
            f"{name:<8} {label:>6} {vs_eager:>9.3f} {vs_ckpt:>8.3f} {human_bytes(measured):>14}"
            f" {human_bytes(predicted):>11} {human_bytes(eager_peak):>11} {human_bytes(ckpt_peak):>11}"
            f" {eager_s * 1000:>8.1f} ms"
        )
    at_full = [r[2] for r in rows if r[1] == "100%"]
    report.line(f"time ratio vs eager at 100%: {', '.join(f'{x:.3f}' for x in at_full)} (goal <= 1.05)")
    report.write(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
