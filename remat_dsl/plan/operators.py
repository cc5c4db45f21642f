"""What the plan language assumes of aten operators.

A call written inside another operation's arguments (`aten.t.default(%w)`) allocates
nothing: it is a view of its arguments, inlined by code generation where it is used
(remat_dsl.plan.ir, `Call`).  An operator is a view when its schema says every output
aliases an input without writing it, or when it is one of VIEW_EXTRA, whose schemas do
not say so though they return their input's storage.  The constants an argument may name
(`torch.float32`, `torch.strided`, `torch.contiguous_format`) are `torch_constants()`.
"""

from __future__ import annotations

import functools

# Views whose schemas do not say so: they return their input's storage (the `unsafe_`
# splits are what AOTAutograd makes of an LSTMCell's gates, `chunk` on a sum).
VIEW_EXTRA = frozenset(
    {
        "aten._unsafe_view.default",
        "aten.alias.default",
        "aten.detach.default",
        "aten.unsafe_chunk.default",
        "aten.unsafe_split.Tensor",
        "aten.unsafe_split_with_sizes.default",
    }
)

# NOTE: [oneDNN workspace]
# `aten.mkldnn_rnn_layer` (eager's LSTM layer on CPU, NOTE: [Recurrent layers] in
# remat_dsl/capture/recurrent.py) makes the workspace its backward reads only while grad
# mode is on: eager runs it inside autograd.  Run with grad mode off, as the profile and the
# generated module run a captured op, it returns None there, and
# `aten.mkldnn_rnn_layer_backward` fails on it.  So these ops run with grad mode on, on
# detached arguments, so that no autograd graph is recorded: `call_op` in
# remat_dsl/capture/recurrent.py, and the generated module's own binding of them
# (templates/module.py.jinja).
GRAD_MODE_OPS = frozenset({"aten.mkldnn_rnn_layer.default"})


def is_view(overload) -> bool:
    """Whether the torch OpOverload `overload` returns views of its inputs only."""
    if str(overload) in VIEW_EXTRA:
        return True
    returns = overload._schema.returns
    return bool(returns) and all(r.alias_info is not None and not r.alias_info.is_write for r in returns)


@functools.cache
def torch_constants() -> frozenset[str]:
    """`torch.NAME` of every dtype, layout and memory format torch defines: the symbols a
    plan's arguments may name (remat_dsl.capture.fbgraph writes no others)."""
    import torch

    kinds = (torch.dtype, torch.layout, torch.memory_format)
    return frozenset(
        f"torch.{name}" for name, value in vars(torch).items() if isinstance(value, kinds) and name.isidentifier()
    )
