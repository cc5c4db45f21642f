"""Overhead of generated modules: time relative to eager and to per-block checkpointing.

For examples/gpt2.py and examples/resnet.py at 100%, 70% and 50% of the autograd peak,
plans with rotor, generates the module, and measures in this one run (this machine is
noisy, so every ratio compares timings taken here, interleaved round by round):

* iteration time (forward + backward) relative to eager PyTorch;
* relative to torch.utils.checkpoint on every block (the largest group of sibling modules
  of one class: GPT-2's `transformer.h.*`, the ResNet's `layer1..layer4`; non-reentrant);
* measured peak (bytes the step allocates above parameters and inputs, profiler events),
  beside the plan's prediction and eager's peak.

Usage: python bench/overhead.py [--rounds 15]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.utils.checkpoint as ckpt

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from remat_dsl.check.verify import verify  # noqa: E402
from remat_dsl.codegen.generate import generate  # noqa: E402
from remat_dsl.capture.measure import step_peak, training_step  # noqa: E402
from remat_dsl.capture.model_file import load_model_file  # noqa: E402
from remat_dsl.capture.pipeline import capture_graph  # noqa: E402
from remat_dsl.plan.units import human_bytes as format_bytes  # noqa: E402
from remat_dsl.solve.driver import autograd_peak, make_plan  # noqa: E402
from remat_dsl.codegen.compare import load_generated  # noqa: E402

EXAMPLES = ["examples/gpt2.py", "examples/resnet.py"]
FRACTIONS = [100, 70, 50]


def repeated_blocks(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The largest group of sibling modules of one class: GPT-2's `transformer.h.*`,
    the ResNet's `layer1..layer4`."""
    groups: list[list[torch.nn.Module]] = []
    for parent in model.modules():
        by_class: dict[type, list[torch.nn.Module]] = {}
        for child in parent.children():
            by_class.setdefault(type(child), []).append(child)
        groups += by_class.values()
    return max(groups, key=len)


class CheckpointEveryBlock(torch.nn.Module):
    """The model with torch.utils.checkpoint (non-reentrant) around each repeated block."""

    def __init__(self, model: torch.nn.Module):
        super().__init__()
        self.model = model
        for block in repeated_blocks(model):
            block.forward = checkpointed(block.forward)

    def forward(self, *args, **kwargs):
        return self.model(*args, **kwargs)


def checkpointed(forward):
    """`forward` run under torch.utils.checkpoint (non-reentrant)."""

    def run(*args, **kwargs):
        return ckpt.checkpoint(forward, *args, use_reentrant=False, **kwargs)

    return run


def interleaved_medians(modules: dict[str, torch.nn.Module], inputs: tuple, rounds: int) -> dict[str, float]:
    """Median step time (s) of each module, timed round-robin so noise hits all alike."""
    return {name: statistics.median(values) for name, values in interleaved_samples(modules, inputs, rounds).items()}


def interleaved_samples(modules: dict[str, torch.nn.Module], inputs: tuple, rounds: int) -> dict[str, list[float]]:
    """Each module's step times (s), one per round, timed round-robin (after one untimed
    round) so noise hits all alike; a round's times are comparable with each other."""
    steps = {name: training_step(m, inputs) for name, m in modules.items()}
    samples: dict[str, list[float]] = {name: [] for name in modules}
    for round_index in range(rounds + 1):
        for name, step in steps.items():
            modules[name].zero_grad(set_to_none=True)
            start = time.perf_counter()
            step()
            if round_index:
                samples[name].append(time.perf_counter() - start)
    return samples


def bench_example(path: str, rounds: int, workdir: Path) -> list[tuple]:
    model_file = load_model_file(str(ROOT / path))
    captured = capture_graph(model_file)
    autograd = autograd_peak(captured.graph, captured.device)
    call = model_file.sample_inputs()
    assert not call.kwargs, "the benchmarks call the examples with positional arguments"
    inputs = call.args
    rows = []
    for fraction in FRACTIONS:
        budget = autograd * fraction // 100
        plan = make_plan(captured.graph, model=model_file.spec, device=captured.device, budget=budget, solver="rotor")
        module_path = workdir / f"fast_{Path(path).stem}_{fraction}.py"
        module_path.write_text(generate(verify(plan, within_budget=False)))
        generated = load_generated(module_path)
        eager = model_file.build_model()
        fast = generated.FastModel(model_file.build_model())
        checkpointed = CheckpointEveryBlock(model_file.build_model())
        times = interleaved_medians({"eager": eager, "fast": fast, "checkpoint": checkpointed}, inputs, rounds)
        measured = step_peak(fast, inputs)
        rows.append(
            (
                Path(path).stem,
                f"{fraction}%",
                times["fast"] / times["eager"],
                times["fast"] / times["checkpoint"],
                measured,
                plan.header.peak_bytes,
                step_peak(eager, inputs),
                step_peak(checkpointed, inputs),
                times["eager"],
            )
        )
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=30)
    args = parser.parse_args()
    torch.manual_seed(0)
    rows = []
    with tempfile.TemporaryDirectory() as workdir:
        for path in EXAMPLES:
            rows += bench_example(path, args.rounds, Path(workdir))
    print(f"{'model':<8} {'budget':>6} {'vs eager':>9} {'vs ckpt':>8} {'measured peak':>14} {'predicted':>11} {'eager peak':>11} {'ckpt peak':>11} {'eager step':>11}")
    for name, label, vs_eager, vs_ckpt, measured, predicted, eager_peak, ckpt_peak, eager_s in rows:
        print(
            f"{name:<8} {label:>6} {vs_eager:>9.3f} {vs_ckpt:>8.3f} {format_bytes(measured):>14} {format_bytes(predicted):>11} "
            f"{format_bytes(eager_peak):>11} {format_bytes(ckpt_peak):>11} {eager_s * 1000:>8.1f} ms"
        )
    at_full = [r[2] for r in rows if r[1] == "100%"]
    print(f"time ratio vs eager at 100%: {', '.join(f'{x:.3f}' for x in at_full)} (goal <= 1.05)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
