"""What the plan language assumes of aten operators.

A call written inside another operation's arguments (`aten.t.default(%w)`) allocates
nothing: it is a view of its arguments, inlined by code generation where it is used
(remat_dsl.plan.ir, `Call`).  An operator is a view when its schema says every output
aliases an input without writing it, or when it is one of VIEW_EXTRA, whose schemas do
not say so though they return their input's storage.  The constants an argument may name
(`torch.float32`, `torch.strided`, `torch.contiguous_format`) are `torch_constants()`.

NOTE: [Scalar reads]
One more call allocates nothing and may stand inside an operation's arguments: SCALAR_READ,
`aten._local_scalar_dense.default(%t)`, the Python number a one-element tensor holds (what
`.item()` and `float(t)` call).  A batch norm with `momentum=None` takes its momentum so,
from a tensor the plan computes (NOTE: [Cumulative averages] in
remat_dsl/capture/stateful.py).  It reads the tensor's value when the op runs, so the
tensor must be resident there (the replay's rule for every `%` reference), and on a GPU it
waits for the value, as eager's `float(t)` does.  The verifier takes it only as a whole
argument of an operation, where the operator's schema takes a number (float, int or
Scalar), of a `%` reference to a one-element tensor an op makes (`check_operators` in
remat_dsl/check/verify.py): never inside a view, a list or the model's outputs.
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

SCALAR_READ = "aten._local_scalar_dense.default"  # NOTE: [Scalar reads]

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
