"""The one verification of a plan: what `remat check`, `codegen`, `show` and `fmt` rely on.

`verify(plan)` runs, in this order, and raises PlanError at the first failure (with the
offending line, carets and a hint):

1. the digest: the graph sections and the header's text lines are those the plan was made
   with (NOTE: [Graph digest] in remat_dsl.plan.digest), so only the schedule, the header's
   budget and status and comments were edited by hand;
2. the declarations: the device is one the generated module can run on, the autocast
   dtype (if any) is one torch.autocast runs in, every dtype is known, no tensor, value or
   budget is larger than any device holds (MAX_BYTES);
3. the operators and values: every `aten.NAME.OVERLOAD` exists in this torch, inline calls
   are views (or `operator.getitem` with an integer, `torch.device("kind")`, or an op's
   argument read from a one-element tensor: NOTE: [Scalar reads]), the arguments
   fit the operator's schema, symbols are torch's dtypes, layouts and memory formats, and
   constant inputs are plain constants (NOTE: [Plan text as data] in
   remat_dsl.codegen.generate);
4. the schedule: `simulate` replays it (remat_dsl.check.replay) and the plan's own
   constraints hold (remat_dsl.plan.constraints.check_plan).

It returns a `VerifiedPlan`: the plan with its simulation, the one thing code generation,
`remat show`, `remat diff` and the report read.  `load_checked(path)` reads, parses and
verifies a file.
"""

from __future__ import annotations

import difflib
import functools
import math
import re

from remat_dsl.plan import digest, ir
from remat_dsl.plan.operators import SCALAR_READ, is_view, torch_constants
from remat_dsl.plan.errors import PlanError, RematError
from dataclasses import dataclass

from remat_dsl.check.replay import DTYPE_ITEMSIZE, Simulation, simulate

MAX_BYTES = 1 << 48  # 256 TiB: more than any device (or host) holds
DEVICE_RE = re.compile(r"cpu|cuda(:[0-9]+)?")
RERUN = "the graph sections describe the model; edit only the schedule, or re-run `remat plan`"
INLINE_TARGETS = ("operator.getitem", "torch.device")


@dataclass(frozen=True)
class VerifiedPlan:
    """A plan that passed `verify`, with its simulation (remat_dsl.check.replay): what the
    plan does, step by step (NOTE: [Step events]), so that no later stage replays the
    instructions again.  Made only by `verify`."""

    plan: ir.Plan
    simulation: Simulation


def load_checked(path: str, *, within_budget: bool = True) -> VerifiedPlan:
    """Read, parse and verify the plan file at `path`.

    Raises RematError when the file cannot be read (missing, not UTF-8), PlanError when
    it does not parse or does not verify.
    """
    from remat_dsl.plan.files import read_text
    from remat_dsl.plan.parser import parse

    text = read_text(path, "plan")
    plan = parse(text, path)
    try:
        return verify(plan, within_budget=within_budget)
    except PlanError as error:
        raise error.with_source(path, text) from None


def verify(plan: ir.Plan, *, within_budget: bool = True) -> VerifiedPlan:
    """Verify `plan` (see the module docstring).

    within_budget: also refuse a plan whose predicted peak is above its header's budget
    (`remat show` draws such plans; `check` and `codegen` refuse them).
    Raises PlanError.
    """
    from remat_dsl.plan.constraints import check_plan

    check_digest(plan)
    check_declarations(plan)
    outputs = plan.section_span("outputs")
    check_operators(plan.graph, ir.Span(outputs.line + 1, 3) if outputs else None)
    simulation = simulate(plan)
    check_plan(plan)
    if within_budget:
        from remat_dsl.check.report import check_budget

        check_budget(plan, simulation)
    return VerifiedPlan(plan, simulation)


# ---------------------------------------------------------------------------
# 1. The digest
# ---------------------------------------------------------------------------


def check_digest(plan: ir.Plan) -> None:
    """Raise PlanError at the first graph line that no longer matches the plan's digest."""
    stored = plan.digest
    if stored is None and not plan.section_spans:
        return  # a plan made in code, not read from a file: its graph is the captured one
    if stored is None:
        end = plan.section_span("backward")
        raise PlanError(
            "the plan has no `digest` section, so its graph sections cannot be trusted",
            span=end, hint="re-run `remat plan` (plans written by hand start from one it printed)",
        )
    outputs = plan.section_span("outputs")
    outputs_span = ir.Span(outputs.line + 1, 3) if outputs else None
    items = digest.items(plan.graph, outputs_span, header=plan.header)
    if stored.graph == digest.graph_hash(items):
        return
    if stored.graph == digest.graph_hash(digest.items(plan.graph, outputs_span)):
        raise PlanError(
            "the plan was sealed by an earlier remat-dsl, whose digest did not cover the header's text lines "
            f"({', '.join(digest.HEADER_TEXTS)})",
            span=stored.span, hint="re-run `remat plan` to seal it again",
        )  # fmt: skip
    hashes = digest.decode_items(stored.items)
    if hashes is None:
        raise PlanError("the digest's `items` lines were edited", span=stored.span, hint=RERUN)
    if plan.graph.autocast is None and hashes and hashes[0] in _AUTOCAST_HASHES:
        raise PlanError(
            "the header's `autocast` line was removed: the graph was captured under autocast, and its digest says so",
            span=plan.section_span("header"), hint=RERUN,
        )  # fmt: skip
    for index, item in enumerate(items):
        if index >= len(hashes) or hashes[index] != digest.item_hash(item):
            where = item.span or plan.section_span(item.section)
            what = "the header's `autocast` line was edited (the graph was captured under another autocast state)"
            if item.section == "header" and not item.text.startswith("autocast "):
                what = f"the header's `{item.text.split()[0]}` line was edited (the digest seals what the plan is for)"
            elif item.section != "header":
                what = (
                    f"this line of the `{item.section}` section was edited (or one just above it was added or removed)"
                )
            raise PlanError(f"{what}: the graph sections no longer match the plan's digest", span=where, hint=RERUN)
    last = plan.section_span("forward")
    if len(hashes) > len(items):
        raise PlanError(
            f"{len(hashes) - len(items)} line(s) of the graph sections were removed: they no longer match the plan's"
            " digest",
            span=last,
            hint=RERUN,
        )
    raise PlanError("the graph sections no longer match the plan's digest", span=stored.span, hint=RERUN)


# The first item's hash in a plan captured under autocast (NOTE: [Graph digest]).
_AUTOCAST_HASHES = frozenset(digest.item_hash(digest.Item("header", f"autocast {d}", None)) for d in ir.AUTOCAST_DTYPES)


# ---------------------------------------------------------------------------
# 2. Declarations
# ---------------------------------------------------------------------------


def check_declarations(plan: ir.Plan) -> None:
    """Device, dtypes and sizes; raises PlanError at the first bad declaration."""
    header = plan.header
    if not DEVICE_RE.fullmatch(header.device):
        raise PlanError(
            f"unknown device `{header.device}` in the header",
            span=plan.section_span("header"),
            hint="a plan runs on `cpu` or `cuda` (`cuda:N`); re-run `remat plan`",
        )
    if header.budget > MAX_BYTES:
        raise PlanError(
            f"the budget {header.budget} B is more than any device holds",
            span=plan.section_span("header"), hint=f"write a budget below {MAX_BYTES} B",
        )
    graph = plan.graph
    if graph.autocast is not None and graph.autocast.dtype not in ir.AUTOCAST_DTYPES:
        raise PlanError(
            f"unknown autocast dtype `{graph.autocast.dtype}` in the header",
            span=graph.autocast.span or plan.section_span("header"), length=len(graph.autocast.dtype),
            hint=f"torch.autocast runs in {' or '.join(ir.AUTOCAST_DTYPES)} (remat plan --autocast bf16 or fp16)",
        )  # fmt: skip
    for value in (*graph.inputs, *graph.parameters, *graph.buffers, *graph.tangents):
        _check_size(value, value.dtype, value.shape, None)
    for tensor in graph.tensors:
        _check_size(tensor, tensor.dtype, tensor.shape, tensor.nbytes)


def _check_size(decl, dtype: str, shape: tuple[int, ...], nbytes: int | None) -> None:
    itemsize = DTYPE_ITEMSIZE.get(dtype)
    if itemsize is None:
        close = difflib.get_close_matches(dtype, list(DTYPE_ITEMSIZE), n=1)
        raise PlanError(
            f"unknown dtype `{dtype}` of '{decl.name}'", span=decl.span, word=dtype,
            hint=(f"did you mean `{close[0]}`? " if close else "")
            + "dtypes are torch's names: float32, bfloat16, int64, bool ...",
        )  # fmt: skip
    numel = 1
    for dim in shape:
        numel *= dim
    if max(numel * itemsize, nbytes or 0) > MAX_BYTES:
        raise PlanError(
            f"'{decl.name}' would take {max(numel * itemsize, nbytes or 0)} B, more than any device holds",
            span=decl.span, length=len(decl.name), hint=RERUN,
        )


# ---------------------------------------------------------------------------
# 3. Operators
# ---------------------------------------------------------------------------


def check_operators(graph: ir.Graph, outputs_span: ir.Span | None = None) -> None:
    """Every operator the module would call exists and takes these arguments, and every
    other value is data (NOTE: [Plan text as data] in remat_dsl.codegen.generate).
    outputs_span: where the `outputs` value is, for messages."""
    for constant in graph.constants:
        if not _is_plain(constant.value):
            raise PlanError(
                f"the argument `{constant.name}` is given as {_shown(constant.value)}; "
                "a forward argument that is not a tensor is a constant: None, True, False, a number or a string",
                span=constant.span, hint=RERUN,
            )  # fmt: skip
    for op in graph.ops:
        overload = _overload(op.target, op.span, op.target)
        _check_binding(overload, op.target, op.args, op.kwargs, op.span)
        if not _returns_list(overload):
            returns = len(overload._schema.returns)
            extra = [t for t in op.outputs if int(t.rpartition(":")[2] if ":" in t else 0) >= returns]
            if extra:
                raise PlanError(
                    f"'{op.name}' declares output '{extra[0]}', but {op.target} returns {returns} value(s)",
                    span=op.span,
                    hint=RERUN,
                )
        keyed: list[tuple[int | str, ir.Arg]] = [*enumerate(op.args), *op.kwargs]
        for key, arg in keyed:
            if isinstance(arg, ir.Call) and arg.target == SCALAR_READ:
                _check_scalar_read(graph, overload, key, arg, op.span)
            else:
                _check_inline(arg, op.span)
    _check_outputs(graph.outputs, outputs_span)
    for grad in graph.gradients:
        _check_inline(grad.value, grad.span)


def refuse_custom_operators(graph: ir.Graph) -> None:
    """Raise RematError naming the first op of `graph` that calls a custom operator (NOTE:
    [Custom operators]): a plan runs aten operators only."""
    custom = first_custom_operator(graph)
    if custom is None:
        return
    raise RematError(
        f"error: op '{custom.name}' calls `{custom.target}`, which is not an aten operator (a custom operator, "
        "registered by a library); a plan runs aten operators only",
        hint="run the model with an implementation made of torch operations (a library option that turns its "
        "custom kernel off), or plan the modules around it"
        + (
            "; Hugging Face's mixture-of-experts models run their experts with torch operations when their config "
            'has experts_implementation="batched_mm"'
            if str(custom.target).startswith("transformers.grouped_mm")
            else ""
        ),
    )


def first_custom_operator(graph: ir.Graph) -> ir.Op | None:
    """The first op of `graph` whose target is not an aten operator a plan can name (NOTE:
    [Custom operators]), or None."""
    return next((op for op in graph.ops if _resolve(op.target) is None), None)


# NOTE: [Custom operators]
# A library may register its own operators (torch.library): Hugging Face's mixture-of-
# experts layers call `transformers.grouped_mm_fallback`.  AOTAutograd keeps them whole,
# and a plan's parser, this verifier and the generated module (which imports torch alone)
# know aten operators only: `remat check` would refuse a plan of such a graph as
# `unknown operator`.  So `remat plan` refuses such a graph before solving
# (`first_custom_operator`), naming the op; capture and `remat profile` still take it
# (tests/test_robust_timing.py times its own operators).


def _check_outputs(arg: ir.Arg, span: ir.Span | None) -> None:
    """The model's output: tensors, their views, None, and tuples, lists, dicts and classes
    (`module.Class(field=...)`) of them (ir.is_structure).  Which classes may build it is
    decided where the model is (the generated module's `_output_type`: data containers
    only, among the modules the model imported)."""
    if isinstance(arg, (ir.ListArg, ir.TupleArg)):
        for item in arg.items:
            _check_outputs(item, span)
    elif isinstance(arg, ir.Call) and ir.is_structure(arg):
        parts = arg.target.split(".")
        if arg.target != "dict" and (len(parts) < 2 or not all(part.isidentifier() for part in parts)):
            raise PlanError(
                f"the output class `{_shown(arg.target)}` is not a dotted path (module.Class)", span=span, hint=RERUN
            )
        for _, item in arg.kwargs:
            _check_outputs(item, span)
    elif arg is not None and not isinstance(arg, (ir.Ref, ir.Call)):
        raise PlanError(
            f"the model's output holds the constant {_shown(arg)}; outputs are tensors", span=span, hint=RERUN
        )
    else:
        _check_inline(arg, span)


def _is_plain(value) -> bool:
    return value is None or isinstance(value, (bool, int, float, str))


def _shown(value) -> str:
    """A value for a message, at most 80 characters."""
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _check_inline(arg: ir.Arg, span: ir.Span | None) -> None:
    """Calls inside arguments are views (they allocate nothing), `operator.getitem(CALL,
    INDEX)` of a view's results or `torch.device("KIND")`; symbols are torch's dtypes,
    layouts and memory formats."""
    if isinstance(arg, ir.Sym) and arg.name not in torch_constants():
        raise PlanError(
            f"`{_shown(arg.name)[:80]}` is not a torch dtype, layout or memory format", span=span,
            hint="constants in arguments are torch's dtypes (torch.float32), layouts (torch.strided) "
            "and memory formats (torch.contiguous_format); " + RERUN,
        )  # fmt: skip
    if isinstance(arg, ir.Call):
        if arg.target == SCALAR_READ:  # NOTE: [Scalar reads]: at its read tensor, which has a span of its own
            read = next((ref for ref in ir.iter_refs(arg) if ref.span is not None), None)
            raise PlanError(
                f"`{SCALAR_READ}` reads a number from a tensor, so it is an operation's argument itself, "
                "where the operator takes a number; not inside a view, a list or the model's outputs",
                span=read.span if read else span, length=len(read.name) + 1 if read else 1,
                word=None if read else arg.target, hint=RERUN,
            )  # fmt: skip
        if arg.target == "operator.getitem" and not (
            len(arg.args) == 2
            and not arg.kwargs
            and isinstance(arg.args[0], (ir.Call, ir.Ref))
            and type(arg.args[1]) is int
        ):
            raise PlanError(
                "`operator.getitem` takes a value and an integer index", span=span, word=arg.target, hint=RERUN
            )
        if arg.target == "torch.device" and not (
            len(arg.args) == 1
            and not arg.kwargs
            and isinstance(arg.args[0], str)
            and re.fullmatch(r"[a-z]+", arg.args[0])
        ):
            raise PlanError(
                '`torch.device` takes one device kind, such as "cpu"', span=span, word=arg.target, hint=RERUN
            )
        if arg.target not in INLINE_TARGETS:
            overload = _overload(arg.target, span, arg.target)
            if not is_view(overload):
                raise PlanError(
                    f"`{arg.target}` allocates memory, so it cannot be written inside another operation's arguments",
                    span=span, word=arg.target, hint=RERUN,
                )
            _check_binding(overload, arg.target, arg.args, arg.kwargs, span)
        for item in (*arg.args, *(v for _, v in arg.kwargs)):
            _check_inline(item, span)
    elif isinstance(arg, (ir.ListArg, ir.TupleArg)):
        for item in arg.items:
            _check_inline(item, span)


NUMBER_TYPES = ("float", "int", "Scalar", "SymInt", "SymFloat")  # a schema argument a scalar read may fill


def _check_scalar_read(graph: ir.Graph, overload, key: int | str, arg: ir.Call, span: ir.Span | None) -> None:
    """NOTE: [Scalar reads] in remat_dsl/plan/operators.py: `arg`, the operation's argument
    `key` (a position or a keyword), reads a one-element tensor an op makes, and the
    operator takes a number there."""
    where = arg.args[0].span if len(arg.args) == 1 and isinstance(arg.args[0], ir.Ref) else None
    if not (len(arg.args) == 1 and not arg.kwargs and isinstance(arg.args[0], ir.Ref)):
        raise PlanError(f"`{SCALAR_READ}` takes one `%` reference to a tensor", span=span, word=arg.target, hint=RERUN)
    name = arg.args[0].name
    decl = graph.tensor_by_name.get(name)
    values = (*graph.inputs, *graph.parameters, *graph.buffers, *graph.tangents)
    if decl is None and not any(v.name == name for v in values):
        return  # an unknown name: the replay says so, with the names it may have meant
    if decl is None:
        raise PlanError(
            f"`{SCALAR_READ}` reads '%{name}', which no op of the plan makes; it reads a one-element tensor an op "
            "makes", span=where or span, length=len(name) + 1, hint=RERUN,
        )  # fmt: skip
    if math.prod(decl.shape) != 1:
        raise PlanError(
            f"`{SCALAR_READ}` reads a number from '%{name}', a tensor of {math.prod(decl.shape)} elements "
            f"({list(decl.shape)}); it reads one-element tensors only",
            span=where or span, length=len(name) + 1, hint=RERUN,
        )  # fmt: skip
    schema = overload._schema.arguments
    named = [a for a in schema if a.name == key] if isinstance(key, str) else schema[key : key + 1]
    kind = str(named[0].type) if named else "?"
    if kind not in NUMBER_TYPES:
        raise PlanError(
            f"`{SCALAR_READ}` gives a number where `{overload._schema.name.replace('::', '.')}` takes "
            f"`{kind}` (argument `{named[0].name if named else key}`)",
            span=span, word=arg.target, hint=RERUN,
        )  # fmt: skip


@functools.cache
def _resolve(target: str):
    """The torch OpOverload named `aten.NAME.OVERLOAD`, or None."""
    import torch

    parts = target.split(".")
    if len(parts) != 3 or parts[0] != "aten":
        return None
    packet = getattr(torch.ops.aten, parts[1], None) if not parts[1].startswith("_" * 2) else None
    if not isinstance(packet, torch._ops.OpOverloadPacket):
        return None
    overload = getattr(packet, parts[2], None) if not parts[2].startswith("_" * 2) else None
    return overload if isinstance(overload, torch._ops.OpOverload) else None


def _overload(target: str, span: ir.Span | None, word: str):
    overload = _resolve(target)
    if overload is None:
        raise PlanError(
            f"unknown operator `{target}`",
            span=span, word=word,
            hint="operators are torch's `aten.NAME.OVERLOAD` (e.g. aten.mm.default) "
            "as `remat plan` wrote them; " + RERUN,
        )  # fmt: skip
    return overload


def _check_binding(overload, target: str, args: tuple, kwargs: tuple, span: ir.Span | None) -> None:
    schema = overload._schema
    names = [a.name for a in schema.arguments]
    positional = [a for a in schema.arguments if not a.kwarg_only]
    if len(args) > len(positional):
        raise PlanError(
            f"`{target}` takes at most {len(positional)} positional arguments, the plan gives {len(args)}",
            span=span,
            word=target,
            hint=RERUN,
        )
    for key, _ in kwargs:
        if key not in names:
            raise PlanError(f"`{target}` has no argument `{key}`", span=span, word=target, hint=RERUN)


def _returns_list(overload) -> bool:
    returns = overload._schema.returns
    return len(returns) == 1 and str(returns[0].type).endswith("[]")
