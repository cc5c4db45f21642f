"""Which ops of a plan may write their output into an input's storage: one rule that
the simulator (remat_dsl.check.replay), the solvers and the code generator share.

NOTE: [In-place outputs]
An elementwise op whose output has the shape, dtype and bytes of one of its inputs, an
input that the plan deletes right after the op (in the deletes that follow it), can
write its output into that input's storage: `torch.ops.aten.mul.out(a, b, out=a)`, as
`a.mul_(b)` does.  Each element is computed by the same kernel from the same operands,
so the values are the eager op's bit for bit, and the op allocates nothing: the output
takes over the input's bytes.  On the 8-layer Llama decoder of
bench/models/llama_d512_bytes.py the first decoder layer's MLP backward holds the
gradient of its down projection, its gate, up and activation (5.375 MiB each) and
allocates a fifth for `grad * act`: in place, that product is written into the
activation, which dies there, and the backward's peak is one such tensor lower.
Only what is sure to be laid out as eager lays it out is written in place, so that the
values and the layout of everything computed from it stay eager's (a layout changes the
bits of `silu_backward` and of reductions): the input given up must be a contiguous
tensor, passed whole (or through `detach`) or through a `view`/`_unsafe_view`/`reshape`
to the output's shape, and every other input of that shape contiguous too (then eager's
output is contiguous); a tensor is known contiguous when a matrix product or embedding
made it, or an op of this kind from contiguous inputs.  Not given up: an input with a
transfer in flight (the copy still reads it), a tensor read through anything else (a
transpose, a slice), a gradient the caller passes (`_add_gradients` may hand back its
other operand itself), a random op's input.  The simulator (remat_dsl.check.replay)
decides it per instruction and records it (`Step.into`), the code generator reads it
there, the solvers' own models do not see it (NOTE: [Budget correction] in
remat_dsl.solve.driver).  The generated module checks the layouts when it runs and,
should one differ, computes the op as eager does and warns that the step then takes more
memory than the plan predicts.  The autograd peak that percentage budgets refer to is
simulated without it, as eager PyTorch runs.
"""

from __future__ import annotations

from remat_dsl.plan import ir
from remat_dsl.plan.ir import iter_refs

INPLACE_OUT = {  # op -> (the overload that writes into a given tensor, its keyword for it)
    "aten.mul.Tensor": ("aten.mul.out", "out"),
    "aten.add.Tensor": ("aten.add.out", "out"),
    "aten.sub.Tensor": ("aten.sub.out", "out"),
    "aten.div.Tensor": ("aten.div.out", "out"),
    "aten.neg.default": ("aten.neg.out", "out"),
    "aten.pow.Tensor_Scalar": ("aten.pow.Tensor_Scalar_out", "out"),
    "aten.rsqrt.default": ("aten.rsqrt.out", "out"),
    "aten.exp.default": ("aten.exp.out", "out"),
    "aten.tanh.default": ("aten.tanh.out", "out"),
    "aten.sigmoid.default": ("aten.sigmoid.out", "out"),
    "aten.relu.default": ("aten.relu.out", "out"),
    "aten.silu.default": ("aten.silu.out", "out"),
    "aten.gelu.default": ("aten.gelu.out", "out"),
    "aten.silu_backward.default": ("aten.silu_backward.grad_input", "grad_input"),
    "aten.gelu_backward.default": ("aten.gelu_backward.grad_input", "grad_input"),
    "aten.threshold_backward.default": ("aten.threshold_backward.grad_input", "grad_input"),
}
CONTIGUOUS_MAKERS = frozenset({"aten.mm.default", "aten.bmm.default", "aten.addmm.default", "aten.embedding.default"})
SHAPE_VIEWS = frozenset({"aten.view.default", "aten._unsafe_view.default", "aten.reshape.default"})
SAME_VIEWS = frozenset({"aten.detach.default", "aten.alias.default"})  # same shape and strides


def whole_tensor(arg: ir.Arg, tensors: dict) -> tuple[str, tuple[int, ...]] | None:
    """(name, shape it is read with) when `arg` reads a whole tensor of the graph as it is
    (or through detach/alias) or through a view/_unsafe_view/reshape to a literal shape
    (NOTE: [In-place outputs]), else None."""
    if isinstance(arg, ir.Ref):
        decl = tensors.get(arg.name)
        return None if decl is None else (arg.name, tuple(decl.shape))
    if isinstance(arg, ir.Call) and arg.target in SAME_VIEWS and len(arg.args) == 1 and not arg.kwargs:
        return whole_tensor(arg.args[0], tensors)
    if not (isinstance(arg, ir.Call) and arg.target in SHAPE_VIEWS and len(arg.args) == 2 and not arg.kwargs):
        return None
    inner, shape = arg.args
    if not (isinstance(inner, ir.Ref) and inner.name in tensors and isinstance(shape, ir.ListArg)):
        return None
    dims = tuple(d for d in shape.items if isinstance(d, int) and not isinstance(d, bool))
    if len(dims) != len(shape.items) or sum(d == -1 for d in dims) > 1:  # a dim that is not a literal int
        return None
    numel = 1
    for d in tensors[inner.name].shape:
        numel *= d
    known = 1
    for d in dims:
        known *= d if d != -1 else 1
    if -1 in dims and known:
        dims = tuple(numel // known if d == -1 else d for d in dims)
    return inner.name, tuple(dims)


def inplace_candidates(graph: ir.Graph) -> dict[str, tuple[str, ...]]:
    """Op -> the input tensors it may write its output into (NOTE: [In-place outputs]),
    for the ops that have any."""
    tensors = graph.tensor_by_name
    values = {v.name: v for v in (*graph.inputs, *graph.parameters, *graph.buffers)}
    contiguous: set[str] = set()
    found: dict[str, tuple[str, ...]] = {}
    for op in graph.ops:  # graph order: every producer before its readers
        if len(op.outputs) != 1 or op.random:
            continue
        out = tensors[op.outputs[0]]
        if op.target in CONTIGUOUS_MAKERS:
            contiguous.add(out.name)
        elif op.target in INPLACE_OUT:
            whole = _contiguous_inputs(op, out, tensors, values, contiguous)
            if whole is None:
                continue
            contiguous.add(out.name)
            donors = tuple(n for n in whole if tensors[n].dtype == out.dtype and tensors[n].nbytes == out.nbytes)
            if donors:
                found[op.name] = donors
    return found


def _contiguous_inputs(
    op: ir.Op, out: ir.TensorDecl, tensors: dict, values: dict, contiguous: set[str]
) -> tuple[str, ...] | None:
    """The tensors `op` reads whole with its output's shape, when every tensor it reads is
    known contiguous and every parameter, buffer or input it reads is broadcast (of
    another shape, read as it is); else None: eager's output may be laid out otherwise."""
    whole: list[str] = []
    for arg in (*op.args, *(v for _, v in op.kwargs)):
        if not any(True for _ in iter_refs(arg)):
            continue  # a number, a list of numbers
        read = whole_tensor(arg, tensors)
        if read is not None:
            name, shape = read
            if name not in contiguous:
                return None
            if shape == tuple(out.shape) and name not in whole:
                whole.append(name)
        elif not (isinstance(arg, ir.Ref) and arg.name in values and tuple(values[arg.name].shape) != tuple(out.shape)):
            return None  # a tangent, a transposed or sliced view, a full-size parameter
    return tuple(whole)
