"""From a model file to a profiled FB-graph: capture, measure, name."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.utils._pytree as pytree

from remat_dsl.plan import ir
from remat_dsl.capture.fx import capture
from remat_dsl.capture.fbgraph import build_graph
from remat_dsl.capture.model_file import ModelFile
from remat_dsl.capture.profile import is_call, profile_step


@dataclass(frozen=True)
class Captured:
    """The profiled FB-graph of a model file and the device it was measured on."""

    graph: ir.Graph
    device: str


def device_of(inputs: tuple, model: torch.nn.Module) -> str:
    """The device of the model's first parameter (or first input): `cpu`, `cuda:0` ..."""
    for tensor in (*model.parameters(), *pytree.tree_leaves(inputs)):
        if isinstance(tensor, torch.Tensor):
            return str(tensor.device)
    return "cpu"


def capture_graph(model_file: ModelFile, repeats: int = 5, progress=None, measure_time: bool = True) -> Captured:
    """Build the model, capture its training step and measure every op.

    progress: optional object with `start(total)` and `advance(n)` (a rich progress bar).
    measure_time: False skips the timing loop: every op's time_us is 0 (sizes, aliasing
    and temporary memory are still measured), for plans made from a profile file.
    """
    model = model_file.build_model()
    inputs = tuple(model_file.sample_inputs())
    captured = capture(model, inputs)
    total = sum(1 for g in (captured.forward, captured.backward) for n in g.graph.nodes if is_call(n))
    if progress:
        progress.start(total)
    step = profile_step(captured, captured.example_primals, repeats, progress.advance if progress else None, measure_time)
    return Captured(build_graph(captured, step, inputs), device_of(inputs, model))
