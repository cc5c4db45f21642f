"""Profile files: the measured costs of a model's operations as a reviewable text file.

`remat profile model.py -o model.profile` measures every operation once and writes its
duration and temporary memory; `remat plan model.py --profile model.profile` captures the
graph without timing it and takes those costs from the file instead, so a plan made from
a committed profile is the same, byte for byte, on every run, and a diff of the profile
shows exactly which costs someone changed.

NOTE: [Profile format]
::

    # comments (`#` to the end of the line) and blank lines are ignored
    remat-profile 1
    model   "tests/models/tiny_mlp.py"
    device  cpu
    torch   "2.13.0+cpu"
    input   x  float32[16, 32]

    ops
      # name                       time       temp
      fc1                       0.012 ms     0 B
      drop.bwd.threshold_backward  0.004 ms  4 KiB

- The first non-comment line is `remat-profile 1`.  Header lines follow, one key a line:
  `model` (the model spec, a JSON string), `device` (a bare word or a JSON string),
  `torch` (the torch version it was measured with, a JSON string) and one `input NAME
  DTYPE[SHAPE]` line per positional input of the model, in order.
- `ops` opens the table: one line per allocating operation of the FB-graph, `NAME  TIME
  TEMP`, in graph order.  TIME is a duration (`0.123 ms`, also `us` or `s`), exact to the
  microsecond; TEMP is a size (`4 KiB`, `1.5 MiB`, `12345 B`), exact to the byte.  The
  writer uses the plan printer's units (remat_dsl.plan.printer.format_duration, size_parts),
  so every value reads back exactly.
- Tensor sizes are not in the profile: they follow exactly from shapes, and the capture
  that `remat plan --profile` still runs computes them again.
"""

from __future__ import annotations

import functools
import json
import re
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from lark import Lark, Token, Transformer
from lark.exceptions import UnexpectedInput, VisitError

from remat_dsl.plan import ir, tables
from remat_dsl.plan.errors import PlanError
from remat_dsl.plan.units import DURATION_UNITS, EXACT_SIZE_UNITS, format_duration, scaled, size_parts

FORMAT_VERSION = 1
MAGIC = "remat-profile"
KEY_WIDTH = 8
TIME_WIDTH = 8  # digits of `12345.678`: wide enough that a changed time keeps the layout
TEMP_WIDTH = 8  # digits of `1023.999`
UNKNOWN_PATH = "<profile>"

_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.]*")
_BARE = re.compile(r"[A-Za-z_][A-Za-z0-9_.:\-]*")

RERUN = "the profile was made for another model or other input shapes: run `remat profile` again"


@dataclass(frozen=True)
class ProfileInput:
    """One positional input of the model as the profile recorded it."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    span: ir.Span | None = field(default=None, compare=False, repr=False)


@dataclass(frozen=True)
class ProfileOp:
    """The measured costs of one operation: microseconds and bytes."""

    name: str
    time_us: int
    temp_bytes: int
    span: ir.Span | None = field(default=None, compare=False, repr=False)


@dataclass(frozen=True)
class ProfileFile:
    """A parsed profile file; `path` and `source` locate errors in it."""

    model: str
    device: str
    torch: str
    inputs: tuple[ProfileInput, ...]
    ops: tuple[ProfileOp, ...]
    path: str | None = None
    source: str | None = None
    model_span: ir.Span | None = None
    ops_span: ir.Span | None = None


# ---------------------------------------------------------------------------
# Writing
# ---------------------------------------------------------------------------


def _shape(shape) -> str:
    return "[" + ", ".join(str(int(d)) for d in shape) + "]"


def _word(text: str) -> str:
    return text if _BARE.fullmatch(text) else json.dumps(text, ensure_ascii=False)


def write_profile(graph: ir.Graph, *, model: str, device: str, torch_version: str | None = None) -> str:
    """The text of the profile of `graph` (see NOTE: [Profile format])."""
    if torch_version is None:
        import torch

        torch_version = torch.__version__
    lines = [
        f"{MAGIC} {FORMAT_VERSION}",
        f"{'model':<{KEY_WIDTH}}{json.dumps(model, ensure_ascii=False)}",
        f"{'device':<{KEY_WIDTH}}{_word(device)}",
        f"{'torch':<{KEY_WIDTH}}{json.dumps(str(torch_version), ensure_ascii=False)}",
    ]
    width = max((len(v.name) for v in graph.inputs), default=0)
    for value in graph.inputs:
        lines.append(f"{'input':<{KEY_WIDTH}}{value.name:<{width}}  {value.dtype}{_shape(value.shape)}")
    rows = []
    for op in ir.with_gradient_zeros(graph, -1).ops:  # the measured costs (NOTE: [Gradient zeros] in fbgraph.py)
        if not _NAME.fullmatch(op.name):
            raise ValueError(f"cannot write op name {op.name!r} to a profile")
        number, unit = format_duration(op.time_us).split()
        rows.append((op.name, number, unit, *size_parts(op.temp_bytes)))
    name_width = max([len("# name")] + [len(r[0]) for r in rows])
    time_width = max([TIME_WIDTH] + [len(r[1]) for r in rows])
    temp_width = max([TEMP_WIDTH] + [len(r[3]) for r in rows])
    lines += ["", "ops", f"  {'# name':<{name_width}}  {'time':>{time_width}}     {'temp':>{temp_width}}".rstrip()]
    for name, number, unit, size, size_unit in rows:
        lines.append(
            f"  {name:<{name_width}}  {number:>{time_width}} {unit:<2}  {size:>{temp_width}} {size_unit}".rstrip()
        )
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------------------
# Reading
# ---------------------------------------------------------------------------


class _Builder(Transformer):
    """Builds a ProfileFile from the parse tree of grammar/profile.lark."""

    ops_span: ir.Span  # the `ops` line, set by read_profile before the transform

    def __init__(self, text: str, path: str | None):
        super().__init__()
        self.text, self.path = text, path

    def error(self, message: str, token: Token, length: int | None = None, hint: str | None = None) -> PlanError:
        assert token.line is not None and token.column is not None  # the parser keeps every token's position
        return PlanError(message, span=ir.Span(token.line, token.column), hint=hint, path=self.path or UNKNOWN_PATH,
                         source=self.text, length=len(token.value) if length is None else length)  # fmt: skip

    def magic(self, c):
        (version,) = c
        if version.value != str(FORMAT_VERSION):
            raise self.error(
                f"expected `{MAGIC} {FORMAT_VERSION}`",
                version,
                hint="a profile starts with `remat-profile 1`; write it with `remat profile MODEL -o FILE`",
            )
        return version

    def model(self, c):
        return ("model", _json_string(c[0], self), c[0])

    def torch(self, c):
        return ("torch", _json_string(c[0], self), c[0])

    def device(self, c):
        value = _json_string(c[0], self) if c[0].type == "STRING" else c[0].value
        return ("device", value, c[0])

    def input(self, c):
        name, dtype, shape = c
        return ("input", ProfileInput(name.value, dtype.value, shape, ir.Span(name.line, name.column)), name)

    def shape(self, c):
        return tuple(int(d) for d in c)

    def op(self, c):
        name, number, unit, size, size_unit = c
        time_us = self.amount(number, unit, DURATION_UNITS, "duration")
        temp = self.amount(size, size_unit, EXACT_SIZE_UNITS, "size")
        return ProfileOp(name.value, time_us, temp, ir.Span(name.line, name.column))

    def amount(self, number: Token, unit: Token, units: dict[str, int], what: str) -> int:
        if unit.value not in units:
            options = ", ".join(f"`{u}`" for u in units)
            raise self.error(f"unknown {what} unit `{unit}`", unit, hint=f"expected one of {options}")
        value = scaled(number.value, units[unit.value])
        if value is None:
            smallest = min(units, key=units.__getitem__)
            raise self.error(
                f"`{number} {unit}` is not a whole number of {smallest}",
                number,
                hint=f"{what}s are stored as integer {smallest}; round it",
            )
        return value

    def start(self, c):
        magic = next(x for x in c if isinstance(x, Token))
        header: dict[str, object] = {}
        where: dict[str, Token] = {}
        inputs = []
        for key, value, token in (x for x in c if isinstance(x, tuple)):
            if key == "input":
                inputs.append(value)
            elif key in header:
                raise self.error(
                    f"`{key}` is given twice",
                    token,
                    hint=f"keep one `{key}` line (the first is line {where[key].line})",
                )
            else:
                header[key], where[key] = value, token
        for key in ("model", "device", "torch"):
            if key not in header:
                raise self.error(
                    f"the header has no `{key}` line",
                    magic,
                    hint=f"add a `{key}` line after `{MAGIC} {FORMAT_VERSION}`",
                )
        ops = [x for x in c if isinstance(x, ProfileOp)]
        seen: dict[str, ProfileOp] = {}
        for op in ops:
            if op.name in seen:
                raise PlanError(
                    f"op `{op.name}` is listed twice", span=op.span, path=self.path or UNKNOWN_PATH, source=self.text,
                    length=len(op.name),
                    hint=f"keep one line for it (the first is line {seen[op.name].span.line})",
                )  # fmt: skip
            seen[op.name] = op
        model_span = ir.Span(where["model"].line, where["model"].column)
        return ProfileFile(
            model=header["model"], device=header["device"], torch=header["torch"], inputs=tuple(inputs), ops=tuple(ops),
            path=self.path, source=self.text, model_span=model_span, ops_span=self.ops_span,
        )  # fmt: skip


def _json_string(token: Token, builder: _Builder) -> str:
    try:
        return json.loads(token.value)
    except json.JSONDecodeError as error:
        raise builder.error(
            f"bad string: {error.msg}", token, hint='strings use JSON escapes: \\" \\\\ \\n \\uXXXX'
        ) from None


@functools.cache
def _lark() -> Lark:
    """The parser of grammar/profile.lark (NOTE: [Parser tables] in remat_dsl/plan/parser.py)."""
    return tables.parser("profile")


HEADER_WORDS = ("model", "device", "torch", "input", "ops")


def _syntax_error(error: UnexpectedInput, text: str, path: str | None) -> PlanError:
    """A line the grammar refuses, named by what it should have been."""
    lines = text.split("\n")
    number = min(max(1, error.line), len(lines))
    line = lines[number - 1]
    words = [(m.group(), m.start() + 1) for m in re.finditer(r"\S+", line.split("#")[0])]
    where: dict[str, Any] = dict(path=path or UNKNOWN_PATH, source=text)
    ops_line = next((i for i, l in enumerate(lines, 1) if l.split("#")[0].strip() == "ops"), None)
    if not words:
        if ops_line is None:
            return PlanError(
                "the profile has no `ops` table",
                span=ir.Span(number, 1),
                hint="add `ops` followed by one `NAME  TIME  TEMP` line per operation",
                **where,
            )
        return PlanError(
            "the profile ends early",
            span=ir.Span(number, 1),
            hint="write it with `remat profile MODEL -o FILE`",
            **where,
        )
    first, col = words[0]
    if number == 1 or (ops_line is None or number < ops_line) and first == MAGIC:
        return PlanError(
            f"expected `{MAGIC} {FORMAT_VERSION}`",
            span=ir.Span(number, col),
            length=len(line.strip()),
            hint="a profile starts with `remat-profile 1`; write it with `remat profile MODEL -o FILE`",
            **where,
        )
    if ops_line is None or number < ops_line:
        if first not in HEADER_WORDS:
            return PlanError(
                f"unknown header key `{first}`",
                span=ir.Span(number, col),
                length=len(first),
                hint="expected `model`, `device`, `torch`, `input` or `ops`",
                **where,
            )
        if first == "input":
            return PlanError(
                "an input line is `input NAME DTYPE[SHAPE]`",
                span=ir.Span(number, col),
                hint="e.g. `input  x  float32[16, 32]`",
                **where,
            )
        if len(words) == 1:
            return PlanError(
                f"`{first}` needs a value",
                span=ir.Span(number, len(line) + 1),
                hint=f'write e.g. `{first} "..."`',
                **where,
            )
        value, value_col = words[1]
        return PlanError(
            f"cannot read the {first} `{line[value_col - 1 :].split('#')[0].strip()}`",
            span=ir.Span(number, value_col),
            length=len(value),
            hint='write a quoted string, e.g. "text"',
            **where,
        )
    if len(words) != 5:
        at = words[5][1] if len(words) > 5 else len(line) + 1
        return PlanError(
            "an op line is `NAME  TIME  TEMP`",
            span=ir.Span(number, at),
            hint=f"e.g. `{first}  0.012 ms  4 KiB`",
            **where,
        )
    for (number_text, number_col), (unit, _), what, example in (
        (words[1], words[2], "duration", "0.123 ms"),
        (words[3], words[4], "size", "4 KiB"),
    ):
        if not re.fullmatch(r"[0-9]+(\.[0-9]+)?", number_text):
            return PlanError(
                f"cannot read the {what} `{number_text} {unit}`",
                span=ir.Span(number, number_col),
                length=len(number_text),
                hint=f"write e.g. `{example}`",
                **where,
            )
    return PlanError(
        f"bad op name `{first}`",
        span=ir.Span(number, col),
        length=len(first),
        hint="op names are dotted identifiers, as in the plan's `ops`",
        **where,
    )


def read_profile(text: str, path: str | None = None) -> ProfileFile:
    """Parse a profile file (grammar/profile.lark).  Raises PlanError (file:line:col, with a hint)."""
    if not text.strip():
        raise PlanError(
            "the profile is empty", path=path or UNKNOWN_PATH, hint="write it with `remat profile MODEL -o FILE`"
        )
    try:
        tree = _lark().parse(text)
    except UnexpectedInput as error:
        raise _syntax_error(error, text, path) from None
    builder = _Builder(text, path)
    ops_line = next(i for i, l in enumerate(text.split("\n"), 1) if l.split("#")[0].strip() == "ops")
    builder.ops_span = ir.Span(ops_line, 1)
    try:
        return builder.transform(tree)
    except VisitError as error:
        if isinstance(error.orig_exc, PlanError):
            raise error.orig_exc from None
        raise


def load_profile(path: str) -> ProfileFile:
    """Read and parse the profile at `path`.  Raises RematError."""
    from remat_dsl.plan.files import read_text

    return read_profile(read_text(path, "profile"), path)


# ---------------------------------------------------------------------------
# Applying
# ---------------------------------------------------------------------------


def _same_model(a: str, b: str) -> bool:
    """Model specs name the same file and factory (the file's directory may differ:
    a committed profile is read from other checkouts and working directories)."""
    from remat_dsl.capture.model_file import split_spec

    (path_a, factory_a), (path_b, factory_b) = split_spec(a), split_spec(b)
    return factory_a == factory_b and Path(path_a).name == Path(path_b).name


def apply_profile(graph: ir.Graph, profile: ProfileFile, *, model: str | None = None) -> ir.Graph:
    """`graph` with every op's time_us and temp_bytes taken from `profile`, each temp_bytes
    with the zeros of the tangents the op reads added (NOTE: [Gradient zeros] in
    remat_dsl.capture.fbgraph; write_profile takes them out).

    model: the spec of the model file the graph was captured from; when given it must
    name the same file and factory as the profile's header.
    Raises PlanError when the profile was made for another model or other inputs.
    """
    path, source = profile.path or UNKNOWN_PATH, profile.source

    def error(message: str, span: ir.Span | None, length: int = 1, hint: str = RERUN) -> PlanError:
        return PlanError(message, span=span, hint=hint, path=path, source=source, length=length)

    if model is not None and not _same_model(model, profile.model):
        raise error(
            f"the profile was made for model {json.dumps(profile.model, ensure_ascii=False)}, not"
            f" {json.dumps(model, ensure_ascii=False)}",
            profile.model_span,
            len(json.dumps(profile.model, ensure_ascii=False)),
            f"plan {profile.model} with this profile, or run `remat profile {model}` again",
        )
    graph_inputs = [(v.name, v.dtype, tuple(v.shape)) for v in graph.inputs]
    for index, value in enumerate(profile.inputs):
        got = (value.name, value.dtype, value.shape)
        if index >= len(graph_inputs):
            raise error(
                f"the profile has input `{value.name}`, but the model takes {len(graph_inputs)} input(s)",
                value.span,
                len(value.name),
            )
        if got != graph_inputs[index]:
            name, dtype, shape = graph_inputs[index]
            raise error(
                f"the profile has input `{value.name} {value.dtype}{_shape(value.shape)}`, but the model's input"
                f" {index} is `{name} {dtype}{_shape(shape)}`",
                value.span,
                len(value.name),
            )
    if len(profile.inputs) < len(graph_inputs):
        name, dtype, shape = graph_inputs[len(profile.inputs)]
        raise error(f"the profile lacks the model's input `{name} {dtype}{_shape(shape)}`", profile.model_span)
    costs = {op.name: op for op in profile.ops}
    names = {op.name for op in graph.ops}
    missing = [op.name for op in graph.ops if op.name not in costs]
    if missing:
        listed = ", ".join(f"`{n}`" for n in missing[:3]) + (
            f" and {len(missing) - 3} more" if len(missing) > 3 else ""
        )
        raise error(f"the profile has no costs for op {listed} of the graph", profile.ops_span, 3)
    for op in profile.ops:
        if op.name not in names:
            raise error(f"the graph has no op `{op.name}`", op.span, len(op.name))
    ops = tuple(replace(op, time_us=costs[op.name].time_us, temp_bytes=costs[op.name].temp_bytes) for op in graph.ops)
    return ir.with_gradient_zeros(replace(graph, ops=ops))  # NOTE: [Gradient zeros] in remat_dsl/capture/fbgraph.py
