"""Synthetic FB-graphs of any size for solver tests and benchmarks (no model behind them:
they are planned and simulated, never run).

`layered_fb_graph(ops, width, seed)`: a layered random DAG as a training step.  The
forward has layers of `width` ops; each op adds two random outputs of the layer before
(the first layer reads the input).  The loss is the sum of the last layer.  The backward
has one op per forward op, in reverse: it reads the backward outputs of the forward op's
readers (its gradient) and the forward op's own inputs (what a product's backward saves),
so every forward activation is a saved tensor, as in a real network.
"""

from __future__ import annotations

import random

from remat_dsl.plan import ir


def layered_fb_graph(ops: int, width: int = 4, seed: int = 0, nbytes: int = 4096, time_us: int = 10) -> ir.Graph:
    """An FB-graph of about `ops` ops (half forward, half backward).  Deterministic."""
    rng = random.Random(seed)
    forward_count = max(width + 1, ops // 2)
    layers = [list(range(i, min(i + width, forward_count - 1))) for i in range(0, forward_count - 1, width)]
    shape = (nbytes // 4,)
    tensors: list[ir.TensorDecl] = []
    forward: list[ir.Op] = []
    reads: dict[int, list[str]] = {}
    readers: dict[int, list[int]] = {}
    name = lambda v: f"layer{v // width}.op{v % width}"  # noqa: E731
    for depth, layer in enumerate(layers):
        for v in layer:
            if depth == 0:
                args = ["x", "x"]
            else:
                a, b = rng.sample(layers[depth - 1], 2) if len(layers[depth - 1]) > 1 else layers[depth - 1] * 2
                args = [name(a), name(b)]
                readers.setdefault(a, []).append(v)
                readers.setdefault(b, []).append(v)
            reads[v] = args
            forward.append(
                ir.Op(name(v), ir.FORWARD, "aten.add.Tensor", tuple(ir.Ref(n) for n in args), (), (name(v),), time_us)
            )
            tensors.append(ir.TensorDecl(name(v), shape, "float32", nbytes, name(v)))
    last = layers[-1]
    loss_args = ir.ListArg(tuple(ir.Ref(name(v)) for v in last))
    forward.append(ir.Op("loss", ir.FORWARD, "aten.stack.default", (loss_args,), (), ("loss",), time_us))
    tensors.append(ir.TensorDecl("loss", (len(last),) + shape, "float32", nbytes * len(last), "loss"))
    backward: list[ir.Op] = []
    for v in reversed([v for layer in layers for v in layer]):
        grads = [ir.Ref(f"grad.{name(r)}") for r in readers.get(v, [])] or [ir.Ref("tangents_1")]
        saved = [ir.Ref(n) for n in reads[v] if n != "x"]
        out = f"grad.{name(v)}"
        args = (ir.ListArg(tuple(grads + saved)),)
        backward.append(ir.Op(out, ir.BACKWARD, "aten.stack.default", args, (), (out,), time_us))
        tensors.append(
            ir.TensorDecl(out, (len(grads) + len(saved),) + shape, "float32", nbytes * (len(grads) + len(saved)), out)
        )
    first = [ir.Ref(f"grad.{name(v)}") for v in layers[0]]
    backward.append(
        ir.Op("grad.x", ir.BACKWARD, "aten.stack.default", (ir.ListArg(tuple(first)),), (), ("grad.x",), time_us)
    )
    tensors.append(ir.TensorDecl("grad.x", (len(first),) + shape, "float32", nbytes * len(first), "grad.x"))
    return ir.Graph(
        inputs=(ir.ValueDecl("input", "x", shape, "float32"),),
        parameters=(),
        buffers=(),
        tangents=(ir.ValueDecl("tangent", "tangents_1", (len(last),) + shape, "float32"),),
        tensors=tuple(tensors),
        ops=tuple(forward + backward),
        outputs=ir.Ref("loss"),
        gradients=(),
    )
