"""What the cache keys of a capture are made of (NOTE: [Profile key], NOTE: [Capture key]
in remat_dsl.capture.pipeline): FX nodes, tensors and their layouts as canonical tuples
whose repr does not change from one run to the next."""

from __future__ import annotations

import hashlib
import re

import torch

_ADDRESS = re.compile(r" at 0x[0-9a-fA-F]+")


class NotStatic(Exception):
    """A value whose shape is not known without running the graph."""


def target_name(target) -> str:
    """An FX node's target as a stable name: its str (`aten.mm.default`, `<built-in
    function linear>`), or `module.qualname` for a Python function, whose str holds its
    address (`torch.nn.functional.silu`)."""
    text = target if isinstance(target, str) else str(target)
    if not _ADDRESS.search(text):
        return text
    qualname = getattr(target, "__qualname__", None)
    if qualname:
        return f"{getattr(target, '__module__', None) or ''}.{qualname}"
    return _ADDRESS.sub("", text)


def node_key(node, value: str = "val") -> tuple:
    """One FX node: op, name, target, arguments, the module stacks plan names come from,
    and the layout of its value (`node.meta[value]`: `val` in AOT graphs, `example_value`
    in dynamo's).  Raises NotStatic."""
    stacks = tuple(
        tuple(str(v[0]) for v in (node.meta.get(name) or {}).values())
        for name in ("nn_module_stack", "fwd_nn_module_stack")
    )
    return (
        node.op,
        node.name,
        target_name(node.target),
        _ADDRESS.sub("", repr(node.args)),
        _ADDRESS.sub("", repr(node.kwargs)),
        stacks,
        value_key(node.meta.get(value)),
    )


def value_key(value):
    """Shape, strides, dtype, device and storage offset of a tensor (of each, in a tuple or
    list).  Raises NotStatic for a size that is not a number."""
    if isinstance(value, torch.Tensor):
        sizes = (*value.shape, *value.stride(), value.storage_offset())
        if not all(type(n) is int for n in sizes):
            raise NotStatic
        return (tuple(value.shape), value.stride(), str(value.dtype), value.device.type, value.storage_offset())
    if isinstance(value, (tuple, list)):
        return tuple(value_key(v) for v in value)
    if value is None or type(value) in (bool, int, float):
        return value
    raise NotStatic  # a SymInt, or something else a run would have to tell


def primal_key(t: torch.Tensor, shared: int, values: bool = False) -> tuple:
    """What a profile depends on of one example primal (NOTE: [Profile key]): its layout,
    whether it requires a gradient, `shared` (the index of the first primal holding its
    storage), and the SHA-256 of its bytes when it holds integers or bools (or always,
    with `values`)."""
    digest = None
    if values or not (t.is_floating_point() or t.is_complex()):
        data = t.detach().cpu().contiguous().view(-1).view(torch.uint8).numpy()
        # ndarray has the buffer protocol; numpy's stubs declare it for Python >= 3.12 only
        digest = hashlib.sha256(data).hexdigest()  # type: ignore[arg-type]
    return (value_key(t), t.requires_grad, shared, digest)


def primal_keys(tensors) -> tuple:
    """`primal_key` of each tensor, with the index of the first one sharing its storage."""
    first: dict[int, int] = {}  # storage -> the first primal holding it
    return tuple(primal_key(t, first.setdefault(t.untyped_storage()._cdata, i)) for i, t in enumerate(tensors))
