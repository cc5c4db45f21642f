"""Layers that keep state in buffers and update it in the forward: capture's side of
NOTE: [Stateful layers]."""

from __future__ import annotations

import contextlib
from typing import Any, Callable

import torch
import torch.fx as fx
from torch.nn.modules.batchnorm import _BatchNorm

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
# A batch norm with `momentum=None` keeps a cumulative average (NOTE: [Cumulative averages]).

# NOTE: [Cumulative averages]
# `_BatchNorm.forward` with `momentum=None` and `track_running_stats` counts the step
# (`num_batches_tracked.add_(1)`) and passes `1.0 / float(num_batches_tracked)` to the
# kernel as its momentum: a Python float read from a tensor, which dynamo (and so
# `torch.compile` itself) refuses as data-dependent.  While capturing, each such module gets
# a momentum of its own that no model sets (`sentinel_momentum`: negative), so dynamo traces
# it as a constant (`cumulative_averages`); every trace of the model runs through `capture`
# (the size probe's too), so all see the same constants.  Afterwards each forward op that
# takes a sentinel as an argument takes the step's factor instead (`cumulative_factors`):
# right before it, `_to_copy(count, dtype=torch.float64)` then `reciprocal` of the count
# that module's latest `add` made (the value of `num_batches_tracked` after `add_(1)`; a
# module applied twice counts twice), ordinary ops of the plan named after the module.
# `float(n)` of an int64 count below 2**53 is exact, and `1.0 / x` in Python and the
# reciprocal of a float64 tensor are both IEEE division, correctly rounded: the same
# double.  The op reads it as `aten._local_scalar_dense.default(%bn.reciprocal)`, a number
# read from a one-element tensor inside its arguments (NOTE: [Scalar reads] in
# remat_dsl/plan/operators.py; `Captured.averages` says where, remat_dsl/capture/fbgraph.py writes
# it).  The FX graph keeps the sentinel in the op itself, so that the profile runs it on
# fake tensors too (a fake tensor has no number to read): the op's time does not depend on
# the momentum, and the running statistics it makes there are neither model outputs nor
# gradients, which NOTE: [Eager agreement] compares.
# A recompute of the op reads the same factor tensor, computed from the step's count:
# the count's `add` reads the buffer, so it runs once, before the update (`buffer_readers`
# in remat_dsl/plan/ir.py), and the factor is kept or recomputed from it.
# InstanceNorm with `momentum=None` passes 0.0 (its running statistics never change) and
# needs none of this.

SPECTRAL_HOOKS = ("SpectralNorm", "WeightNorm")


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


HINT = "give the norm a momentum (momentum=0.1 is PyTorch's default), or set track_running_stats=False"

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


def sentinel_momentum(k: int) -> float:
    """NOTE: [Cumulative averages]: the momentum the k-th cumulative-average batch norm gets
    while capturing: negative (no model sets one), exact, distinct for every k."""
    return -1048576.0 - k


@contextlib.contextmanager
def cumulative_averages(model: torch.nn.Module):
    """NOTE: [Cumulative averages]: while capturing, each training batch norm of `model` with
    `momentum=None` and a `num_batches_tracked` count gets its own sentinel momentum;
    yields {sentinel: (module path, module)}.  Their momentum is None again afterwards, also
    on an error."""
    sentinels: dict[float, tuple[str, _BatchNorm]] = {}
    for name, module in model.named_modules():
        if (
            isinstance(module, _BatchNorm)
            and module.momentum is None
            and module.training
            and module.track_running_stats
            and isinstance(getattr(module, "num_batches_tracked", None), torch.Tensor)
        ):
            sentinels[sentinel_momentum(len(sentinels))] = (name, module)
    try:
        for value, (_, module) in sentinels.items():
            module.momentum = value
        yield sentinels
    finally:
        for _, module in sentinels.values():
            module.momentum = None


def cumulative_factors(
    forward: fx.GraphModule,
    backward: fx.GraphModule,
    example_inputs,
    sentinels: dict[float, tuple[str, _BatchNorm]],
) -> dict[str, tuple[int, str]]:
    """NOTE: [Cumulative averages]: before each op of `forward` that takes one of `sentinels`
    as a positional argument, insert the factor `reciprocal(_to_copy(count, dtype=float64))`
    of its module's count, in place; returns {op node name: (argument position, factor node
    name)}.  `example_inputs`: the forward's placeholders' tensors (a module's count is found
    among them by identity).  Raises RematError where a sentinel reaches an op otherwise (a
    keyword argument, an op of the backward) or an op runs before its module counted."""
    if not sentinels:
        return {}
    placeholders = [n for n in forward.graph.nodes if n.op == "placeholder"]
    counts = {id(t): placeholders[k] for k, t in enumerate(example_inputs) if isinstance(t, torch.Tensor)}
    order = {node: k for k, node in enumerate(forward.graph.nodes)}
    found: dict[str, tuple[int, str]] = {}
    for node in list(forward.graph.nodes):
        if node.op != "call_function":
            continue
        for position, value in enumerate(node.args):
            norm = _sentinel_module(value, sentinels)
            if norm is None:
                continue
            name, module = norm
            count = _latest_count(counts.get(id(module.num_batches_tracked)), node, order)
            if count is None:
                raise RematError(
                    f"error: the batch norm '{name}' (momentum=None) runs `{node.target}` before it counts the step, "
                    "which remat-dsl cannot replay",
                    hint=HINT,
                )
            factor = _factor(forward, count, node)
            found[node.name] = (position, factor.name)
    for gm in (forward, backward):
        for node in gm.graph.nodes:
            if node.op != "call_function" or node.name in found:
                continue
            leaves = [*node.args, *node.kwargs.values()]
            norm = next((m for m in (_sentinel_module(v, sentinels) for v in leaves) if m is not None), None)
            if norm is not None:
                raise RematError(
                    f"error: the cumulative average of the batch norm '{norm[0]}' (momentum=None) reaches "
                    f"`{node.target}` in a way remat-dsl cannot replay",
                    hint=HINT,
                )
    forward.graph.lint()
    forward.recompile()
    return found


def _sentinel_module(value, sentinels: dict[float, tuple[str, _BatchNorm]]) -> tuple[str, _BatchNorm] | None:
    return sentinels.get(value) if type(value) is float else None


def _latest_count(placeholder: fx.Node | None, before: fx.Node, order: dict[fx.Node, int]) -> fx.Node | None:
    """The last value of the count chain `placeholder`, `add(placeholder, 1)`, `add(that, 1)`,
    ... that the graph makes before `before`; None when it makes none (or no placeholder)."""
    if placeholder is None:
        return None
    latest = None
    current = placeholder
    while True:
        nexts = [
            user
            for user in current.users
            if user.target is torch.ops.aten.add.Tensor
            and user.args[:2] == (current, 1)
            and order[user] < order[before]
        ]
        if not nexts:
            return latest
        current = latest = min(nexts, key=order.__getitem__)


_KEPT_META = ("nn_module_stack", "fwd_nn_module_stack", "stack_trace")  # what names an op after its module


def _factor(forward: fx.GraphModule, count: fx.Node, op: fx.Node) -> fx.Node:
    """`reciprocal(_to_copy(count, dtype=torch.float64))`, inserted right before `op`, with
    `op`'s module stacks (the plan names them after its module)."""
    from torch._guards import detect_fake_mode

    aten = torch.ops.aten
    value = count.meta.get("val")
    mode = detect_fake_mode([value]) if isinstance(value, torch.Tensor) else None

    def call(target, args, kwargs):
        with forward.graph.inserting_before(op):
            made = forward.graph.call_function(target, args, kwargs)
        made.meta.update({k: v for k, v in op.meta.items() if k in _KEPT_META})
        if mode is not None:
            with mode:
                made.meta["val"] = target(*[a.meta["val"] if isinstance(a, fx.Node) else a for a in args], **kwargs)
        return made

    as_double = call(aten._to_copy.default, (count,), {"dtype": torch.float64})
    return call(aten.reciprocal.default, (as_double,), {})
