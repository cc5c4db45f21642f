"""`make demo`: plan GPT-2 at 50% of its autograd peak, generate, train, and report.

Runs the user's commands (`remat plan`, `remat check`, `remat codegen`) as subprocesses,
then three SGD steps of the eager model and of the generated module from the same seeds,
and prints budget, predicted peak and time, measured peak, and whether losses and
gradients are identical.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from remat_dsl.capture.measure import step_peak, step_seconds
from remat_dsl.capture.model_file import load_model_file
from remat_dsl.plan.parser import parse_file
from remat_dsl.plan.units import format_bytes
from remat_dsl.codegen.compare import compare_training, load_generated

MODEL = "examples/gpt2.py"
OUT = Path("build/demo")


def run(*args: str) -> None:
    command = [sys.executable, "-m", "remat_dsl", *args]
    print("$ remat " + " ".join(args), flush=True)
    subprocess.run(command, check=True)


def main() -> int:
    OUT.mkdir(parents=True, exist_ok=True)
    plan_path, module_path = OUT / "gpt2.plan", OUT / "fast_gpt2.py"
    run("plan", MODEL, "--budget", "50%", "-o", str(plan_path))
    run("check", str(plan_path))
    run("codegen", str(plan_path), "-o", str(module_path))
    plan = parse_file(str(plan_path))
    model_file = load_model_file(MODEL)
    generated = load_generated(module_path)
    comparison = compare_training(model_file, generated, steps=3)
    model, inputs = model_file.build_model(), model_file.sample_inputs()
    fast = generated.FastModel(model)
    measured, eager_peak = step_peak(fast, inputs), step_peak(model, inputs)
    fast_s, eager_s = step_seconds(fast, inputs), step_seconds(model, inputs)
    h = plan.header
    print()
    print(f"remat-dsl demo: {MODEL} ({h.solver}, {h.status})")
    print(f"  budget            {format_bytes(h.budget):>12}  (50% of the autograd plan's peak)")
    print(f"  predicted peak    {format_bytes(h.peak_bytes):>12}  at {h.peak_at}")
    print(
        f"  measured peak     {format_bytes(measured):>12}  ({100 * measured / h.peak_bytes:.2f}% of predicted; eager"
        f" {format_bytes(eager_peak)})"
    )
    print(f"  predicted time    {h.time_us / 1000:>9.3f} ms  (recompute {h.recompute_us / 1000:.3f} ms)")
    print(
        f"  measured time     {fast_s * 1000:>9.3f} ms  (eager {eager_s * 1000:.3f} ms, ratio {fast_s / eager_s:.2f})"
    )
    print(
        f"  losses identical  {'yes' if comparison.losses_equal else 'NO'}  over {comparison.steps} SGD steps,"
        " dropout on"
    )
    print(
        f"  gradients identical {'yes' if comparison.gradients_equal and comparison.parameters_equal else 'NO'} "
        " (torch.equal on every parameter gradient)"
    )
    if not comparison.identical:
        print("  mismatches: " + ", ".join(comparison.mismatched[:5]))
        return 1
    return 0 if measured <= h.budget else 1


if __name__ == "__main__":
    sys.exit(main())
