"""Which input sizes a plan may take smaller than its sample inputs' (`remat plan --dynamic`).

NOTE: [Size probe]
A plan made with `--dynamic batch` (the batch B on dim 0 of the inputs), `--dynamic
batch,seq` (B on dim 0, the sequence S on dim 1) or `--dynamic S=0,B=1` (sequence-first
layouts) serves every size from 1 to the sample inputs' (NOTE: [Sizes that vary] in
remat_dsl/plan/ir.py).  That holds when the step's ops do the same thing at every size: the
same aten ops, on smaller tensors, with integer arguments that follow the sizes.  So the
step is traced again at the sample sizes and with each symbol one less (B-1; S-1; both),
every tensor input cut on the dims that declare them, and the traces compared op by op,
forward and backward (matched by position): the targets and every argument that is not an
integer must be equal.  Each integer argument (also inside lists) is fitted exactly from
those traces as k*B*S + a*B + b*S + c with integers k, a, b, c, and one more trace at a
clearly smaller size (B - 2, or 1 below 3; S//2 + 1) must give what the fitted expressions say; the
plan writes them as size expressions (NOTE: [Size expressions] in remat_dsl/plan/ir.py).
An op whose arguments differ otherwise (a float computed from a size, another op, an
integer no such expression gives, a trace that fails) pins the sizes it depends on: the
probe starts again without them, and the plan is made with those sizes fixed, with a `#`
comment on its inputs and a line on stderr naming the op and the model line that called
it.  Each input declares its symbols on their dims, each tangent names them on the dims
that follow them one for one; a tangent dim that follows them otherwise pins them too.
The plan's costs, sizes and peak stay the sample sizes': every tensor at smaller sizes is
as large or smaller (the expressions are sizes and offsets of views of such tensors), so
the peak holds below.  The traces see Python code that branches on a size only at the
sizes they run (B, B - 1, B - 2; S, S - 1, S//2 + 1): a model with `if x.shape[0] == 1`
must be planned with static shapes.  The check trace avoids B = 1 where it can because
torch's own decompositions branch there: a matmul of a batch of 1 views where a larger
batch copies (`clone`, `_unsafe_view`), and the plan, running the copies, computes the
same bits at 1.  Ops are matched by identical arguments at the sample sizes
(`_key_ir`); two ops of one phase with the same target and arguments there but other
expressions pin the sizes as well.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass
from typing import Any, Iterator

import torch
import torch.fx as fx
import torch.utils._pytree as pytree

from remat_dsl.capture.model_file import Inputs, ModelFile
from remat_dsl.plan import ir
from remat_dsl.plan.errors import RematError

BATCH, SEQ = "B", "S"  # the size symbols of the batch and the sequence dims
NAMED = {"batch": ((BATCH, 0),), "batch,seq": ((BATCH, 0), (SEQ, 1))}
DYNAMIC_HINT = "write --dynamic batch, --dynamic batch,seq, or the dims explicitly: --dynamic B=0,S=1 or S=0,B=1"

Point = tuple[int, ...]  # a size per varying symbol, in Dynamic order


@dataclass(frozen=True)
class Dynamic:
    """Which input dims vary: (symbol, dim) pairs, symbols among B and S."""

    dims: tuple[tuple[str, int], ...]

    @property
    def symbols(self) -> tuple[str, ...]:
        return tuple(sym for sym, _ in self.dims)


def parse_dynamic(text: str) -> Dynamic:
    """The value of `--dynamic`: `batch`, `batch,seq`, or `B=0,S=1` style pairs; raises
    RematError with a hint for anything else."""
    if text in NAMED:
        return Dynamic(NAMED[text])
    pairs: list[tuple[str, int]] = []
    for part in text.split(","):
        sym, equals, dim = part.strip().partition("=")
        if not equals or sym not in (BATCH, SEQ) or not dim.isdigit() or len(dim) > 1:
            raise RematError(
                f"error: --dynamic {text[:80]!r}: expected batch, batch,seq or B=DIM,S=DIM", hint=DYNAMIC_HINT
            )
        pairs.append((sym, int(dim)))
    symbols, dims = [s for s, _ in pairs], [d for _, d in pairs]
    if len(set(symbols)) != len(symbols) or len(set(dims)) != len(dims):
        raise RematError(
            f"error: --dynamic {text[:80]!r} names a symbol or a dim twice", hint="give each of B and S one dim"
        )
    return Dynamic(tuple(pairs))


def dynamic_of(inputs: tuple[ir.ValueDecl, ...]) -> Dynamic:
    """The symbols a plan's inputs declare, each on the dim where it is first declared."""
    seen: dict[str, int] = {}
    for decl in inputs:
        for dim, sym in enumerate(decl.dims):
            if sym is not None:
                seen.setdefault(sym, dim)
    return Dynamic(tuple(seen.items()))


@dataclass(frozen=True)
class Pinned:
    """Why sizes cannot vary: `symbols`, the op (`aten.view.default`), where the model calls
    it (`model.py:22`, or None) and its arguments at two sizes (`largest` empty: the trace
    at `at` failed, `smaller` says why)."""

    symbols: tuple[str, ...]
    target: str
    where: str | None
    largest: str
    smaller: str
    at: str = ""
    sample: str = ""

    def reason(self) -> str:
        """One line for stderr and the plan's comment."""
        what = _sizes_phrase(self.symbols)
        if not self.largest:
            return f"{what} cannot vary: at {self.at}, {self.smaller}"
        at = f" ({self.where})" if self.where else ""
        verb = "runs" if self.target.startswith("the step") else "takes"
        return (
            f"{what} cannot vary: {self.target}{at} {verb} {self.largest} at {self.sample} and {self.smaller} at"
            f" {self.at}"
        )


def _sizes_phrase(symbols: tuple[str, ...]) -> str:
    names = {BATCH: "the batch size", SEQ: "the sequence length"}
    return " and ".join(names.get(s, f"size {s}") for s in symbols) or "the sizes"


@dataclass(frozen=True)
class SizeProbe:
    """The outcome of NOTE: [Size probe]: `sizes` the symbols that vary with their sample
    sizes; `dims` each input and tangent name's symbol per dim (None: fixed); `args` the
    size expressions of the ops' integer arguments, keyed as `_key_ir` gives; `pinned` why the
    other requested symbols cannot vary."""

    sizes: dict[str, int]
    dims: dict[str, tuple[str | None, ...]]
    args: dict[tuple, tuple]
    pinned: tuple[Pinned, ...]


def probe_sizes(model_file: ModelFile, dynamic: Dynamic, autocast=None) -> SizeProbe:
    """NOTE: [Size probe] for `model_file`'s sample inputs.

    Raises RematError when the inputs have no dim to vary as `dynamic` asks (no tensor input,
    a scalar input, inputs whose batch dims differ, or a sample size of 1)."""
    inputs = model_file.sample_inputs()
    full = tuple(_sample_size(inputs, model_file, sym, dim) for sym, dim in dynamic.dims)
    traces = _Traces(model_file, inputs, dynamic, full, autocast)
    pinned: list[Pinned] = []
    active = list(range(len(full)))
    while active:
        found = _probe(traces, active)
        if isinstance(found, SizeProbe):
            return dataclasses.replace(found, pinned=tuple(pinned))
        pinned.append(found)
        active = [i for i in active if dynamic.dims[i][0] not in found.symbols]
    return SizeProbe({}, {}, {}, tuple(pinned))


def with_sizes(graph: ir.Graph, probe: SizeProbe) -> ir.Graph:
    """`graph` whose inputs and tangents name the size symbols and whose ops' integer
    arguments are size expressions, as `probe` found them (NOTE: [Sizes that vary] in
    remat_dsl/plan/ir.py); `graph` itself when no size varies."""
    if not probe.sizes:
        return graph

    def sized(decl: ir.ValueDecl) -> ir.ValueDecl:
        dims = probe.dims.get(decl.name)
        if dims is None or len(dims) != len(decl.shape) or not any(dims):
            return decl
        return dataclasses.replace(decl, dims=dims)

    def op(o: ir.Op) -> ir.Op:
        args = tuple(_substituted(a, o.phase, probe.args) for a in o.args)
        kwargs = tuple((k, _substituted(v, o.phase, probe.args)) for k, v in o.kwargs)
        key = _key_ir(o.phase, o.target, args, kwargs)
        if key in probe.args:
            args, kwargs = _filled((args, kwargs), probe.args[key])
        return o if (args, kwargs) == (o.args, o.kwargs) else dataclasses.replace(o, args=args, kwargs=kwargs)

    return dataclasses.replace(
        graph,
        inputs=tuple(map(sized, graph.inputs)),
        tangents=tuple(map(sized, graph.tangents)),
        ops=tuple(map(op, graph.ops)),
        outputs=_substituted(graph.outputs, ir.FORWARD, probe.args),
        gradients=tuple(
            dataclasses.replace(g, value=_substituted(g.value, ir.BACKWARD, probe.args)) for g in graph.gradients
        ),
    )


# --- traces -----------------------------------------------------------------


class _Traces:
    """The step captured at each point (a size per symbol), once each."""

    def __init__(self, model_file: ModelFile, inputs: Inputs, dynamic: Dynamic, full: Point, autocast):
        self.model_file, self.inputs, self.dynamic, self.full, self.autocast = (
            model_file,
            inputs,
            dynamic,
            full,
            autocast,
        )
        self.memo: dict[Point, Any] = {}

    def at(self, point: Point):
        """The Captured step at `point`, or the RematError its capture raised."""
        from remat_dsl.capture.fx import Captured, capture

        if point not in self.memo:
            try:
                inputs = self.inputs if point == self.full else cut_inputs(self.inputs, self.dynamic, self.full, point)
                captured = capture(self.model_file.build_model(), inputs, None, self.autocast, copy_model=False)
                assert isinstance(captured, Captured)  # without `recall`, the whole step is traced
                self.memo[point] = captured
            except RematError as error:  # the model does not run at these sizes: PyTorch's reason
                self.memo[point] = error
        return self.memo[point]

    def label(self, point: Point) -> str:
        return ", ".join(f"{sym}={size}" for (sym, _), size in zip(self.dynamic.dims, point))


def _sample_size(inputs: Inputs, model_file: ModelFile, sym: str, dim: int) -> int:
    tensors = [v for v in inputs.leaves() if isinstance(v, torch.Tensor)]
    flag = f"--dynamic {sym}={dim}"
    shapes = ", ".join(str(list(t.shape)) for t in tensors) or "none"
    if not tensors or any(t.dim() == 0 for t in tensors) or tensors[0].dim() <= dim:
        raise RematError(
            f"{model_file.path}: error: {flag} needs tensor inputs with a dim {dim}; sample_inputs() gives tensors"
            f" of shapes {shapes}",
            hint=f"plan without --dynamic, or give sample_inputs() tensors whose dim {dim} is the size that varies",
        )
    size = int(tensors[0].shape[dim])
    if sym == BATCH and any(t.dim() <= dim or int(t.shape[dim]) != size for t in tensors):
        raise RematError(
            f"{model_file.path}: error: --dynamic batch needs tensor inputs that share their dim {dim}, the batch;"
            f" sample_inputs() gives tensors of shapes {shapes}",
            hint="plan without --dynamic, or give sample_inputs() tensors that share their batch dim",
        )
    if size < 2:
        what = "batch" if sym == BATCH else "sequence length"
        raise RematError(
            f"{model_file.path}: error: --dynamic needs a sample {what} of 2 or more, the largest the plan takes;"
            f" sample_inputs() gives a {what} of {size}",
            hint=f"give sample_inputs() the largest {what} the plan is for",
        )
    return size


def cut_inputs(inputs: Inputs, dynamic: Dynamic, full: Point, point: Point) -> Inputs:
    """`inputs` with each tensor, also inside tuples, lists and dicts (NOTE: [Nested arguments]
    in remat_dsl/capture/fx.py), cut to `point` on the dims that have the sample's size."""

    def cut(value):
        if not isinstance(value, torch.Tensor):
            return value
        for (_, dim), big, small in zip(dynamic.dims, full, point):
            if value.dim() > dim and value.shape[dim] == big:
                value = value.narrow(dim, 0, small)
        return value.clone()

    return Inputs(pytree.tree_map(cut, inputs.args), pytree.tree_map(cut, inputs.kwargs))


# --- fitting ----------------------------------------------------------------


def _probe(traces: _Traces, active: list[int]) -> SizeProbe | Pinned:
    """The probe of the symbols `active` (indexes into traces.dynamic.dims), the others at
    their sample sizes, or the first Pinned found."""
    full = traces.full
    symbols = tuple(traces.dynamic.dims[i][0] for i in active)
    points = [full]
    for subset in _subsets(active):
        points.append(tuple(size - 1 if i in subset else size for i, size in enumerate(full)))
    check = tuple(
        (max(size - 2, 1) if traces.dynamic.dims[i][0] == BATCH else size // 2 + 1) if i in active else size
        for i, size in enumerate(full)
    )
    every = points if check in points else [*points, check]  # a sample size of 2: the smaller traces cover it
    captured = []
    for point in every:
        trace = traces.at(point)
        if isinstance(trace, RematError):
            reason = trace.message.partition("error: ")[2] or trace.message
            return Pinned(_changed(full, point, traces), "the model", None, "", reason, traces.label(point))
        captured.append(trace)
    sizes = {traces.dynamic.dims[i][0]: full[i] for i in active}
    per_point = [{sym: point[i] for sym, i in zip(symbols, active)} for point in every]
    args: dict[tuple, tuple] = {}
    for phase in (ir.FORWARD, ir.BACKWARD):
        graphs = [c.forward if phase == ir.FORWARD else c.backward for c in captured]
        found = _fit_ops(phase, graphs, per_point, symbols, traces, every, args)
        if found is not None:
            return found
    dims: dict[str, tuple[str | None, ...]] = {}
    for what, name, shapes in _declared_shapes(captured):
        fitted = _fit_dims(shapes, per_point, symbols)
        if fitted is None:
            bad = next((k for k, shape in enumerate(shapes) if list(shape) != list(shapes[0])), len(shapes) - 1)
            return Pinned(
                _changed(full, every[bad], traces), what, None, str(list(shapes[0])), str(list(shapes[bad])),
                traces.label(every[bad]), traces.label(full),
            )  # fmt: skip
        dims[name] = fitted
    return SizeProbe(sizes, dims, args, ())


def _subsets(active: list[int]) -> Iterator[frozenset[int]]:
    """Each non-empty subset of `active`, the singletons first."""
    for mask in sorted(range(1, 1 << len(active)), key=lambda m: (bin(m).count("1"), m)):
        yield frozenset(i for bit, i in enumerate(active) if mask >> bit & 1)


def _changed(full: Point, point: Point, traces: _Traces) -> tuple[str, ...]:
    return tuple(sym for (sym, _), a, b in zip(traces.dynamic.dims, full, point) if a != b)


def _fit_ops(phase, graphs, per_point, symbols, traces, points, args) -> Pinned | None:
    """Fill `args` with the size expressions of `phase`'s ops (keyed as `_key_ir`), or
    the Pinned of the first op that does not fit."""
    nodes = [[n for n in g.graph.nodes if n.op == "call_function"] for g in graphs]
    full = traces.full
    for k, other in enumerate(nodes[1:], 1):
        if len(other) != len(nodes[0]):
            longer = nodes[0] if len(nodes[0]) > len(other) else other
            extra = longer[min(len(nodes[0]), len(other))]
            target = str(extra.target).removeprefix("<built-in function ").removesuffix(">")
            return Pinned(
                _changed(full, points[k], traces), f"the step (the first op one trace lacks: {target})",
                _where(extra), f"{len(nodes[0])} ops", f"{len(other)} ops", traces.label(points[k]), traces.label(full),
            )  # fmt: skip
    for column in zip(*nodes):
        first = column[0]
        skeletons = [_skeleton_fx((n.args, n.kwargs)) for n in column]
        for k, node in enumerate(column[1:], 1):
            if node.target != first.target or skeletons[k] != skeletons[0]:
                return _pin_node(first, node, _changed(full, points[k], traces), traces, points[k])
        values = [_ints((n.args, n.kwargs)) for n in column]
        fitted: list[ir.SizeExpr | int] = []
        for position in range(len(values[0])):
            series = [v[position] for v in values]
            expr = _fit(series, per_point, symbols)
            if expr is None:
                varying = tuple(s for s in symbols if _depends(series, per_point, s))
                bad = next(k for k in range(1, len(column)) if series[k] != series[0])
                return _pin_node(first, column[bad], varying or symbols, traces, points[bad])
            fitted.append(expr)
        if not any(isinstance(e, ir.SizeExpr) for e in fitted):
            continue
        key = (phase, str(first.target), _skeleton_fx((first.args, first.kwargs), ints=True))
        if args.setdefault(key, tuple(fitted)) != tuple(fitted):
            return Pinned(
                symbols, str(first.target), _where(first), _arguments(first),
                "other sizes in another op with these arguments at the sample sizes", traces.label(full),
                traces.label(full),
            )  # fmt: skip
    for column in zip(*nodes):  # an op with no expression whose twin at the sample sizes has one
        first = column[0]
        key = (phase, str(first.target), _skeleton_fx((first.args, first.kwargs), ints=True))
        if key in args and all(_ints((n.args, n.kwargs)) == _ints((first.args, first.kwargs)) for n in column):
            return Pinned(
                symbols, str(first.target), _where(first), _arguments(first),
                "the same at every size, where an op with these arguments follows the sizes",
                traces.label(full), traces.label(full),
            )  # fmt: skip
    return None


def _pin_node(a: fx.Node, b: fx.Node, symbols, traces: _Traces, point: Point) -> Pinned:
    return Pinned(
        tuple(symbols), str(a.target), _where(a), _arguments(a), _arguments(b), traces.label(point),
        traces.label(traces.full),
    )  # fmt: skip


def _fit(series: list[int], per_point: list[dict[str, int]], symbols: tuple[str, ...]) -> ir.SizeExpr | int | None:
    """The expression k*B*S + a*B + b*S + c through `series` (a value per point, the points
    as `_probe` orders them), an int where it is constant, None where none fits."""
    if all(v == series[0] for v in series):
        return series[0]
    full = per_point[0]
    if len(symbols) == 1:
        (x,) = symbols
        a = series[0] - series[1]
        terms = [((x,), a), ((), series[0] - a * full[x])]
    else:
        x, y = symbols
        v11, v01, v10, v00 = series[0], series[1], series[2], series[3]  # (X, Y), (X-1, Y), (X, Y-1), (X-1, Y-1)
        k = v11 - v01 - v10 + v00
        a = (v11 - v01) - k * full[y]
        b = (v11 - v10) - k * full[x]
        c = v11 - k * full[x] * full[y] - a * full[x] - b * full[y]
        terms = [((x, y), k), ((x,), a), ((y,), b), ((), c)]
    expr = ir.SizeExpr(ir.canonical_terms(terms))
    if any(expr.evaluate(sizes) != value for sizes, value in zip(per_point, series)):
        return None
    if not expr.symbols():
        return expr.evaluate({})
    return expr


def _depends(series, per_point, symbol: str) -> bool:
    """Whether `series` changes between two points that differ in `symbol` alone."""
    for i, p in enumerate(per_point):
        for j, q in enumerate(per_point):
            others = all(p[s] == q[s] for s in p if s != symbol)
            if p[symbol] != q[symbol] and others and series[i] != series[j]:
                return True
    return False


def _fit_dims(shapes, per_point, symbols) -> tuple[str | None, ...] | None:
    """The symbol of each dim of a declared value's shapes (one per point), None where fixed;
    None in all when a dim follows the sizes other than one for one, or the rank differs."""
    if any(len(s) != len(shapes[0]) for s in shapes):
        return None
    dims: list[str | None] = []
    for position in range(len(shapes[0])):
        expr = _fit([int(s[position]) for s in shapes], per_point, symbols)
        if type(expr) is int:
            dims.append(None)
        elif isinstance(expr, ir.SizeExpr) and len(expr.terms) == 1 and expr.terms[0][1] == 1:
            ((names, _),) = expr.terms
            if len(names) != 1:
                return None
            dims.append(names[0])
        else:
            return None
    return tuple(dims)


def _declared_shapes(captured) -> list[tuple[str, str, list]]:
    """(what, name, shape at each trace) of each input and model output gradient."""
    rows = [
        (f"input '{name}'", name, [c.example_primals[i].shape for c in captured])
        for i, (kind, name) in enumerate(captured[0].primal_names)
        if kind == "input"
    ]
    tangents = [_tangents(c) for c in captured]
    for i, (name, _) in enumerate(tangents[0]):
        rows.append((f"the model's output '{name}'", name, [t[i][1] for t in tangents]))
    return rows


# --- argument skeletons -------------------------------------------------------
# An op's arguments with their integers taken out: the same text in an fx node and in the
# ir op or view call built from it (remat_dsl/capture/fbgraph.py), so that a size expression
# found on one lands on the other.


INT = "int"  # the place of an integer in a skeleton


def _skeleton_fx(value, ints: bool = False):
    """`value` (fx arguments) with tensors as `%`, devices as `device`, and every integer as
    INT (or itself where `ints`)."""
    if isinstance(value, fx.Node):
        return "%"
    if isinstance(value, (list, tuple)):
        return tuple(_skeleton_fx(v, ints) for v in value)
    if isinstance(value, dict):
        return tuple((k, _skeleton_fx(v, ints)) for k, v in value.items())
    if isinstance(value, torch.device):
        return "device"
    if type(value) is int:
        return value if ints else INT
    return ("const", repr(value))


def _key_ir(phase: str, target: str, args: tuple, kwargs: tuple) -> tuple:
    """The key of an ir op or view call in SizeProbe.args: what `_fit_ops` keys its fx node by."""
    return phase, target, (tuple(map(_skeleton_ir, args)), tuple((k, _skeleton_ir(v)) for k, v in kwargs))


def _skeleton_ir(value):
    """`_skeleton_fx(..., ints=True)` of an ir argument (a view call is a tensor)."""
    if isinstance(value, (ir.Ref, ir.Call)):
        return "device" if isinstance(value, ir.Call) and value.target == "torch.device" else "%"
    if isinstance(value, ir.ListArg):
        return tuple(map(_skeleton_ir, value.items))
    if isinstance(value, ir.SizeExpr):
        return ("size", value)
    if type(value) is int:
        return value
    if isinstance(value, ir.Sym):
        return ("const", value.name)
    return ("const", repr(value))


def _ints(value) -> list[int]:
    """The integers of fx arguments, depth first."""
    if isinstance(value, (list, tuple)):
        return [i for v in value for i in _ints(v)]
    if isinstance(value, dict):
        return [i for v in value.values() for i in _ints(v)]
    return [value] if type(value) is int else []


def _filled(value, exprs: tuple):
    """ir (args, kwargs) `value` with its integers, depth first, replaced by `exprs`."""
    queue = list(exprs)

    def fill(v):
        if isinstance(v, ir.ListArg):
            return ir.ListArg(tuple(map(fill, v.items)))
        if type(v) is int:
            return queue.pop(0)
        return v

    args, kwargs = value
    return tuple(map(fill, args)), tuple((k, fill(v)) for k, v in kwargs)


def _substituted(arg: ir.Arg, phase: str, table: dict) -> ir.Arg:
    """`arg` with the views inside it given their size expressions."""
    if isinstance(arg, (ir.ListArg, ir.TupleArg)):
        return type(arg)(tuple(_substituted(a, phase, table) for a in arg.items))
    if not isinstance(arg, ir.Call) or arg.target in ("torch.device", "operator.getitem"):
        if isinstance(arg, ir.Call):
            return dataclasses.replace(arg, args=tuple(_substituted(a, phase, table) for a in arg.args))
        return arg
    args = tuple(_substituted(a, phase, table) for a in arg.args)
    kwargs = tuple((k, _substituted(v, phase, table)) for k, v in arg.kwargs)
    for where in (phase, ir.FORWARD):  # a backward op may read a view the forward made
        key = _key_ir(where, arg.target, args, kwargs)
        if key in table:
            args, kwargs = _filled((args, kwargs), table[key])
            break
    return ir.Call(arg.target, args, kwargs)


# --- messages -----------------------------------------------------------------


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
