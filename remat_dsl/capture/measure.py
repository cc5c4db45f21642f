"""Measure the peak memory and time of a training step, the way the budget counts it.

The budget counts what one forward and backward allocate above what is resident before the
step (parameters, buffers, inputs, and the gradients the caller gives for the outputs):
activations, temporaries, the outputs and the parameter gradients (NOTE: [Gradient zeros]
in remat_dsl.capture.fbgraph).  So a step's unit output gradients are made before the
step measured: `step_peak` runs one step first, whose outputs give their shapes.  On CPU
the PyTorch profiler's raw `[memory]` allocator events, ordered by time, with a running
sum of their sizes give an exact, repeatable peak (identical over runs, processes and
thread counts: docs/measured-notes.md, "Capture probe"); on
CUDA we use `torch.cuda.max_memory_allocated` above the allocation at the start.
"""

from __future__ import annotations

import os
import statistics
import sys
import time
from contextlib import contextmanager
from typing import Callable, Iterator

import torch
import torch.utils._pytree as pytree
from torch.profiler import ProfilerActivity, profile

from remat_dsl.capture.model_file import Inputs, call_with


@contextmanager
def _native_stderr_silenced() -> Iterator[None]:
    """Kineto prints `USDT ... profiler_start/stop` lines on the process's stderr."""
    sys.stderr.flush()
    saved, devnull = os.dup(2), os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 2)
    try:
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        os.close(devnull)


@contextmanager
def memory_profiler() -> Iterator[profile]:
    """`torch.profiler.profile` recording CPU allocator events, without kineto's chatter."""
    prof = profile(activities=[ProfilerActivity.CPU], profile_memory=True)
    with _native_stderr_silenced():
        prof.__enter__()
    try:
        yield prof
    finally:
        with _native_stderr_silenced():
            prof.__exit__(None, None, None)


def memory_events(prof: profile) -> list[tuple[int, int]]:
    """(start_ns, bytes) of every allocation (+) and free (-), in time order."""
    assert prof.profiler is not None and prof.profiler.kineto_results is not None  # set once the profile has run
    events = prof.profiler.kineto_results.events()
    # torch's stubs give _KinetoEvent no nbytes() (the C++ binding has it)
    return sorted((e.start_ns(), e.nbytes()) for e in events if e.name() == "[memory]")  # type: ignore[attr-defined]


def _differentiable(outputs) -> list[torch.Tensor]:
    """The output leaves that need a gradient, in pytree order."""
    return [t for t in pytree.tree_leaves(outputs) if isinstance(t, torch.Tensor) and t.requires_grad]


def unit_output_gradients(module: torch.nn.Module, inputs: Inputs | tuple) -> list[torch.Tensor]:
    """`torch.ones_like` of each output leaf of `module(inputs)` that needs a gradient, in
    pytree order, from one forward whose outputs are then dropped."""
    return [torch.ones_like(t) for t in _differentiable(call_with(module, inputs))]


def training_step(
    module: torch.nn.Module, inputs: Inputs | tuple, grads: list[torch.Tensor] | None = None
) -> Callable[[], None]:
    """One forward and backward of `module` with unit gradients for every output that needs
    one: `grads` (`unit_output_gradients`), else made at the first call and kept for the
    later ones (the caller's memory, made before the step like the inputs)."""
    grads = [] if grads is None else list(grads)

    def step() -> None:
        flat = _differentiable(call_with(module, inputs))
        if not grads:
            grads.extend(torch.ones_like(t) for t in flat)
        torch.autograd.backward(flat, grads)

    return step


def peak_bytes(step: Callable[[], None], device: str = "cpu") -> int:
    """Peak bytes allocated while `step()` runs, above what was allocated before it."""
    if device.startswith("cuda"):
        torch.cuda.synchronize()
        base = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        step()
        torch.cuda.synchronize()
        return torch.cuda.max_memory_allocated() - base
    with memory_profiler() as prof:
        step()
    current = peak = 0
    for _, nbytes in memory_events(prof):
        current += nbytes
        peak = max(peak, current)
    return peak


def step_peak(module: torch.nn.Module, inputs: Inputs | tuple, device: str = "cpu") -> int:
    """Measured peak of one training step of `module`, after one that makes the output
    gradients (`training_step`); its gradients are reset before each."""
    step = training_step(module, inputs)
    with torch.random.fork_rng():
        module.zero_grad(set_to_none=True)
        step()
        module.zero_grad(set_to_none=True)
        peak = peak_bytes(step, device)
    module.zero_grad(set_to_none=True)
    return peak


def step_seconds(module: torch.nn.Module, inputs: Inputs | tuple, repeats: int = 5) -> float:
    """Median wall time (seconds) of a training step of `module`, after one warm-up."""
    step = training_step(module, inputs)
    samples = []
    with torch.random.fork_rng():
        for index in range(repeats + 1):
            module.zero_grad(set_to_none=True)
            start = time.perf_counter()
            step()
            if index:
                samples.append(time.perf_counter() - start)
    module.zero_grad(set_to_none=True)
    return statistics.median(samples)
