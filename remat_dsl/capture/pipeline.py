"""From a model file to a profiled FB-graph: capture, measure, name."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.utils._pytree as pytree

from remat_dsl.plan import ir
from remat_dsl.capture.fx import capture
from remat_dsl.capture.fbgraph import build_graph
from remat_dsl.capture.model_file import Inputs, ModelFile
from remat_dsl.capture.profile import is_call, profile_step


@dataclass(frozen=True)
class Captured:
    """The profiled FB-graph of a model file and the device it was measured on."""

    graph: ir.Graph
    device: str


def device_of(inputs, model: torch.nn.Module) -> str:
    """The device kind of the model's first parameter (or first input): `cpu`, `cuda`.
    A plan names the kind, not an index: it runs on any device of that kind."""
    leaves = inputs.leaves() if isinstance(inputs, Inputs) else inputs
    for tensor in (*model.parameters(), *pytree.tree_leaves(leaves)):
        if isinstance(tensor, torch.Tensor):
            return tensor.device.type
    return "cpu"


def capture_graph(model_file: ModelFile, repeats: int = 5, progress=None, measure_time: bool = True) -> Captured:
    """Build the model, capture its training step and measure every op.

    progress: optional object with `start(total)` and `advance(n)` (a rich progress bar).
    measure_time: False skips the timing loop: every op's time_us is 0 (sizes, aliasing
    and temporary memory are still measured), for plans made from a profile file.
    """
    model = model_file.build_model()
    inputs = model_file.sample_inputs()
    captured = capture(model, inputs)
    total = sum(1 for g in (captured.forward, captured.backward) for n in g.graph.nodes if is_call(n))
    if progress:
        progress.start(total)
    step = profile_step(captured, captured.example_primals, repeats, progress.advance if progress else None, measure_time)
    return Captured(build_graph(captured, step, inputs), device_of(inputs, model))


def check_plan_matches(plan, model_file: ModelFile) -> None:
    """Raise PlanError at the first line of `plan`'s graph sections that the model file
    contradicts: its inputs and parameters first (another model, other shapes), then
    every item of a fresh capture of its graph (op times and temporaries aside)."""
    import torch

    from remat_dsl.capture.fx import named_inputs
    from remat_dsl.plan.errors import PlanError

    model = model_file.build_model()
    inputs = {name: t for name, t in named_inputs(model, model_file.sample_inputs()) if isinstance(t, torch.Tensor)}
    hint = f"plan again for this model: remat plan {model_file.spec} --budget ..."
    if sorted(inputs) != sorted(d.name for d in plan.graph.inputs):
        first = plan.graph.inputs[0].span if plan.graph.inputs else None
        theirs = ", ".join(inputs) or "none"
        raise PlanError(f"the plan takes the inputs {', '.join(d.name for d in plan.graph.inputs)} but {model_file.spec} gives {theirs}", span=first, hint=hint)
    for decl in plan.graph.inputs:
        _check_value(decl, inputs[decl.name], "input", model_file.spec, hint)
    params = dict(model.named_parameters())
    for decl in plan.graph.parameters:
        if decl.name not in params:
            raise PlanError(f"the plan is for another model: {model_file.spec} has no parameter '{decl.name}'", span=decl.span, hint=hint, length=len(decl.name))
        _check_value(decl, params[decl.name], "parameter", model_file.spec, hint)
    _check_graph(plan, model_file, hint)


def _check_graph(plan, model_file: ModelFile, hint: str) -> None:
    from remat_dsl.plan import digest
    from remat_dsl.plan.errors import PlanError
    from remat_dsl.plan.ir import Span

    captured = capture_graph(model_file, measure_time=False).graph
    outputs = plan.section_span("outputs")
    ours = digest.items(plan.graph, outputs and Span(outputs.line + 1, 3), costs=False)
    theirs = digest.items(captured, costs=False)
    for index, item in enumerate(ours):
        if index >= len(theirs) or (theirs[index].section, theirs[index].text) != (item.section, item.text):
            got = theirs[index].text if index < len(theirs) else "nothing"
            raise PlanError(
                f"the model captured now differs here: {model_file.spec} gives `{got}`",
                span=item.span or plan.section_span(item.section), hint=hint,
            )
    if len(theirs) > len(ours):
        raise PlanError(f"the model captured now has {len(theirs) - len(ours)} more graph line(s) than the plan", span=plan.section_span("forward"), hint=hint)


def _check_value(decl, tensor, what: str, spec: str, hint: str) -> None:
    from remat_dsl.plan.errors import PlanError

    actual = f"{str(tensor.dtype).removeprefix('torch.')}{list(tensor.shape)}"
    expected = f"{decl.dtype}{list(decl.shape)}"
    if actual != expected:
        raise PlanError(
            f"the plan was made for {what} '{decl.name}' {expected}, but {spec} gives {actual}",
            span=decl.span, hint=hint, length=len(decl.name),
        )
