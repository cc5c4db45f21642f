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

import json
import re
from dataclasses import dataclass, field, replace
from decimal import Decimal, InvalidOperation
from pathlib import Path

from remat_dsl.plan import ir
from remat_dsl.plan.errors import PlanError
from remat_dsl.plan.units import DURATION_UNITS, SIZE_UNITS, format_duration, size_parts

FORMAT_VERSION = 1
MAGIC = "remat-profile"
KEY_WIDTH = 8
TIME_WIDTH = 8  # digits of `12345.678`: wide enough that a changed time keeps the layout
TEMP_WIDTH = 8  # digits of `1023.999`
HEADER_KEYS = ("model", "device", "torch", "input")
UNKNOWN_PATH = "<profile>"

_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.]*")
_BARE = re.compile(r"[A-Za-z_][A-Za-z0-9_.:\-]*")
_TYPE = re.compile(r"([A-Za-z_][A-Za-z0-9_]*)\[\s*((?:[0-9]+\s*(?:,\s*[0-9]+\s*)*)?)\]")
_TOKEN = re.compile(r"\S+")

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
    for op in graph.ops:
        if not _NAME.fullmatch(op.name):
            raise ValueError(f"cannot write op name {op.name!r} to a profile")
        number, unit = format_duration(op.time_us).split()
        rows.append((op.name, number, unit, *size_parts(op.temp_bytes)))
    name_width = max([len("# name")] + [len(r[0]) for r in rows])
    time_width = max([TIME_WIDTH] + [len(r[1]) for r in rows])
    temp_width = max([TEMP_WIDTH] + [len(r[3]) for r in rows])
    lines += ["", "ops", f"  {'# name':<{name_width}}  {'time':>{time_width}}     {'temp':>{temp_width}}".rstrip()]
    for name, number, unit, size, size_unit in rows:
        lines.append(f"  {name:<{name_width}}  {number:>{time_width}} {unit:<2}  {size:>{temp_width}} {size_unit}".rstrip())
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------------------
# Reading
# ---------------------------------------------------------------------------


class _Line:
    """One line of the file without its comment, with its tokens and their columns."""

    def __init__(self, number: int, text: str):
        self.number = number
        self.text = _strip_comment(text)
        self.tokens = [(m.group(), m.start() + 1) for m in _TOKEN.finditer(self.text)]

    def span(self, col: int = 1) -> ir.Span:
        return ir.Span(self.number, col)


def _strip_comment(text: str) -> str:
    """`text` without a trailing `# comment` outside a JSON string."""
    inside = escaped = False
    for index, char in enumerate(text):
        if inside:
            if escaped:
                escaped = False
            elif char == "\\":
                escaped = True
            elif char == '"':
                inside = False
        elif char == '"':
            inside = True
        elif char == "#":
            return text[:index].rstrip()
    return text.rstrip()


class _Reader:
    def __init__(self, text: str, path: str | None):
        self.text, self.path = text, path

    def error(self, message: str, line: _Line, col: int = 1, length: int = 1, hint: str | None = None) -> PlanError:
        return PlanError(message, span=line.span(col), hint=hint, path=self.path or UNKNOWN_PATH, source=self.text, length=length)

    def string(self, line: _Line, key: str, bare: bool = False) -> str:
        rest_col = line.tokens[1][1] if len(line.tokens) > 1 else len(line.text) + 2
        rest = line.text[rest_col - 1 :].strip()
        if not rest:
            raise self.error(f"`{key}` needs a value", line, len(line.text) + 1, hint=f'write e.g. `{key} "..."`')
        if bare and _BARE.fullmatch(rest):
            return rest
        try:
            value = json.loads(rest)
        except json.JSONDecodeError:
            value = None
        if not isinstance(value, str):
            raise self.error(f"cannot read the {key} `{rest}`", line, rest_col, len(rest), hint='write a quoted string, e.g. "text"')
        return value

    def input(self, line: _Line) -> ProfileInput:
        if len(line.tokens) < 3:
            raise self.error("an input line is `input NAME DTYPE[SHAPE]`", line, hint="e.g. `input  x  float32[16, 32]`")
        name, name_col = line.tokens[1]
        type_col = line.tokens[2][1]
        text = line.text[type_col - 1 :].strip()
        match = _TYPE.fullmatch(text)
        if not _NAME.fullmatch(name):
            raise self.error(f"bad input name `{name}`", line, name_col, len(name), hint="names are dotted identifiers")
        if not match:
            raise self.error(f"cannot read the input type `{text}`", line, type_col, len(text), hint="write DTYPE[SHAPE], e.g. `float32[16, 32]`")
        shape = tuple(int(d) for d in match.group(2).split(",")) if match.group(2).strip() else ()
        return ProfileInput(name, match.group(1), shape, line.span(name_col))

    def amount(self, line: _Line, index: int, units: dict[str, int], what: str, example: str) -> int:
        number, col = line.tokens[index]
        unit, unit_col = line.tokens[index + 1]
        if unit not in units:
            options = ", ".join(f"`{u}`" for u in units)
            raise self.error(f"unknown {what} unit `{unit}`", line, unit_col, len(unit), hint=f"expected one of {options}")
        try:
            value = Decimal(number) * units[unit]
        except InvalidOperation:
            value = None
        if value is None or not re.fullmatch(r"[0-9]+(\.[0-9]+)?", number):
            raise self.error(f"cannot read the {what} `{number} {unit}`", line, col, len(number), hint=f"write e.g. `{example}`")
        if value != value.to_integral_value():
            smallest = min(units, key=units.get)
            raise self.error(f"`{number} {unit}` is not a whole number of {smallest}", line, col, len(number), hint=f"{what}s are stored as integer {smallest}; round it")
        return int(value)

    def op(self, line: _Line) -> ProfileOp:
        if len(line.tokens) != 5:
            at = line.tokens[5][1] if len(line.tokens) > 5 else len(line.text) + 1
            raise self.error("an op line is `NAME  TIME  TEMP`", line, at, hint="e.g. `fc1  0.012 ms  4 KiB`")
        name, col = line.tokens[0]
        if not _NAME.fullmatch(name):
            raise self.error(f"bad op name `{name}`", line, col, len(name), hint="op names are dotted identifiers, as in the plan's `ops`")
        time_us = self.amount(line, 1, DURATION_UNITS, "duration", "0.123 ms")
        temp = self.amount(line, 3, SIZE_UNITS, "size", "4 KiB")
        return ProfileOp(name, time_us, temp, line.span(col))

    def read(self) -> ProfileFile:
        lines = [_Line(i + 1, t) for i, t in enumerate(self.text.split("\n"))]
        lines = [line for line in lines if line.tokens]
        if not lines:
            raise PlanError("the profile is empty", path=self.path or UNKNOWN_PATH, hint="write it with `remat profile MODEL -o FILE`")
        first = lines[0]
        if [t for t, _ in first.tokens] != [MAGIC, str(FORMAT_VERSION)]:
            raise self.error(f"expected `{MAGIC} {FORMAT_VERSION}`", first, first.tokens[0][1], len(first.text.strip()), hint="a profile starts with `remat-profile 1`; write it with `remat profile MODEL -o FILE`")
        header: dict[str, object] = {}
        spans: dict[str, _Line] = {}
        inputs: list[ProfileInput] = []
        ops: list[ProfileOp] = []
        ops_line = None
        for line in lines[1:]:
            word, col = line.tokens[0]
            if ops_line is not None:
                ops.append(self.op(line))
            elif word == "ops" and len(line.tokens) == 1:
                ops_line = line
            elif word == "input":
                inputs.append(self.input(line))
            elif word in HEADER_KEYS:
                if word in header:
                    raise self.error(f"`{word}` is given twice", line, col, len(word), hint=f"keep one `{word}` line (the first is line {spans[word].number})")
                header[word] = self.string(line, word, bare=word == "device")
                spans[word] = line
            else:
                raise self.error(f"unknown header key `{word}`", line, col, len(word), hint="expected `model`, `device`, `torch`, `input` or `ops`")
        for key in ("model", "device", "torch"):
            if key not in header:
                raise self.error(f"the header has no `{key}` line", first, hint=f"add a `{key}` line after `{MAGIC} {FORMAT_VERSION}`")
        if ops_line is None:
            raise self.error("the profile has no `ops` table", lines[-1], hint="add `ops` followed by one `NAME  TIME  TEMP` line per operation")
        seen: dict[str, ProfileOp] = {}
        for op in ops:
            if op.name in seen:
                raise PlanError(
                    f"op `{op.name}` is listed twice", span=op.span, path=self.path or UNKNOWN_PATH, source=self.text, length=len(op.name),
                    hint=f"keep one line for it (the first is line {seen[op.name].span.line})",
                )
            seen[op.name] = op
        return ProfileFile(
            model=header["model"], device=header["device"], torch=header["torch"], inputs=tuple(inputs), ops=tuple(ops),
            path=self.path, source=self.text, model_span=spans["model"].span(spans["model"].tokens[1][1]), ops_span=ops_line.span(),
        )


def read_profile(text: str, path: str | None = None) -> ProfileFile:
    """Parse a profile file.  Raises PlanError (file:line:col, with a hint)."""
    return _Reader(text, path).read()


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
    """`graph` with every op's time_us and temp_bytes taken from `profile`.

    model: the spec of the model file the graph was captured from; when given it must
    name the same file and factory as the profile's header.
    Raises PlanError when the profile was made for another model or other inputs.
    """
    path, source = profile.path or UNKNOWN_PATH, profile.source

    def error(message: str, span: ir.Span | None, length: int = 1, hint: str = RERUN) -> PlanError:
        return PlanError(message, span=span, hint=hint, path=path, source=source, length=length)

    if model is not None and not _same_model(model, profile.model):
        raise error(f"the profile was made for model {json.dumps(profile.model, ensure_ascii=False)}, not {json.dumps(model, ensure_ascii=False)}", profile.model_span, len(json.dumps(profile.model, ensure_ascii=False)), f"plan {profile.model} with this profile, or run `remat profile {model}` again")
    graph_inputs = [(v.name, v.dtype, tuple(v.shape)) for v in graph.inputs]
    for index, value in enumerate(profile.inputs):
        got = (value.name, value.dtype, value.shape)
        if index >= len(graph_inputs):
            raise error(f"the profile has input `{value.name}`, but the model takes {len(graph_inputs)} input(s)", value.span, len(value.name))
        if got != graph_inputs[index]:
            name, dtype, shape = graph_inputs[index]
            raise error(f"the profile has input `{value.name} {value.dtype}{_shape(value.shape)}`, but the model's input {index} is `{name} {dtype}{_shape(shape)}`", value.span, len(value.name))
    if len(profile.inputs) < len(graph_inputs):
        name, dtype, shape = graph_inputs[len(profile.inputs)]
        raise error(f"the profile lacks the model's input `{name} {dtype}{_shape(shape)}`", profile.model_span)
    costs = {op.name: op for op in profile.ops}
    names = {op.name for op in graph.ops}
    missing = [op.name for op in graph.ops if op.name not in costs]
    if missing:
        listed = ", ".join(f"`{n}`" for n in missing[:3]) + (f" and {len(missing) - 3} more" if len(missing) > 3 else "")
        raise error(f"the profile has no costs for op {listed} of the graph", profile.ops_span, 3)
    for op in profile.ops:
        if op.name not in names:
            raise error(f"the graph has no op `{op.name}`", op.span, len(op.name))
    ops = tuple(replace(op, time_us=costs[op.name].time_us, temp_bytes=costs[op.name].temp_bytes) for op in graph.ops)
    return replace(graph, ops=ops)
