"""Which input sizes a plan may take smaller than its sample inputs' (`remat plan --dynamic batch`).

NOTE: [Batch probe]
A plan made with `--dynamic batch` serves every batch size from 1 to the sample inputs'
(NOTE: [Sizes that vary] in remat_dsl/plan/ir.py).  That holds when the step's ops do the
same thing at every batch size: the same aten op with the same arguments, only on tensors
whose first dim is smaller.  So the step is traced twice more, at the sample batch B and
at B - 1 (every tensor input cut to its first B - 1 rows), and the two traces compared op
by op, forward and backward: every op's target and non-tensor arguments must be the same.
An op whose arguments name the batch size (`view(x, [16, 32])`, `expand`, `new_zeros`)
pins it: the plan is then made for the sample batch alone, with a `#` comment on its
inputs and a line on stderr naming that op and the model line that called it.  Each input
then declares the symbol `B` on its first dim, and each tangent on the dims that change
with the batch; a tangent whose size changes other than one for one with the batch (a
flattened output) pins the batch too.  The plan's costs, sizes and peak stay the largest
batch's: every tensor of a smaller batch is as large or smaller, so the peak holds below.
Two traces do not see Python code that branches on one particular batch size other than
B and B - 1 (`if x.shape[0] == 1`): such a model must be planned with static shapes.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass

import torch
import torch.fx as fx

from remat_dsl.capture.model_file import Inputs, ModelFile
from remat_dsl.plan import ir
from remat_dsl.plan.errors import RematError

BATCH = "B"  # the size symbol of the batch dim


@dataclass(frozen=True)
class Pinned:
    """Why the batch cannot vary: the op (`aten.view.default`), where the model calls it
    (`model.py:22`, or None) and its arguments at the two batch sizes."""

    target: str
    where: str | None
    largest: str
    smaller: str

    def reason(self, batch: int) -> str:
        """One line for stderr and the plan's comment."""
        at = f" ({self.where})" if self.where else ""
        if not self.largest:  # the trace at the smaller batch failed: `smaller` says why
            return f"the batch size cannot vary: at batch {batch - 1}, {self.smaller}"
        return (
            f"the batch size cannot vary: {self.target}{at} takes {self.largest} at batch {batch} and"
            f" {self.smaller} at batch {batch - 1}"
        )


@dataclass(frozen=True)
class BatchProbe:
    """The outcome of NOTE: [Batch probe]: `pinned` is None when the batch varies; then
    `dims` maps each input and tangent name to its size symbols (None: fixed)."""

    batch: int
    dims: dict[str, tuple[str | None, ...]]
    pinned: Pinned | None


def probe_batch(model_file: ModelFile, autocast=None) -> BatchProbe:
    """NOTE: [Batch probe] for `model_file`'s sample inputs.

    Raises RematError when the inputs have no common batch dim to vary (no tensor input, a
    scalar input, tensor inputs whose first dims differ, or a batch of 1)."""
    from remat_dsl.capture.fx import Captured, capture

    inputs = model_file.sample_inputs()
    batch = _batch_of(inputs, model_file)
    largest = capture(model_file.build_model(), inputs, None, autocast, copy_model=False)
    assert isinstance(largest, Captured)  # without `recall`, the whole step is traced
    try:
        smaller = capture(model_file.build_model(), _cut(inputs, batch - 1), None, autocast, copy_model=False)
        assert isinstance(smaller, Captured)
    except RematError as error:  # the model does not run at a smaller batch: PyTorch's reason
        reason = error.message.partition("error: ")[2] or error.message
        return BatchProbe(batch, {}, Pinned("the model", None, "", reason))
    for a, b in ((largest.forward, smaller.forward), (largest.backward, smaller.backward)):
        pinned = _first_difference(a, b)
        if pinned is not None:
            return BatchProbe(batch, {}, pinned)
    pairs = [
        (f"input '{name}'", name, big.shape, small.shape)
        for (kind, name), big, small in zip(largest.primal_names, largest.example_primals, smaller.example_primals)
        if kind == "input"
    ]
    pairs += [
        (f"the model's output '{name}'", name, big, small)
        for (name, big), (_, small) in zip(_tangents(largest), _tangents(smaller))
    ]
    dims = {}
    for what, name, big, small in pairs:
        varying = _varying(big, small, batch)
        if varying is None:  # a size that changes other than one for one with the batch
            return BatchProbe(batch, {}, Pinned(what, None, str(list(big)), str(list(small))))
        dims[name] = varying
    return BatchProbe(batch, dims, None)


def with_batch_symbol(graph: ir.Graph, probe: BatchProbe) -> ir.Graph:
    """`graph` whose inputs and tangents name the batch size symbol (NOTE: [Sizes that
    vary] in remat_dsl/plan/ir.py) as `probe` found them; `graph` itself when pinned."""
    if probe.pinned is not None:
        return graph

    def sized(decl: ir.ValueDecl) -> ir.ValueDecl:
        dims = probe.dims.get(decl.name)
        if dims is None or len(dims) != len(decl.shape) or not any(dims):
            return decl
        return dataclasses.replace(decl, dims=dims)

    return dataclasses.replace(
        graph, inputs=tuple(map(sized, graph.inputs)), tangents=tuple(map(sized, graph.tangents))
    )


def _batch_of(inputs: Inputs, model_file: ModelFile) -> int:
    tensors = [v for v in inputs.leaves() if isinstance(v, torch.Tensor)]
    sizes = {int(t.shape[0]) for t in tensors if t.dim() > 0}
    hint = "plan without --dynamic, or give sample_inputs() tensors that share their first (batch) dim"
    if not tensors or any(t.dim() == 0 for t in tensors) or len(sizes) != 1:
        shapes = ", ".join(str(list(t.shape)) for t in tensors) or "none"
        raise RematError(
            f"{model_file.path}: error: --dynamic batch needs tensor inputs that share their first dim, the batch;"
            f" sample_inputs() gives tensors of shapes {shapes}",
            hint=hint,
        )
    (batch,) = sizes
    if batch < 2:
        raise RematError(
            f"{model_file.path}: error: --dynamic batch needs a sample batch of 2 or more, the largest the plan"
            f" takes; sample_inputs() gives a batch of {batch}",
            hint="give sample_inputs() the largest batch the plan is for",
        )
    return batch


def _cut(inputs: Inputs, batch: int) -> Inputs:
    def cut(value):
        return value[:batch].clone() if isinstance(value, torch.Tensor) else value

    return Inputs(tuple(map(cut, inputs.args)), {k: cut(v) for k, v in inputs.kwargs.items()})


def _first_difference(largest: fx.GraphModule, smaller: fx.GraphModule) -> Pinned | None:
    """The first op of `largest` whose target or non-tensor arguments differ in `smaller`."""
    big = [n for n in largest.graph.nodes if n.op == "call_function"]
    small = [n for n in smaller.graph.nodes if n.op == "call_function"]
    for a, b in zip(big, small):
        if a.target != b.target or _arguments(a) != _arguments(b):
            return Pinned(str(a.target), _where(a), _arguments(a), _arguments(b))
    if len(big) != len(small):
        extra = big[len(small)] if len(big) > len(small) else small[len(big)]
        return Pinned(str(extra.target), _where(extra), f"{len(big)} ops", f"{len(small)} ops")
    return None


def _arguments(node: fx.Node) -> str:
    """`node`'s arguments with every tensor (an fx node) as `%`: its sizes and flags only."""
    return ", ".join([*map(_render, node.args), *(f"{k}={_render(v)}" for k, v in node.kwargs.items())])


def _render(value) -> str:
    if isinstance(value, fx.Node):
        return "%"
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(map(_render, value)) + "]"
    return repr(value)


def _where(node: fx.Node) -> str | None:
    """`file.py:LINE` of the model code that called `node`'s op, from its stack trace."""
    trace = node.meta.get("stack_trace") or ""
    frames = [line.strip() for line in trace.splitlines() if line.strip().startswith("File ")]
    if not frames:
        return None
    parts = frames[-1].split(", ")  # File "path", line N, in f
    if len(parts) < 2 or not parts[1].startswith("line "):
        return None
    path = parts[0].removeprefix("File ").strip('"')
    relative = os.path.relpath(path) if not os.path.relpath(path).startswith("..") else path
    return f"{relative}:{parts[1].removeprefix('line ')}"


def _tangents(captured) -> list[tuple[str, torch.Size]]:
    nodes = [n for n in captured.backward.graph.nodes if n.op == "placeholder" and n.name.startswith("tangents_")]
    return [(f"grad_output.{captured.tangent_of[i]}", n.meta["val"].shape) for i, n in enumerate(nodes)]


def _varying(big, small, batch: int) -> tuple[str | None, ...] | None:
    """BATCH on each dim that is `batch` in `big` and one less in `small`, None on the dims
    that are equal; None when another dim differs (the rank, or a size not one for one)."""
    if len(big) != len(small):
        return None
    dims: list[str | None] = []
    for a, b in zip(big, small):
        if a == b:
            dims.append(None)
        elif a == batch and b == batch - 1:
            dims.append(BATCH)
        else:
            return None
    return tuple(dims)
