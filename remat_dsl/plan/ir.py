"""The plan IR: frozen dataclasses that every part of remat-dsl reads and writes.

A `Plan` is a value. It holds the captured FB-graph (inputs, parameters, buffers, the
operations and the tensors they allocate, the model outputs, the gradients returned for
parameters, the buffer updates) and the schedule (a forward and a backward section of
instructions, each on a named stream).  The parser (`remat_dsl.plan.parser`) builds it from
text, the printer (`remat_dsl.plan.printer`) is the one way to turn it into text, the
simulator (`remat_dsl.check.replay`) checks it and predicts its peak memory and time, and the
code generator (`remat_dsl.codegen.generate`) renders it as a standalone PyTorch module.

NOTE: [Units]
Sizes are integer bytes.  Durations are integer microseconds (`*_us`), bandwidth is
integer bytes per second.  Integers keep `parse(print(plan)) == plan` exact.

NOTE: [Names]
Operation names come from module paths (`transformer.h.0.ln_1`, with a local suffix such
as `.mul_1` when a module runs several operations of one kind; backward operations carry
`.bwd.`).  An operation's first output tensor has the operation's name; output k >= 1 is
`NAME:k`.  Arguments refer to values with a `%` sigil: `%transformer.h.0.ln_1:1`.
Parameters and buffers use their `state_dict` names, inputs their argument names, and the
gradient the caller passes for model output k is `grad_output.k`.

NOTE: [Instruction semantics]
compute OP       first execution of OP (forward ops in `forward`, backward ops in
                 `backward`, each exactly once).  Every tensor its arguments refer to must
                 be resident and not awaiting a transfer; it allocates all of OP's outputs
                 (peak during the op: resident + outputs + OP.temp_bytes).  Outputs that are
                 already resident are discarded right after the op.
recompute OP     any later execution of a forward OP, in either section.
delete T         frees the device copy of T.  Model outputs (held by the caller) and
                 parameter gradients (returned to autograd) cannot be deleted.
offload T        starts copying resident T to host memory on the `d2h` stream.  For a
                 parameter P kept in host memory (prefetched), `offload P` after `update P`
                 is its write-back: the updated device copy copied into P's host copy
                 (NOTE: [Parameters on the host] in remat_dsl.check.replay).
prefetch T       allocates T on the device and starts copying it back on the `h2d` stream;
                 T must have a completed host copy and no device copy.
wait T           the compute stream waits for T's pending transfer; required before a
                 prefetched T is used and before an offloaded T is deleted.
update P         runs the optimizer's update of trainable parameter P on the device, in
                 place, from its gradient (resident); after the gradient is complete and
                 after every read of P (NOTE: [Optimizer in the step] in
                 remat_dsl.plan.optimizer).  Only in the backward of a plan with an
                 `optimizer` header line, exactly once per trainable parameter.
host_update P    the same update run by the host CPU on the `host` stream, from the host
                 copy of P's gradient (offloaded and waited for), with P's optimizer states
                 and master copy in host memory; P is then copied back to the device on
                 the `h2d` stream.
prefetch_states P  allocates P's optimizer states on the device and starts copying them
                 from host memory on the `h2d` stream: P's update is paged, its states live
                 in host memory and are on the device only from here to their offload's
                 wait (NOTE: [Paged optimizer states] in remat_dsl.plan.optimizer).
offload_states P starts copying P's updated states back to host memory on the `d2h`
                 stream, after `update P`.
wait_states P    the compute stream waits for the transfer of P's states in flight:
                 required between `prefetch_states P` and `update P`, and after
                 `offload_states P`, where it frees the states' device copy.
Random operations (dropout) that are recomputed replay the RNG state saved at their first
execution; their `compute` instructions keep the captured order, so the random stream is
consumed as in eager PyTorch.
"""

from __future__ import annotations

import functools
import math
import re
from dataclasses import dataclass, field, replace
from typing import Container, Iterable, Iterator, Mapping, Sequence, Union

from remat_dsl.plan.units import round_gap, round_seconds

_NOT_IN_NAMES = re.compile(r"[^A-Za-z0-9_.]")


def plan_name(path: str) -> str:
    """A module path or parameter name as a plan name: characters a plan name cannot hold
    (PyTorch allows any but `.` in a module's name: torchvision's RegNet has `block1-0`)
    become `_` (`trunk_output.block1.block1-0.proj` -> `trunk_output.block1.block1_0.proj`).
    The generated module maps the model's own names the same way."""
    return _NOT_IN_NAMES.sub("_", path)


COMPUTE_STREAM = "compute"
D2H_STREAM = "d2h"
H2D_STREAM = "h2d"
HOST_STREAM = "host"  # the host CPU's optimizer updates (NOTE: [Optimizer in the step] in remat_dsl.plan.optimizer)
STREAMS = (COMPUTE_STREAM, D2H_STREAM, H2D_STREAM, HOST_STREAM)


@dataclass(frozen=True)
class Verb:
    """One instruction verb, declared once (its meaning: NOTE: [Instruction semantics]).

    Every stage that acts on instructions dispatches through its own table keyed by the
    verb's name (the replay's `HANDLERS`, codegen's `EMITTERS`, `remat show`'s `RUG`), and
    tests/test_instructions.py fails when one of them lacks a verb of INSTRUCTIONS or has
    another; the other stages ask the fields below instead of listing verbs.

    operand: "op" (the target is an operation's name), "tensor" (a tensor's name) or
    "parameter" (a trainable parameter's name).
    stream: the stream the instruction is issued on, one of STREAMS (the printer omits it,
    the parser infers it).  runs_op: it executes its op (and allocates the op's outputs).
    transfer: it is part of a host transfer (an offload, a prefetch, or a wait for one).
    aliases: other words for it that the parser names in its hint (`free` -> `delete`).
    """

    name: str
    operand: str
    stream: str
    runs_op: bool = False
    transfer: bool = False
    aliases: tuple[str, ...] = ()


INSTRUCTIONS: dict[str, Verb] = {
    verb.name: verb
    for verb in (
        Verb("compute", "op", COMPUTE_STREAM, runs_op=True, aliases=("run", "exec", "execute")),
        Verb("recompute", "op", COMPUTE_STREAM, runs_op=True, aliases=("remat", "rerun", "rematerialize")),
        Verb("delete", "tensor", COMPUTE_STREAM, aliases=("free", "del", "drop", "release")),
        Verb("offload", "tensor", D2H_STREAM, transfer=True, aliases=("evict", "spill", "store", "save")),
        Verb("prefetch", "tensor", H2D_STREAM, transfer=True, aliases=("load", "fetch", "restore", "reload")),
        Verb("wait", "tensor", COMPUTE_STREAM, transfer=True, aliases=("sync", "synchronize", "join")),
        Verb("update", "parameter", COMPUTE_STREAM, aliases=("step", "optimize", "apply")),
        Verb("host_update", "parameter", HOST_STREAM, aliases=("cpu_update", "update_on_host", "host_step")),
        Verb("prefetch_states", "parameter", H2D_STREAM, transfer=True, aliases=("load_states", "fetch_states")),
        Verb("offload_states", "parameter", D2H_STREAM, transfer=True, aliases=("store_states", "evict_states")),
        Verb("wait_states", "parameter", COMPUTE_STREAM, transfer=True, aliases=("sync_states", "join_states")),
    )
}
VERBS = tuple(INSTRUCTIONS)
VERB_STREAM = {verb.name: verb.stream for verb in INSTRUCTIONS.values()}
_RUNS_OP = frozenset(verb.name for verb in INSTRUCTIONS.values() if verb.runs_op)
_TRANSFERS = frozenset(verb.name for verb in INSTRUCTIONS.values() if verb.transfer)

FORWARD = "forward"
BACKWARD = "backward"

BUDGET_COUNTS = "activations, temporaries, outputs, gradients"
# With an optimizer in the step (NOTE: [Optimizer in the step]): the device's optimizer
# states are held through the whole step, and each update's temporaries while it runs.
BUDGET_COUNTS_OPTIMIZER = "parameters on the device, " + BUDGET_COUNTS + ", optimizer states and updates"


@dataclass(frozen=True)
class Span:
    """Where a construct starts in its source file: 1-based line and column."""

    line: int
    col: int


def _span() -> Span | None:
    return field(default=None, compare=False, repr=False)


# ---------------------------------------------------------------------------
# Arguments of operations
# ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Ref:
    """A reference to a named value (`%name`): input, parameter, buffer, tensor, tangent."""

    name: str
    span: Span | None = _span()


@dataclass(frozen=True)
class Sym:
    """A torch constant written as a dotted name, e.g. `torch.float32`, `torch.strided`."""

    name: str


@dataclass(frozen=True)
class Call:
    """A call inside an argument: a view (`aten.view.default(%x, [4, 8])`), `torch.device("cpu")`,
    or a number read from a one-element tensor (`aten._local_scalar_dense.default(%t)`, NOTE:
    [Scalar reads] in remat_dsl/plan/operators.py).

    They allocate nothing; code generation inlines them where they are used.
    """

    target: str
    args: tuple["Arg", ...] = ()
    kwargs: tuple[tuple[str, "Arg"], ...] = ()


@dataclass(frozen=True)
class ListArg:
    """A Python list of arguments: `[4, 8]`, `[%a, %b]`."""

    items: tuple["Arg", ...] = ()


@dataclass(frozen=True)
class TupleArg:
    """A Python tuple of arguments (used for model outputs): `(%a, %b)`."""

    items: tuple["Arg", ...] = ()


def is_structure(arg: "Arg") -> bool:
    """A Call in `outputs` that builds the model's output object from keyword fields:
    `dict(loss=%a, logits=%b)` or `transformers.modeling_outputs.CausalLMOutput(...)`
    (a view call has positional arguments and an operator target)."""
    return (
        isinstance(arg, Call) and not arg.args and not arg.target.startswith(("aten.", "torch.", "prims.", "operator."))
    )


@dataclass(frozen=True)
class SizeExpr:
    """An integer argument that follows the sizes that vary (NOTE: [Size expressions]):
    a sum of terms, each an integer coefficient times a product of size symbols (none for
    the constant), in the canonical order `canonical_terms` gives.

    terms: ((("B", "S"), 4), (("S",), 1), ((), -1)) is `4*B*S + S - 1`."""

    terms: tuple[tuple[tuple[str, ...], int], ...]

    def evaluate(self, sizes: Mapping[str, int]) -> int:
        """The value at `sizes` ({symbol: size}); raises KeyError for a symbol it lacks."""
        total = 0
        for symbols, coefficient in self.terms:
            value = coefficient
            for symbol in symbols:
                value *= sizes[symbol]
            total += value
        return total

    def symbols(self) -> tuple[str, ...]:
        """The size symbols it names, sorted."""
        return tuple(sorted({s for symbols, _ in self.terms for s in symbols}))


def canonical_terms(terms: Iterable[tuple[Sequence[str], int]]) -> tuple[tuple[tuple[str, ...], int], ...]:
    """`terms` ((symbols, coefficient) pairs) summed into SizeExpr's canonical order: like
    terms added, zero terms left out, the highest degree first, then by symbol names."""
    summed: dict[tuple[str, ...], int] = {}
    for symbols, coefficient in terms:
        key = tuple(sorted(symbols))
        summed[key] = summed.get(key, 0) + coefficient
    kept = [(symbols, c) for symbols, c in summed.items() if c != 0]
    return tuple(sorted(kept, key=lambda term: (-len(term[0]), term[0])))


# NOTE: [Size expressions]
# A plan whose inputs declare size symbols (NOTE: [Sizes that vary]) may hold integer
# arguments computed from those sizes: `aten.view.default(%x, [B*S, 64])`, `aten.arange
# .start(0, S)`, `aten.slice.Tensor(%m, 1, 0, S - 1)`.  Capture finds them by tracing the
# step at several sizes (NOTE: [Size probe] in remat_dsl/capture/shapes.py); the plan
# writes each as a polynomial over the symbols with integer coefficients, one canonical
# text (`4*B*S + S - 1`: the highest degree first, a coefficient before its symbols), and
# the parser takes `+`, `-`, `*`, integers and declared symbols only: an expression is a
# tree of checked names and numbers, never text to evaluate.  Every size and cost of the
# plan is the one at the symbols' bounds; the generated module evaluates each expression
# at the sizes of its call's inputs (`render_arg` in remat_dsl/codegen/generate.py).

# int, float (inf, -inf, nan allowed), bool, None and str are plain Python constants.
Arg = Union[Ref, Sym, Call, ListArg, TupleArg, SizeExpr, int, float, bool, None, str]


def iter_refs(arg: Arg) -> Iterator[Ref]:
    """Every Ref inside an argument tree (Call, ListArg, TupleArg), left to right."""
    if isinstance(arg, Ref):
        yield arg
    elif isinstance(arg, Call):
        for item in arg.args:
            yield from iter_refs(item)
        for _, item in arg.kwargs:
            yield from iter_refs(item)
    elif isinstance(arg, (ListArg, TupleArg)):
        for item in arg.items:
            yield from iter_refs(item)


# ---------------------------------------------------------------------------
# The FB-graph
# ---------------------------------------------------------------------------


@dataclass(frozen=True)
class ValueDecl:
    """An input, parameter, buffer or tangent: resident for the whole step, never scheduled.

    shape: tuple of ints; dtype: torch dtype name without `torch.` (`float32`).
    kind: "input" | "parameter" | "buffer" | "tangent".
    """

    kind: str
    name: str
    shape: tuple[int, ...]
    dtype: str
    comments: tuple[str, ...] = ()
    span: Span | None = _span()
    dims: tuple[str | None, ...] = ()  # NOTE: [Sizes that vary]: a size symbol per dim (None: fixed), () if none


# NOTE: [Sizes that vary]
# A plan made with `remat plan --dynamic` serves every size up to the one its
# sample inputs have.  The inputs declare the size symbol with its bound (`x
# float32[B <= 16, 32]`) and the tangents name it (`grad_output.0  float32[B, 8]`);
# `ValueDecl.shape` keeps the largest sizes, at which every tensor, cost and peak of the
# plan is given, and `ValueDecl.dims` names the symbol of each dim that varies.  Every op
# of such a plan computes the same thing at every size up to the bound: capture checks
# that the ops' arguments follow the sizes as size expressions (NOTE: [Size probe] in
# remat_dsl/capture/shapes.py, NOTE: [Size expressions]), so a smaller size allocates no
# more than the largest (every tensor of an op is as large or smaller) and the plan's peak
# holds below it.


def size_symbols(decls: Sequence[ValueDecl]) -> dict[str, int]:
    """The size symbols `decls` declare, with their bounds (NOTE: [Sizes that vary])."""
    return {sym: d.shape[i] for d in decls for i, sym in enumerate(d.dims) if sym is not None}


@dataclass(frozen=True)
class TensorDecl:
    """One allocation made by an operation: output `index` of `producer`.

    nbytes: bytes of its storage (exactly shape x dtype size for contiguous tensors).
    """

    name: str
    shape: tuple[int, ...]
    dtype: str
    nbytes: int
    producer: str
    index: int = 0
    comments: tuple[str, ...] = ()
    span: Span | None = _span()


@dataclass(frozen=True)
class Op:
    """One allocating operation of the FB-graph.

    phase: "forward" | "backward".  target: `aten.NAME.OVERLOAD`.
    outputs: the tensor names it allocates, in output order (see NOTE: [Names]).
    time_us: measured median duration (microseconds).  temp_bytes: memory it allocates
    and frees while it runs, above its outputs (bytes).  random: it draws from the RNG.
    """

    name: str
    phase: str
    target: str
    args: tuple[Arg, ...]
    kwargs: tuple[tuple[str, Arg], ...]
    outputs: tuple[str, ...]
    time_us: int
    temp_bytes: int = 0
    random: bool = False
    comments: tuple[str, ...] = ()
    span: Span | None = _span()


def op_refs(op: Op) -> tuple[Ref, ...]:
    """Every Ref in an op's positional and keyword arguments, left to right.

    Computed once per op and kept on it (ops are frozen, and the attribute is not a field:
    equality, repr and so cache keys do not see it): the simulation and the lowering ask
    for them hundreds of thousands of times in one plan (a third of a warm `remat plan`
    of a 445-op Llama went to walking argument trees)."""
    refs = op.__dict__.get("_refs")
    if refs is None:
        refs = tuple(ref for arg in (*op.args, *(item for _, item in op.kwargs)) for ref in iter_refs(arg))
        object.__setattr__(op, "_refs", refs)
    return refs


@dataclass(frozen=True)
class Gradient:
    """The gradient autograd receives for a trainable parameter (`value` is None when it
    gets none).

    NOTE: [Frozen and unused parameters]
    The gradients section has one line per parameter that required grad when the model
    was captured, and none for a frozen one (`requires_grad` False).  A trainable
    parameter the loss does not reach (BigBird's pooler under a classification head, whose
    output the head discards) is `PARAM = None`: autograd leaves its `.grad` None, as
    eager does.  The generated module refuses a parameter that requires grad but has no
    line (the plan computes no gradient for it), and takes one with `= None` as eager
    would: the two cases are written differently so that a parameter the loss does not
    reach is not refused as "planned with it frozen".
    """

    parameter: str
    value: Arg
    span: Span | None = _span()


@dataclass(frozen=True)
class BufferUpdate:
    """Buffer `buffer` takes the value of tensor `tensor` when its producer first runs."""

    buffer: str
    tensor: str
    span: Span | None = _span()


@dataclass(frozen=True)
class ConstantInput:
    """A forward argument that is not a tensor, as captured (`use_cache = False`): a constant
    of the graph.  The generated module refuses a call that passes another value.

    value: None, bool, int, float or str.
    """

    name: str
    value: "Arg"
    comments: tuple[str, ...] = ()
    span: Span | None = _span()


AUTOCAST_DTYPES = ("bfloat16", "float16")


@dataclass(frozen=True)
class Autocast:
    """`autocast  bfloat16` in the header: the graph was captured under
    `torch.autocast(device, dtype=torch.DTYPE)`, so its ops hold the casts autocast made
    (NOTE: [Autocast] in remat_dsl.capture.fx).  Sealed by the digest with the graph.

    dtype: one of AUTOCAST_DTYPES (the verifier refuses others).
    """

    dtype: str
    span: Span | None = _span()


@dataclass(frozen=True)
class Graph:
    """The captured FB-graph: everything code generation needs besides the schedule.

    outputs: what the model's forward returns (a Ref, Call of a view, or a Tuple/ListArg
    tree of them), in the same structure as eager PyTorch returns it.
    autocast: the autocast state it was captured under (printed in the header), None
    for none.
    """

    inputs: tuple[ValueDecl, ...]
    parameters: tuple[ValueDecl, ...]
    buffers: tuple[ValueDecl, ...]
    tangents: tuple[ValueDecl, ...]
    tensors: tuple[TensorDecl, ...]
    ops: tuple[Op, ...]
    outputs: Arg
    gradients: tuple[Gradient, ...]
    updates: tuple[BufferUpdate, ...] = ()
    constants: tuple[ConstantInput, ...] = ()
    autocast: Autocast | None = None

    # NOTE: [Graph index]: the indexes every stage reads (solvers, lowering, polish, replay,
    # codegen), built once per graph on first use; a Graph is immutable, so they never go
    # stale, and they are not fields (equality and the printer ignore them).

    @functools.cached_property
    def op_by_name(self) -> dict[str, Op]:
        """{op name: Op}, in the graph's order (NOTE: [Graph index]).  Read it, never change it."""
        return {op.name: op for op in self.ops}

    @functools.cached_property
    def tensor_by_name(self) -> dict[str, TensorDecl]:
        """{tensor name: TensorDecl} (NOTE: [Graph index]).  Read it, never change it."""
        return {t.name: t for t in self.tensors}

    @functools.cached_property
    def producer(self) -> dict[str, str]:
        """{tensor name: the name of the op that makes it} (NOTE: [Graph index])."""
        return {t.name: t.producer for t in self.tensors}

    @functools.cached_property
    def nbytes(self) -> dict[str, int]:
        """{tensor name: its bytes} (NOTE: [Graph index]).  Read it, never change it."""
        return {t.name: t.nbytes for t in self.tensors}

    @functools.cached_property
    def readers(self) -> dict[str, frozenset[str]]:
        """{value name: the names of the ops whose arguments read it} (NOTE: [Graph index])."""
        found: dict[str, set[str]] = {}
        for op in self.ops:
            for ref in op_refs(op):
                found.setdefault(ref.name, set()).add(op.name)
        return {name: frozenset(ops) for name, ops in found.items()}


# ---------------------------------------------------------------------------
# The schedule
# ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Instruction:
    """One line of a forward or backward section: `VERB TARGET on STREAM`.

    verb: one of VERBS (INSTRUCTIONS).  target: an operation name (a verb whose operand is
    "op": compute, recompute) or a tensor name.
    comments: full-line comments just above it; trailing: the comment after it, if any.
    """

    verb: str
    target: str
    stream: str
    comments: tuple[str, ...] = ()
    trailing: str | None = None
    span: Span | None = _span()

    @property
    def runs_op(self) -> bool:
        """Whether it executes its op (Verb.runs_op: compute, recompute); False for a verb
        that is not in INSTRUCTIONS (the replay refuses those)."""
        return self.verb in _RUNS_OP

    @property
    def is_transfer(self) -> bool:
        """Whether it is part of a host transfer (Verb.transfer: offload, prefetch, wait)."""
        return self.verb in _TRANSFERS


@dataclass(frozen=True)
class Header:
    """What the plan is for and what the tools predicted for it.

    budget, peak_bytes: bytes.  time_us, compute_us, recompute_us: microseconds.
    bandwidth: host<->device bytes per second.  peak_at: "forward:K" or "backward:K",
    the 1-based index of the instruction where the peak occurs.
    costs: what predicted the op times and temporaries when they were not measured on the
    device (`roofline h100-sxm`, `roofline cpu, fake tensors`: remat plan --device,
    --fake); None for measured costs (and in older plans).
    solver: the solver and its settings, e.g. "rotor slots=500".
    status: "optimal", "feasible", "baseline" (autograd), "heuristic" (checkpoint-sqrt) or "hand-written".
    A MILP solver stopped by its time limit before proving optimality writes "feasible"
    with a `gap`.

    gap: the relative MIP gap of the solution as a fraction (0.0123 is 1.23%), None for
    solvers that report none.  Stored rounded to 6 decimals of the fraction (4 decimals
    of the percentage); printed `gap  1.23%` (2 to 4 decimals).
    optimizer: the optimizer the step ends with, as its header text (`adamw lr=0.001 ...`,
    remat_dsl.plan.optimizer), None for a plan that ends at the gradients.
    device_update, host_update: bytes of parameter the device and the host update per
    second; host_update_overhead_us: the host's management time per step (thesis ch. 4,
    eq. 4.23's H).  Printed on the `update-speed` line, only with an optimizer.
    solve_seconds: wall time spent solving, in seconds; None when unknown (hand-written
    plans, older plans).  Stored rounded to 0.1 s; printed `solve-time  2.4 s`.  It is
    the one header field that differs between two runs with the same model, profile and
    budget (`printer.without_solve_time`).
    Both are rounded at construction (`Header(...)`, `dataclasses.replace`), so that
    `parse(print(plan)) == plan` holds exactly; -0.0 is stored as 0.0.  The printer
    refuses negative, infinite and NaN values.
    """

    model: str
    device: str
    budget: int
    counts: str
    solver: str
    status: str
    peak_bytes: int
    peak_at: str
    time_us: int
    compute_us: int
    recompute_us: int
    bandwidth: int
    comments: tuple[str, ...] = ()
    gap: float | None = None
    solve_seconds: float | None = None
    costs: str | None = None
    optimizer: str | None = None
    device_update: int = 0
    host_update: int = 0
    host_update_overhead_us: int = 0

    def __post_init__(self) -> None:
        if self.gap is not None:
            object.__setattr__(self, "gap", round_gap(self.gap))
        if self.solve_seconds is not None:
            object.__setattr__(self, "solve_seconds", round_seconds(self.solve_seconds))


CONSTRAINT_KINDS = ("keep", "recompute", "offload", "no-offload", "budget")


@dataclass(frozen=True)
class Constraint:
    """One line of the constraint language: `KIND "PATTERN"` or `budget SIZE`.

    kind: one of CONSTRAINT_KINDS.  pattern: a glob over tensor names
    (`transformer.h.*.attn.*`), None for `budget`.  size: bytes, for `budget` only.
    keep: no matching tensor is recomputed; recompute: matching tensors are not kept from
    forward to backward but recomputed before their backward use; offload: matching saved
    tensors go to host memory between their forward and backward uses; no-offload: they
    never do; budget: the budget when `--budget` is not given.
    """

    kind: str
    pattern: str | None = None
    size: int | None = None
    comments: tuple[str, ...] = ()
    span: Span | None = _span()
    source: str | None = field(default=None, compare=False, repr=False)  # "FILE:LINE" for messages


@dataclass(frozen=True)
class Digest:
    """The seal of a plan's graph sections as a file states it (remat_dsl.plan.digest).

    graph: `sha256:` and 32 hex digits over every item of the graph sections.
    items: the 12-bit hash of each item, base64url, one string per `items` line.
    """

    graph: str
    items: tuple[str, ...]
    span: Span | None = _span()


@dataclass(frozen=True)
class Plan:
    """A complete plan: header, constraints, FB-graph, forward and backward sections.

    digest: the `digest` section as read from a file (None when the file has none, or
    for a plan made in code).  It is what the file claims, not part of the plan's value:
    the printer always writes the digest of `graph`, and the verifier compares the two
    (NOTE: [Graph digest] in remat_dsl.plan.digest).
    section_spans: (section name, where its name is) for a parsed plan, for messages.
    """

    header: Header
    graph: Graph
    forward: tuple[Instruction, ...]
    backward: tuple[Instruction, ...]
    comments: tuple[str, ...] = ()  # comment lines at the end of the file
    constraints: tuple[Constraint, ...] = ()
    digest: Digest | None = field(default=None, compare=False, repr=False)
    section_spans: tuple[tuple[str, Span], ...] = field(default=(), compare=False, repr=False)

    def section_span(self, name: str) -> Span | None:
        """Where section `name` starts in the parsed file, or None."""
        return dict(self.section_spans).get(name)


# ---------------------------------------------------------------------------
# Queries every stage asks
# ---------------------------------------------------------------------------


def refs_in(arg: Arg) -> list[str]:
    """Names referred to (`%name`) anywhere inside an argument tree."""
    return [ref.name for ref in iter_refs(arg)]


def op_predecessors(graph: Graph) -> list[list[int]]:
    """For each op (graph order), the sorted indices of the ops whose outputs it reads: the
    edges of the FB-graph as a DAG over ops (whole-graph solvers: twremat, moccasin)."""
    index = {op.name: i for i, op in enumerate(graph.ops)}
    producer = {t.name: index[t.producer] for t in graph.tensors}
    names = set(producer)
    return [sorted({producer[t] for t in op_uses(op, names)}) for op in graph.ops]


def buffer_readers(graph: Graph) -> set[str]:
    """The ops whose results depend on the value of a buffer the forward updates: each runs
    once, before the update, since the generated module writes the buffer's new value where
    the forward computes it (NOTE: [Stateful layers] in remat_dsl/capture/stateful.py).
    Batch norm in training mode reads its running statistics only to make their new values,
    which only that first run writes: its recompute is left free."""
    updated = {u.buffer for u in graph.updates}
    if not updated:
        return set()
    return {
        op.name for op in graph.ops if any(ref.name in updated for ref in op_refs(op)) and not _training_batch_norm(op)
    }


def _training_batch_norm(op: Op) -> bool:
    """An aten batch norm (`native_batch_norm`, `_native_batch_norm_legit_functional`, ...)
    with `training=True`, its sixth argument: its output reads the batch's statistics."""
    return "batch_norm" in op.target and len(op.args) > 5 and op.args[5] is True


def op_uses(op: Op, tensors: Container[str]) -> list[str]:
    """Tensor names (allocations, not parameters/inputs) that `op` reads, in order, unique."""
    return list(dict.fromkeys(ref.name for ref in op_refs(op) if ref.name in tensors))


# Bytes per element of the dtypes a captured graph may declare (ValueDecl.dtype).
DTYPE_ITEMSIZE = {
    "bool": 1,
    "uint8": 1,
    "int8": 1,
    "float8_e4m3fn": 1,
    "float8_e4m3fnuz": 1,
    "float8_e5m2": 1,
    "float8_e5m2fnuz": 1,
    "int16": 2,
    "uint16": 2,
    "float16": 2,
    "bfloat16": 2,
    "int32": 4,
    "uint32": 4,
    "float32": 4,
    "complex32": 4,
    "int64": 8,
    "uint64": 8,
    "float64": 8,
    "complex64": 8,
    "complex128": 16,
}


def gradient_zeros(graph: Graph) -> dict[str, int]:
    """op name -> bytes of the distinct tangents (`grad_output.k`) its arguments refer to,
    for the ops that read one: the zeros the generated module makes for that op when the
    caller gives no gradient for the output, which capture counts among the op's
    temporaries (NOTE: [Gradient zeros] in remat_dsl.capture.fbgraph).  Empty for a graph
    with one tangent: autograd runs the backward only when an output has a gradient, so a
    step with one output to differentiate always gets its gradient.  A tangent of a dtype
    not in DTYPE_ITEMSIZE counts 0 bytes (the simulation refuses it at its line)."""
    if len(graph.tangents) < 2:
        return {}
    sizes = {t.name: math.prod(t.shape) * DTYPE_ITEMSIZE.get(t.dtype, 0) for t in graph.tangents}
    zeros = {}
    for op in graph.ops:
        read = {ref.name for ref in op_refs(op)} & sizes.keys()
        if read:
            zeros[op.name] = sum(sizes[t] for t in read)
    return zeros


def with_gradient_zeros(graph: Graph, sign: int = 1) -> Graph:
    """`graph` with each op's temp_bytes raised by `gradient_zeros` (sign -1: lowered, to
    write the measured costs alone to a profile file)."""
    zeros = gradient_zeros(graph)
    ops = tuple(
        replace(op, temp_bytes=op.temp_bytes + sign * zeros[op.name]) if op.name in zeros else op for op in graph.ops
    )
    return replace(graph, ops=ops)


def pinned_tensors(graph: Graph) -> set[str]:
    """Tensors the plan may not delete: model outputs and parameter gradients."""
    names = set(refs_in(graph.outputs))
    for grad in graph.gradients:
        names.update(refs_in(grad.value))
    return names
