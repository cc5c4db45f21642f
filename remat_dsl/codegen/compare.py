"""Train a generated module beside the eager model and compare them bit for bit."""

from __future__ import annotations

import contextlib
import importlib.util
import sys
from dataclasses import dataclass
from pathlib import Path

import torch

from remat_dsl.capture.model_file import ModelFile


@dataclass(frozen=True)
class Comparison:
    """Results of `steps` SGD steps of eager vs generated (all comparisons use torch.equal)."""

    steps: int
    losses_equal: bool
    gradients_equal: bool
    buffers_equal: bool
    parameters_equal: bool
    mismatched: tuple[str, ...]
    eager_losses: tuple[float, ...]

    @property
    def identical(self) -> bool:
        return self.losses_equal and self.gradients_equal and self.buffers_equal and self.parameters_equal


def load_generated(path: str | Path):
    """Import a generated module from its file path (a fresh module object each call)."""
    path = Path(path)
    name = f"remat_generated_{path.stem}_{abs(hash(str(path.resolve())))}"
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None  # a path to a .py file has both
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def compare_training(model_file: ModelFile, generated, steps: int = 3, lr: float = 0.1) -> Comparison:
    """Run `steps` SGD steps of the eager model and of `generated.FastModel` from the same
    initial state and seeds; compare losses, every parameter gradient, parameters and buffers.

    With the model file's `autocast` (torch.bfloat16, torch.float16), forward and loss run
    under `torch.autocast(device, dtype)` and the backward after it, as mixed-precision
    training does.

    Both train under `torch.use_deterministic_algorithms(True, warn_only=True)`: some ops
    sum in a run-to-run order otherwise (on the CPU, `index_put` with `accumulate`, the
    backward of `weight[index]` in Hugging Face's `batched_mm` experts), and then two eager
    runs differ in the last bits as well."""
    with _deterministic():
        return _compare(model_file, generated, steps, lr)


@contextlib.contextmanager
def _deterministic():
    """`torch.use_deterministic_algorithms(True, warn_only=True)`, then the mode as it was."""
    was, warn_only = torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled()
    torch.use_deterministic_algorithms(True, warn_only=True)
    try:
        yield
    finally:
        torch.use_deterministic_algorithms(was, warn_only=warn_only)


def _compare(model_file: ModelFile, generated, steps: int, lr: float) -> Comparison:
    eager, twin = model_file.build_model(), model_file.build_model()
    fast = generated.FastModel(twin)
    inputs = model_file.sample_inputs()
    optimizers = [torch.optim.SGD(m.parameters(), lr=lr) for m in (eager, twin)]
    mismatched: list[str] = []
    buffers: list[str] = []  # after each step's forward and backward, as the step left them
    losses_equal, losses = True, []
    for step in range(steps):
        results = []
        for module, optimizer in zip((eager, fast), optimizers):
            optimizer.zero_grad(set_to_none=True)
            torch.manual_seed(1000 + step)
            with _autocast(model_file.autocast, eager):
                loss = model_file.loss_fn(inputs.call(module))
            loss.backward()
            results.append(loss.detach())
        losses_equal &= torch.equal(results[0], results[1])
        losses.append(float(results[0]))
        mismatched += [f"step {step} grad {n}" for n, a, b in _pairs(eager, twin) if not _same(a.grad, b.grad)]
        buffers += [f"step {step} buffer {n}" for n in _buffers_differing(eager, twin)]
        for optimizer in optimizers:
            optimizer.step()
    params = [n for n, a, b in _pairs(eager, twin) if not torch.equal(a, b)]
    return Comparison(
        steps=steps,
        losses_equal=losses_equal,
        gradients_equal=not mismatched,
        buffers_equal=not buffers,
        parameters_equal=not params,
        mismatched=tuple(mismatched + [f"parameter {n}" for n in params] + buffers),
        eager_losses=tuple(losses),
    )


def _autocast(dtype, model: torch.nn.Module):
    """torch.autocast(dtype) on the device kind of `model`'s parameters, or nothing for None."""
    if dtype is None:
        return contextlib.nullcontext()
    return torch.autocast(next(model.parameters()).device.type, dtype=dtype)


def _buffers_differing(a: torch.nn.Module, b: torch.nn.Module) -> list[str]:
    """Names of the buffers of `a` and `b` (every one, shared ones at each name) that are not
    equal bit for bit, or that one of them lacks."""
    first, second = dict(a.named_buffers(remove_duplicate=False)), dict(b.named_buffers(remove_duplicate=False))
    names = list(dict.fromkeys([*first, *second]))
    return [n for n in names if n not in first or n not in second or not torch.equal(first[n], second[n])]


def _pairs(a: torch.nn.Module, b: torch.nn.Module):
    for (name, pa), (_, pb) in zip(a.named_parameters(), b.named_parameters()):
        yield name, pa, pb


def _same(a, b) -> bool:
    if a is None or b is None:
        return a is None and b is None
    return torch.equal(a, b)
