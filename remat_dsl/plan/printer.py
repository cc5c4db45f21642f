"""The one canonical printer of plans: `print_plan(plan) -> str`.

`remat_dsl.plan.parser.parse(print_plan(plan)) == plan` for every plan the printer accepts,
and `print_plan(parse(text)) == text` for every text the printer produced.

NOTE: [Canonical layout]
- Comment lines of the header (the `comments` of `Header`) come first, then
  `remat-plan 2`.  Sections follow in a fixed order, separated by one blank line:
  header, constraints, forward, backward (the schedule, what people read and edit), then
  the FB-graph: inputs, parameters, buffers, tangents, tensors, ops, outputs, gradients,
  updates, and last the digest (remat_dsl.plan.digest: always the digest of the plan's
  graph, whatever the file it was read from said).  Empty constraints, buffers, tangents
  and updates sections are left out; the other sections are always printed (an empty
  one is just its name).  The comments of `Plan.comments` close the file after a blank
  line.  The file ends with a newline; no line has trailing whitespace.
- Section names start at column 1, items are indented by two spaces.  Within one
  section every column is padded to its widest cell; columns are separated by two
  spaces (one between a number and its unit).  Numbers are right-aligned.  No line is
  longer than LINE_WIDTH (120) characters, but for a single name longer than that: an
  argument that does not fit goes on over continuation lines (`layout`).
- Header keys are padded to HEADER_KEY_WIDTH.  `device` is a bare word when it looks
  like one (`cpu`, `cuda:0`), a quoted string otherwise.  `budget` and `peak` are
  written the one way sizes are shown to people, `21.89 MiB (22955008 B)`
  (remat_dsl.plan.units.format_bytes); the parser checks that the two figures agree.
- Value sections: `NAME  DTYPE[D0, D1]` (`float32[]` for scalars).
- tensors: `NAME  [SHAPE]  DTYPE  SIZE  [PRODUCER]`, PRODUCER (`op`, or `op:k` for
  output k >= 1, TensorDecl.index) only when the name does not say it.  ops:
  `NAME = TARGET(ARGS)  TIME  TEMP  PHASE  [random]`, the call wrapped within its
  column and the costs after its last line.  Both tables open with a heading comment
  (TENSOR_HEADING, OP_HEADING) that the parser recognises and drops.  An op's `outputs`
  are not written: they are the tensors whose producer it is, in output order, so the
  printer refuses an op whose `outputs` disagree with the table.
- outputs: one argument.  gradients: `PARAM = ARG`, trainable parameters only (NOTE:
  [Frozen and unused parameters] in remat_dsl.plan.ir); updates: `BUFFER = %TENSOR`, names
  padded to the widest.
- forward/backward: `VERB  TARGET  # trailing`; the verb says the stream (ir.VERB_STREAM).
- A comment is written `# TEXT` (`#` alone for empty text); full-line comments go
  above their item, at the item's indentation.

Units: NOTE: [Units] in remat_dsl.plan.units.  The header's optional `gap` and
`solve-time` lines come right after `status` and are left out when the field is None.

Printing raises ValueError for a plan that could not be read back exactly (a name
that is not a dotted identifier, a comment with a line break, ...).
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterable, Sequence

from remat_dsl.plan import ir
from remat_dsl.plan.digest import digest_of
from remat_dsl.plan.units import (
    format_bandwidth,
    format_bytes,
    format_duration,
    format_gap,
    format_seconds,
    format_size,
    size_parts,
)

FORMAT_VERSION = 2
HEADER_KEY_WIDTH = 12
LINE_WIDTH = 120  # no canonical line is longer, but for a single name that is
CONTINUATION = 4  # extra indentation of each level of a wrapped argument
INDENT = "  "
GAP = "  "

STATUSES = ("optimal", "feasible", "baseline", "heuristic", "hand-written")
SOLVE_TIME_KEY = "solve-time"
SOLVE_TIME_UNIT = "s"
PHASES = (ir.FORWARD, ir.BACKWARD)
RESERVED = ("None", "True", "False", "inf", "nan")

TENSOR_HEADING = ("# name", "shape", "dtype", "size", "")
TENSOR_HEADING_V1 = ("# name", "shape", "dtype", "size", "", "producer")
OP_HEADING = ("# name = target(args)", "time", "", "temp", "", "phase", "")

NAME_RE = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.]*(:[0-9]+)?")  # `0.weight`: nn.Sequential's children
CALL_NAME_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_.]*")
BARE_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_.:\-]*")
PEAK_AT_RE = re.compile(r"(forward|backward):[0-9]+")
SYM_PREFIX = "torch."


# ---------------------------------------------------------------------------
# Numbers with units
# ---------------------------------------------------------------------------


def without_solve_time(text: str) -> str:
    """Canonical plan text less its header's `solve-time` line (the one line that may
    differ between two runs of a deterministic solver); other text is returned as is."""
    head, sep, rest = text.partition("\n\n")  # `remat-plan 1` and the comments above it
    header, sep2, tail = rest.partition("\n\n")
    if not header.startswith("header\n"):
        return text
    prefix = f"{INDENT}{SOLVE_TIME_KEY:<{HEADER_KEY_WIDTH}}"
    lines = [line for line in header.split("\n") if not line.startswith(prefix)]
    return head + sep + "\n".join(lines) + sep2 + tail


# ---------------------------------------------------------------------------
# Names, strings, comments
# ---------------------------------------------------------------------------


def _name(name: str) -> str:
    if not isinstance(name, str) or not NAME_RE.fullmatch(name):
        raise ValueError(f"cannot print name {name!r}: names are dotted identifiers (`a.b_1:2`)")
    return name


def _plain_name(name: str, what: str) -> str:
    """A name without a `:k` suffix (op names, dtypes)."""
    if ":" in _name(name):
        raise ValueError(f"cannot print {what} {name!r}: no `:k` suffix allowed")
    return name


def _call_name(name: str, what: str) -> str:
    """A name inside arguments: starts with a letter, not one of the argument keywords (None, inf, ...)."""
    if _plain_name(name, what) in RESERVED or not CALL_NAME_RE.fullmatch(name):
        raise ValueError(f"cannot print {what} {name!r}: it is a keyword or does not start with a letter")
    return name


def _string(text: str) -> str:
    return json.dumps(text, ensure_ascii=False)


def _comment(text: str) -> str:
    if "\n" in text or "\r" in text or text != text.rstrip():
        raise ValueError(f"cannot print comment {text!r}: no line breaks or trailing whitespace")
    return f"# {text}" if text else "#"


def _comment_lines(texts: Iterable[str], indent: str = INDENT) -> list[str]:
    return [indent + _comment(text) for text in texts]


# ---------------------------------------------------------------------------
# Arguments
# ---------------------------------------------------------------------------


def format_arg(arg: ir.Arg) -> str:
    """One argument as written in `ops`, `outputs` and `gradients`."""
    if arg is None or isinstance(arg, bool):
        return repr(arg)
    if isinstance(arg, int):
        return str(arg)
    if isinstance(arg, float):
        return _float(arg)
    if isinstance(arg, str):
        return _string(arg)
    if isinstance(arg, ir.Ref):
        return "%" + _name(arg.name)
    if isinstance(arg, ir.Sym):
        return _sym(arg.name)
    if isinstance(arg, ir.Call):
        return format_call(arg.target, arg.args, arg.kwargs)
    if isinstance(arg, ir.ListArg):
        return "[" + ", ".join(format_arg(item) for item in arg.items) + "]"
    if isinstance(arg, ir.TupleArg):
        return _tuple(arg.items)
    if isinstance(arg, ir.SizeExpr):
        return format_size_expr(arg)
    raise ValueError(f"cannot print argument {arg!r}")


def format_size_expr(expr: ir.SizeExpr) -> str:
    """The canonical text of a size expression (NOTE: [Size expressions] in
    remat_dsl/plan/ir.py): `4*B*S + S - 1`, `0` for no terms."""
    text = ""
    for symbols, coefficient in expr.terms:
        for symbol in symbols:
            if not symbol.isidentifier():
                raise ValueError(f"cannot print size symbol {symbol!r}")
        magnitude = abs(coefficient)
        leading = not text and coefficient < 0  # `-1*B`: the grammar has no unary minus
        factors = ([str(magnitude)] if magnitude != 1 or not symbols or leading else []) + list(symbols)
        term = "*".join(factors)
        if not text:
            text = term if coefficient > 0 else "-" + term
        else:
            text += (" + " if coefficient > 0 else " - ") + term
    return text or "0"


def _float(x: float) -> str:
    if math.isnan(x):
        return "nan"
    if math.isinf(x):
        return "inf" if x > 0 else "-inf"
    return repr(x)


def _sym(name: str) -> str:
    if not name.startswith(SYM_PREFIX) or ":" in _name(name):
        raise ValueError(f"cannot print symbol {name!r}: symbols are `torch.NAME`")
    return name


def _tuple(items: Sequence[ir.Arg]) -> str:
    if len(items) == 1:
        return f"({format_arg(items[0])},)"
    return "(" + ", ".join(format_arg(item) for item in items) + ")"


def format_call(target: str, args: Sequence[ir.Arg], kwargs: Sequence[tuple[str, ir.Arg]]) -> str:
    """`target(arg, ..., key=value, ...)`."""
    parts = [format_arg(arg) for arg in args]
    parts += [f"{_call_name(key, 'keyword')}={format_arg(value)}" for key, value in kwargs]
    return f"{_call_name(target, 'call target')}({', '.join(parts)})"


def _decl_shape(decl: ir.ValueDecl, declare: bool) -> str:
    """`[16, 32]`, or with size symbols (NOTE: [Sizes that vary] in remat_dsl/plan/ir.py)
    `[B <= 16, 32]` where `declare` (the inputs), `[B, 32]` elsewhere."""
    if not decl.dims:
        return _shape(decl.shape)
    _shape(decl.shape)  # the sizes are checked as for any shape
    parts = [
        str(size) if sym is None else (f"{sym} <= {size}" if declare else sym)
        for size, sym in zip(decl.shape, decl.dims, strict=True)
    ]
    return "[" + ", ".join(parts) + "]"


def _shape(shape: Sequence[int]) -> str:
    if any(not isinstance(d, int) or isinstance(d, bool) or d < 0 for d in shape):
        raise ValueError(f"cannot print shape {shape!r}: dimensions are integers >= 0")
    return "[" + ", ".join(str(d) for d in shape) + "]"


def _dtype(dtype: str) -> str:
    return _plain_name(dtype, "dtype")


# ---------------------------------------------------------------------------
# Layout
# ---------------------------------------------------------------------------


def _table(
    rows: Sequence[Sequence[str]],
    right: frozenset[int] = frozenset(),
    tight: frozenset[int] = frozenset(),
    cap: dict[int, int] | None = None,
) -> list[str]:
    """Aligned lines: each column padded to its widest cell (at most `cap[i]`).

    right: columns aligned right.  tight: columns preceded by one space, not two.
    """
    if not rows:
        return []
    cap = cap or {}
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    widths = [min(w, cap[i]) if i in cap else w for i, w in enumerate(widths)]
    lines = []
    for row in rows:
        cells = [c.rjust(w) if i in right else c.ljust(w) for i, (c, w) in enumerate(zip(row, widths))]
        line = cells[0] + "".join((" " if i in tight else GAP) + c for i, c in enumerate(cells) if i)
        lines.append((INDENT + line).rstrip())
    return lines


def _with_comments(items: Sequence, lines: Sequence[str]) -> list[str]:
    """Interleave each item's full-line comments above its printed line."""
    out: list[str] = []
    for item, line in zip(items, lines):
        out += _comment_lines(item.comments)
        out.append(line)
    return out


# ---------------------------------------------------------------------------
# Sections
# ---------------------------------------------------------------------------


def _header(h: ir.Header, autocast: ir.Autocast | None = None) -> list[str]:
    """The header's lines; `autocast` is the graph's (ir.Graph.autocast), printed after the device."""
    device = h.device if BARE_RE.fullmatch(h.device) else _string(h.device)
    if h.status not in STATUSES:
        raise ValueError(f"cannot print status {h.status!r}: one of {', '.join(STATUSES)}")
    if not PEAK_AT_RE.fullmatch(h.peak_at):
        raise ValueError(f"cannot print peak position {h.peak_at!r}: `forward:K` or `backward:K`")
    entries = [
        ("model", _string(h.model)),
        ("device", device),
        *([("autocast", autocast.dtype)] if autocast is not None else []),
        *([("costs", _string(h.costs))] if h.costs is not None else []),
        ("budget", format_bytes(h.budget)),
        ("counts", _string(h.counts)),
        ("solver", _string(h.solver)),
        ("status", h.status),
        *([("gap", format_gap(h.gap))] if h.gap is not None else []),
        *([(SOLVE_TIME_KEY, format_seconds(h.solve_seconds))] if h.solve_seconds is not None else []),
        ("peak", f"{format_bytes(h.peak_bytes)} at {h.peak_at}"),
        ("time", format_duration(h.time_us)),
        ("compute", format_duration(h.compute_us)),
        ("recompute", format_duration(h.recompute_us)),
        ("bandwidth", format_bandwidth(h.bandwidth)),
        *([("optimizer", _string(h.optimizer))] if h.optimizer is not None else []),
        *(
            [
                (
                    "update-speed",
                    f"device {format_bandwidth(h.device_update)}  host {format_bandwidth(h.host_update)}"
                    f"  overhead {format_duration(h.host_update_overhead_us)}",
                )
            ]
            if h.optimizer is not None
            else []
        ),
    ]
    return ["header"] + [f"{INDENT}{key + ' ':<{HEADER_KEY_WIDTH}}{value}" for key, value in entries]


def _values(title: str, decls: Sequence[ir.ValueDecl]) -> list[str]:
    rows = [[_name(d.name), _dtype(d.dtype) + _decl_shape(d, declare=title == "inputs")] for d in decls]
    return [title] + _with_comments(decls, _table(rows))


def _constants(constants: Sequence[ir.ConstantInput]) -> list[str]:
    """`  use_cache = False`: the forward's non-tensor arguments, after the tensor inputs."""
    return _with_comments(constants, [f"{INDENT}{_name(c.name)} = {format_arg(c.value)}" for c in constants])


def _producer(t: ir.TensorDecl) -> str:
    """`op` or `op:k`, or "" when the tensor's name says it (`op`, `op:k`: version 2)."""
    producer = _plain_name(t.producer, "producer")
    written = producer if t.index == 0 else f"{producer}:{t.index}"
    return "" if written == t.name else written


def _tensors(tensors: Sequence[ir.TensorDecl]) -> list[str]:
    rows = [[_name(t.name), _shape(t.shape), _dtype(t.dtype), *size_parts(t.nbytes), _producer(t)] for t in tensors]
    heading = TENSOR_HEADING_V1 if any(row[-1] for row in rows) else TENSOR_HEADING + ("",)
    lines = _table([heading, *rows], right=frozenset({3}), tight=frozenset({4}))
    return ["tensors"] + (lines[:1] + _with_comments(tensors, lines[1:]) if tensors else [])


def _op_costs(op: ir.Op) -> list[str]:
    if op.phase not in PHASES:
        raise ValueError(f"cannot print phase {op.phase!r} of op {op.name!r}")
    time, ms = format_duration(op.time_us).split()
    return [time, ms, *size_parts(op.temp_bytes), op.phase, "random" if op.random else ""]


def _ops(ops: Sequence[ir.Op]) -> list[str]:
    """`NAME = CALL  TIME  TEMP  PHASE  [random]`; a call too long for its column goes on
    over continuation lines (`layout`), the costs after its last line."""
    costs = _table([OP_HEADING[1:]] + [_op_costs(op) for op in ops], right=frozenset({0, 2}), tight=frozenset({1, 3}))
    costs = [line.removeprefix(INDENT) for line in costs]
    width = max(len(line) for line in costs)
    heads = [f"{_plain_name(op.name, 'op name')} = " for op in ops]
    calls = [ir.Call(op.target, op.args, op.kwargs) for op in ops]
    column = min(
        max((len(h) + len(format_arg(c)) for h, c in zip(heads, calls)), default=0),
        LINE_WIDTH - len(INDENT) - len(GAP) - width,
    )
    column = max(column, len(OP_HEADING[0]))
    out = [(INDENT + OP_HEADING[0].ljust(column) + GAP + costs[0]).rstrip()] if ops else []
    for op, head, call, cost in zip(ops, heads, calls, costs[1:]):
        lines = layout(call, INDENT + head, "", len(INDENT), len(INDENT) + column)
        out += _comment_lines(op.comments)
        out += lines[:-1] + [(lines[-1].ljust(len(INDENT) + column) + GAP + cost).rstrip()]
    return ["ops"] + out


def _assignments(title: str, pairs: Sequence[tuple[str, ir.Arg]]) -> list[str]:
    width = max((len(name) for name, _ in pairs), default=0)
    lines = [title]
    for name, value in pairs:
        padded = f"{INDENT}{_name(name):<{width}} = "
        if len(padded + format_arg(value)) > LINE_WIDTH and not isinstance(value, (ir.Call, ir.ListArg, ir.TupleArg)):
            padded = f"{INDENT}{name} = "  # a long name: no room to align it
        lines += layout(value, padded, "", len(INDENT), LINE_WIDTH)
    return lines


def layout(arg: ir.Arg, prefix: str, suffix: str, indent: int, width: int) -> list[str]:
    """`prefix + format_arg(arg) + suffix` on lines of at most `width` characters.

    A call, list or tuple too long for one line breaks after its opening bracket; its
    items follow on continuation lines CONTINUATION spaces deeper than `indent`, as many
    a line as fit, an item too long for a line of its own broken the same way; the
    closing bracket ends the last item (the grammar reads a line break after `(`, `[` or
    `,` as a space).  A single name longer than the width stays whole.
    """
    one = prefix + format_arg(arg) + suffix
    if len(one) <= width:
        return [one]
    if isinstance(arg, ir.Call):
        opener, closer = f"{_call_name(arg.target, 'call target')}(", ")"
        items = [("", a) for a in arg.args] + [(f"{_call_name(k, 'keyword')}=", v) for k, v in arg.kwargs]
    elif isinstance(arg, ir.ListArg):
        opener, closer, items = "[", "]", [("", a) for a in arg.items]
    elif isinstance(arg, ir.TupleArg):
        opener, closer = "(", ",)" if len(arg.items) == 1 else ")"
        items = [("", a) for a in arg.items]
    else:
        return [one]
    if not items:
        return [one]
    margin = " " * (indent + CONTINUATION)
    lines, current = [prefix + opener], margin
    for number, (key, item) in enumerate(items, 1):
        end = closer + suffix if number == len(items) else ","
        text = key + format_arg(item) + end
        joined = current + text if current == margin else f"{current} {text}"
        if len(joined) <= width:
            current = joined
            continue
        if current != margin:
            lines.append(current)
            current = margin
        if len(margin + text) <= width:
            current = margin + text
        else:
            *done, current = layout(item, margin + key, end, indent + CONTINUATION, width)
            lines += done
    return lines + [current]


def _instruction_row(ins: ir.Instruction) -> list[str]:
    """`VERB  TARGET  # trailing`: the verb says the stream (ir.VERB_STREAM)."""
    if ir.VERB_STREAM.get(ins.verb) != ins.stream:
        raise ValueError(f"cannot print `{ins.verb} {ins.target} on {ins.stream}`: see ir.VERB_STREAM")
    trailing = "" if ins.trailing is None else _comment(ins.trailing)
    return [ins.verb, _name(ins.target), trailing]


def _schedule(title: str, instructions: Sequence[ir.Instruction]) -> list[str]:
    lines = _table([_instruction_row(ins) for ins in instructions])
    return [title] + _with_comments(instructions, lines)


def _constraint_row(c: ir.Constraint) -> list[str]:
    if c.kind not in ir.CONSTRAINT_KINDS:
        raise ValueError(f"cannot print constraint kind {c.kind!r}")
    if c.kind == "budget":
        assert c.size is not None  # a budget constraint has its size in bytes
        return [c.kind, format_size(c.size)]
    assert c.pattern is not None  # every other kind has a pattern
    return [c.kind, _string(c.pattern)]


def _check_outputs(graph: ir.Graph) -> None:
    """Op.outputs is not printed: it must equal the tensors each op produces, by index."""
    produced: dict[str, list[ir.TensorDecl]] = {}
    for t in graph.tensors:
        produced.setdefault(t.producer, []).append(t)
    for op in graph.ops:
        derived = tuple(t.name for t in sorted(produced.get(op.name, []), key=lambda t: t.index))
        if derived != tuple(op.outputs):
            raise ValueError(f"op {op.name!r} lists outputs {op.outputs!r}, but the tensors table gives it {derived!r}")


def _sections(plan: ir.Plan) -> list[list[str]]:
    """Version 2: header, constraints, the schedule (forward, backward), then the FB-graph
    and its digest (NOTE: [Canonical layout])."""
    g = plan.graph
    sections = [_header(plan.header, g.autocast)]
    if plan.constraints:
        sections.append(
            ["constraints"] + _with_comments(plan.constraints, _table([_constraint_row(c) for c in plan.constraints]))
        )
    sections += [_schedule(ir.FORWARD, plan.forward), _schedule(ir.BACKWARD, plan.backward)]
    sections += [_values("inputs", g.inputs) + _constants(g.constants), _values("parameters", g.parameters)]
    sections += [
        _values(title, values) for title, values in (("buffers", g.buffers), ("tangents", g.tangents)) if values
    ]
    sections += [_tensors(g.tensors), _ops(g.ops), ["outputs"] + layout(g.outputs, INDENT, "", len(INDENT), LINE_WIDTH)]
    sections.append(_assignments("gradients", [(gr.parameter, gr.value) for gr in g.gradients]))
    if g.updates:
        sections.append(_assignments("updates", [(u.buffer, ir.Ref(u.tensor)) for u in g.updates]))
    sections.append(_digest(digest_of(g, plan.header)))
    return sections


def _digest(d: ir.Digest) -> list[str]:
    """The seal of the graph sections: always that of the plan's graph (NOTE: [Graph digest])."""
    return ["digest", f"{INDENT}graph  {d.graph}"] + [f"{INDENT}items  {chunk}" for chunk in d.items]


def print_plan(plan: ir.Plan) -> str:
    """The canonical text of `plan` (see NOTE: [Canonical layout]); raises ValueError."""
    _check_outputs(plan.graph)
    blocks = [_comment_lines(plan.header.comments, "") + [f"remat-plan {FORMAT_VERSION}"]]
    blocks += _sections(plan)
    if plan.comments:
        blocks.append(_comment_lines(plan.comments, ""))
    return "\n\n".join("\n".join(block) for block in blocks) + "\n"
