"""Layers that keep state in buffers and update it in the forward: capture's side of
NOTE: [Stateful layers]."""

from __future__ import annotations

import contextlib
from typing import Any, Callable

import torch
import torch.fx as fx

from remat_dsl.plan.errors import RematError

# NOTE: [Stateful layers]
# A layer that updates its buffers in place in the forward becomes a buffer update of the
# plan: AOTAutograd functionalizes the update, the forward graph returns the buffer's new
# value ahead of the model's outputs (`Captured.mutated`), and the generated module copies
# it into the buffer once, right after the forward op that computes it, never at a
# recompute (NOTE in remat_dsl/codegen/generate.py, `_compute`).  Three ways stock layers
# write such updates need help to reach that form:
# - `torch.nn.utils.parametrizations.spectral_norm` runs its power iteration as
#   `self._u = F.normalize(..., out=self._u)`: an update in place, and an attribute
#   assignment of the result, which is the buffer itself.  Dynamo's graph returns the
#   result for the assignment, so it looks like a tensor the forward keeps outside its
#   output.  Capture takes such outputs (an output that is a graph input itself) out of
#   dynamo's graph and hands the caller the input in their place
#   (`drop_inputs_returned`); the update in place stays in the graph.
# - The older `torch.nn.utils.spectral_norm` (and `weight_norm`) hook sets a plain
#   attribute (`module.weight`) to the weight it computes, before every forward, from
#   `weight_orig` and the buffers.  Capture restores the attribute after the module's
#   forward (`recomputed_weights`), so dynamo's graph does not return it; the hook
#   computes it again before every forward, so a plan that does not set it trains alike.
# - `InstanceNorm` with `track_running_stats` runs batch norm on the running statistics
#   repeated per sample and writes their mean back with `copy_`: AOTAutograd returns the
#   new value as `alias(copy(alias(buffer), mean))`.  Where the copy takes the value as it
#   is (same shape and dtype), the update is the value itself (`plain_updates`).
# Since the buffer holds its new value from that op on, an op that reads the buffer runs
# once, before it: the lowering never drops its output to recompute it, and the replay
# refuses a plan that runs it after the update (`buffer_readers` in remat_dsl/plan/ir.py).
# Batch norm in training mode is exempt: its output reads the batch's statistics.
# A norm with `momentum=None` keeps a cumulative average: each step it reads
# `num_batches_tracked` into a Python float (`1 / n`), which neither dynamo nor
# `torch.compile` itself can trace; the capture's error names such norms
# (`cumulative_norm_error`) beside PyTorch's reason.

SPECTRAL_HOOKS = ("SpectralNorm", "WeightNorm")


def cumulative_norm_error(model: torch.nn.Module, error: RematError) -> RematError | None:
    """NOTE: [Stateful layers]: `error` (a refused capture) with the norms of `model` that keep
    a cumulative average (`momentum=None`) named, where it says a value was read from a
    tensor; else None."""
    norms = [
        name
        for name, m in model.named_modules()
        if isinstance(m, torch.nn.modules.batchnorm._NormBase)
        and m.momentum is None
        and m.track_running_stats
        and m.training
    ]
    if not norms or "data-dependent" not in error.message:
        return None
    listed = ", ".join(f"'{n}'" for n in norms[:5]) + (f" and {len(norms) - 5} more" if len(norms) > 5 else "")
    return RematError(
        f"{error.message} (the model's {listed} ha{'s' if len(norms) == 1 else 've'} momentum=None: a cumulative "
        "average reads num_batches_tracked into a Python float each step, which torch.compile cannot trace either)",
        hint="give each a momentum (momentum=0.1 is PyTorch's default), or set track_running_stats=False",
    )


def drop_inputs_returned(gm: fx.GraphModule) -> Callable[[tuple, tuple], tuple]:
    """NOTE: [Stateful layers]: take out of dynamo's graph `gm` the outputs that are one of
    its inputs itself (an `out=` into a buffer), in place; returns `restore(args, returned)`:
    the outputs as the graph returned them before, from the ones it returns now and its
    arguments."""
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    index = {id(n.meta.get("example_value")): k for k, n in enumerate(placeholders) if "example_value" in n.meta}
    output = gm.graph.output_node()
    returned: Any = output.args[0]  # dynamo's graph returns a tuple or list of values
    values = list(returned)
    dropped = {}
    for position, node in enumerate(values):
        value = node.meta.get("example_value") if isinstance(node, fx.Node) else None
        if isinstance(value, torch.Tensor) and id(value) in index:
            dropped[position] = index[id(value)]
    if not dropped:
        return lambda args, returned: returned
    output.args = (type(returned)(v for k, v in enumerate(values) if k not in dropped),)
    gm.graph.lint()
    gm.recompile()

    def restore(args, returned):
        kept = iter(returned)
        return type(returned)(args[dropped[k]] if k in dropped else next(kept) for k in range(len(values)))

    return restore


@contextlib.contextmanager
def recomputed_weights(model: torch.nn.Module):
    """NOTE: [Stateful layers]: while capturing, each module with a `spectral_norm` or
    `weight_norm` hook of `torch.nn.utils` gets the attribute the hook sets back after its
    forward."""
    wrapped = []
    for module in model.modules():
        hooks: list[Any] = [h for h in module._forward_pre_hooks.values() if type(h).__name__ in SPECTRAL_HOOKS]
        names = [h.name for h in hooks]
        names = [n for n in names if isinstance(getattr(module, n, None), torch.Tensor)]
        if names and "forward" not in module.__dict__:
            module.forward = _restoring(module, module.forward, {n: getattr(module, n) for n in names})
            wrapped.append(module)
    try:
        yield
    finally:
        for module in wrapped:
            del module.forward


def _restoring(module: torch.nn.Module, forward, before: dict[str, torch.Tensor]):
    def run(*args, **kwargs):
        try:
            return forward(*args, **kwargs)
        finally:
            for name, value in before.items():
                setattr(module, name, value)

    return run


def plain_updates(forward: fx.GraphModule, first: int) -> None:
    """NOTE: [Stateful layers]: each of the forward graph's `first` buffer updates that is
    `alias(copy(alias(buffer), value))`, with `value` of the buffer's shape and dtype,
    becomes `value`, in place."""
    output = forward.graph.output_node()
    returned: Any = output.args[0]  # the graph's outputs: a tuple or list of values
    values = list(returned)
    for k in range(first):
        value = _copied_value(values[k])
        if value is not None:
            values[k] = value
    if values == list(returned):
        return
    output.args = (type(returned)(values),)
    for node in reversed(list(forward.graph.nodes)):
        if node.op == "call_function" and not node.users and node.target in _ALIAS_OR_COPY:
            forward.graph.erase_node(node)
    forward.graph.lint()
    forward.recompile()


_ALIAS_OR_COPY = (torch.ops.aten.alias.default, torch.ops.aten.copy.default)


def _copied_value(node) -> fx.Node | None:
    """`value` where `node` is `alias(copy(alias(placeholder), value))` and the copy changes
    neither its shape nor its dtype; else None."""
    if not (isinstance(node, fx.Node) and node.target is torch.ops.aten.alias.default):
        return None
    copy = node.args[0]
    if not (isinstance(copy, fx.Node) and copy.target is torch.ops.aten.copy.default):
        return None
    target, value = copy.args[0], copy.args[1]
    if not (isinstance(target, fx.Node) and target.target is torch.ops.aten.alias.default):
        return None
    source = target.args[0]
    if not (isinstance(value, fx.Node) and isinstance(source, fx.Node) and source.op == "placeholder"):
        return None
    old, new = target.meta.get("val"), value.meta.get("val")
    if not (isinstance(old, torch.Tensor) and isinstance(new, torch.Tensor)):
        return None
    return value if (old.shape, old.dtype) == (new.shape, new.dtype) else None
