"""Parse plan text into an `ir.Plan`: `parse(text, path=None)` and `parse_file(path)`.

The grammar is grammar/plan.lark (LALR(1), contextual lexer).  A plan looks like::

    # comment lines before `remat-plan 1` are Header.comments
    remat-plan 1

    header
      model       "tests/models/tiny_mlp.py:build_model"
      device      cpu
      autocast    bfloat16                    # optional: captured under torch.autocast (left out: none)
      costs       "roofline h100-sxm"         # optional: what predicted the costs (left out: measured)
      budget      64 KiB
      counts      "activations, temporaries, outputs, gradients"
      solver      "hand"
      status      feasible                    # optimal | feasible | baseline | heuristic | hand-written
      gap         1.23%                       # optional: relative MIP gap, 0 to 4 decimals
      solve-time  2.4 s                       # optional: seconds spent solving, 0 or 1 decimal
      peak        48 KiB at backward:3
      time        0.120 ms
      compute     0.100 ms
      recompute   0.000 ms
      bandwidth   12 GB/s

    inputs                                    # also: parameters, buffers, tangents
      x  float32[16, 32]

    tensors
      # name  shape     dtype    size   producer
      fc1     [16, 64]  float32  4 KiB  fc1
      drop:1  [16, 64]  bool     1 KiB  drop:1     # output 1 of op `drop`

    ops
      # name = target(args)                      time      temp  phase
      fc1 = aten.addmm.default(%b, %x, aten.t.default(%w))  0.010 ms  0 B  forward
      drop = aten.native_dropout.default(%fc1, 0.1, True)  0.010 ms  0 B  forward  random

    outputs
      %fc2

    gradients
      fc1.weight = aten.t.default(%fc2.bwd.mm_1)
      fc1.bias   = None

    updates
      bn.running_mean = %act

    forward
      compute  fc1  on compute
      offload  fc1  on d2h      # a trailing comment
    backward
      prefetch fc1  on h2d

(The `# ...` annotations after header values, tensor rows and section names above are
for this docstring only: the format keeps trailing comments on instructions alone.)
Section names start at column 1 and items are indented.  buffers, tangents and updates
may be left out, and so may the header's `gap` and `solve-time` lines (ir.Header).
Arguments: `%name` references, `torch.NAME` constants, ints, floats
(`inf`, `-inf`, `nan`), "strings", None/True/False, `[lists]`, `(tuples,)` and calls
`target(args, key=value)`.  Units: see remat_dsl.plan.printer (NOTE: [Units]); the canonical
layout is the printer's.

NOTE: [Comments]
A full-line comment indented under a section is kept in the `comments` of the item
below it; a comment after an instruction is its `trailing`; column-1 comments before
`remat-plan 1` are `Header.comments` and those after the last section `Plan.comments`.
The stored text is what follows `#`, less one space and trailing whitespace.  The
heading comment the printer puts on top of `tensors` and `ops` is recognised by its
words and dropped (the printer writes it again).  A comment anywhere else would be lost,
so it is a syntax error.

Errors: every syntax error and every structurally wrong word (unknown verb, stream,
status or unit; a bare name where a `%` reference belongs) raises `PlanError` with
`path:line:col`, the line, carets and a hint.  Names are not resolved here; the
simulator checks that they exist.
"""

from __future__ import annotations

import difflib
import functools
import json
import re
from dataclasses import dataclass, replace
from decimal import ROUND_HALF_UP, Decimal
from pathlib import Path
from typing import Any, Callable, Sequence, cast

from lark import Lark, Token, Transformer, Tree
from lark.exceptions import UnexpectedCharacters, UnexpectedInput, UnexpectedToken, VisitError
from lark.lexer import PatternStr

from remat_dsl.plan import ir, tables
from remat_dsl.plan.optimizer import OptimizerError, parse_optimizer
from remat_dsl.plan.errors import PlanError
from remat_dsl.plan.resources import data_path
from remat_dsl.plan.printer import (
    FORMAT_VERSION,
    OP_HEADING,
    PEAK_AT_RE,
    PHASES,
    SOLVE_TIME_UNIT,
    STATUSES,
    SYM_PREFIX,
    TENSOR_HEADING,
    TENSOR_HEADING_V1,
)
from remat_dsl.plan.units import (
    BANDWIDTH_UNITS,
    DURATION_UNITS,
    EXACT_SIZE_UNITS,
    GAP_PERCENT_DECIMALS,
    SECONDS_DECIMALS,
    SIZE_UNITS,
    UnitError,
    scaled,
)
from remat_dsl.plan import units

READ_VERSIONS = ("1", str(FORMAT_VERSION))
GAP_STEP = f"0.{'0' * (GAP_PERCENT_DECIMALS - 1)}1%"
GRAMMAR_PATH = data_path("grammar", "plan.lark")
# The sections in the order of format 2 (format 1 had the schedule after the graph).
SECTIONS = (
    "header", "constraints", "forward", "backward", "inputs", "parameters", "buffers", "tangents",
    "tensors", "ops", "outputs", "gradients", "updates", "digest",
)  # fmt: skip
SECTIONS_V1 = (
    "header", "constraints", "inputs", "parameters", "buffers", "tangents", "tensors", "ops",
    "outputs", "gradients", "updates", "forward", "backward", "digest",
)  # fmt: skip
HEADER_KEYS = (
    "model", "device", "autocast", "costs", "budget", "counts", "solver", "status", "gap", "solve-time",
    "peak", "time", "compute", "recompute", "bandwidth", "optimizer", "update-speed",
)  # fmt: skip

VERB_ALIASES = {alias: verb.name for verb in ir.INSTRUCTIONS.values() for alias in verb.aliases}  # ir.Verb.aliases


@functools.cache
def _lark() -> Lark:
    """The plan parser (NOTE: [Parser tables]).

    NOTE: [Parser tables]
    Lark builds the LALR(1) tables of grammar/plan.lark in 1.2-1.6 s on this 2-core machine
    (`start` and `header` spell out every combination of their optional sections, see the
    grammar), which would be most of a `remat fmt`, `remat diff` or `remat textconv` run, and
    git runs `remat textconv` once per file and revision.  The tables are built ahead of time
    into the package as data: grammar/plan.tables.json, written by `python -m
    remat_dsl.plan.tables` (`make tables`) and read back with Lark's own deserializer in
    about 0.1 s (remat_dsl/plan/tables.py).  The file records a SHA-256 of the grammar files,
    Lark's options and Lark's version; when they are not those in use (an edited grammar,
    another Lark) the parser is built in memory instead, and tests/test_parser_tables.py
    fails until the file is written again.  The loader accepts only the expected options (no
    lexer callbacks, post-lexer or classes of its own), so nothing but data reaches Lark.
    Nothing is read from or written to the cache directory: a cache is writable by whoever
    shares or restores it, and Lark's own `save` format is a pickle, which runs code when it
    is read.  grammar/constraints.lark and grammar/profile.lark are shipped the same way
    (remat_dsl.plan.constraints, remat_dsl.capture.profile_file).
    """
    return tables.parser("plan")


MAX_NESTING = 64  # brackets inside one argument; captured graphs stay far below


def parse(text: str, path: str | None = None) -> ir.Plan:
    """Parse plan text; raises PlanError (with path:line:col) on any syntax error."""
    _check_nesting(text, path)
    try:
        tree = _lark().parse(text)
    except UnexpectedInput as error:
        raise _syntax_error(error, text, path) from None
    try:
        plan = _Builder().transform(tree)
    except VisitError as error:
        if isinstance(error.orig_exc, PlanError):
            raise error.orig_exc.with_source(path, text) from None
        raise
    return replace(plan, section_spans=_section_spans(text))


def parse_file(path: str | Path) -> ir.Plan:
    """Parse the plan file at `path` (UTF-8).  Raises RematError when it cannot be read,
    PlanError when it does not parse."""
    from remat_dsl.plan.files import read_text

    return parse(read_text(path, "plan"), str(path))


def _section_spans(text: str) -> tuple[tuple[str, ir.Span], ...]:
    """(name, span) of every section name line (section names stand alone at column 1)."""
    names = set(SECTIONS)
    return tuple(
        (line, ir.Span(number, 1)) for number, line in enumerate(text.split("\n"), 1) if line.rstrip("\r") in names
    )


def _check_nesting(text: str, path: str | None) -> None:
    """Refuse arguments nested deeper than MAX_NESTING brackets before Lark sees them
    (the transformer, the printer and the simulator walk arguments recursively)."""
    for number, line in enumerate(text.split("\n"), 1):
        if line.count("(") + line.count("[") <= MAX_NESTING:
            continue
        depth, inside, escaped = 0, False, False
        for col, char in enumerate(line, 1):
            if inside:
                escaped, inside = (False, True) if escaped else (char == "\\", char != '"')
            elif char == '"':
                inside = True
            elif char == "#":
                break
            elif char in "([":
                depth += 1
                if depth > MAX_NESTING:
                    raise PlanError(
                        f"arguments nested deeper than {MAX_NESTING} brackets",
                        span=ir.Span(number, col), path=path, source=text,
                        hint="a captured graph never nests this deep; re-run `remat plan` for this model",
                    )  # fmt: skip
            elif char in ")]":
                depth -= 1


# ---------------------------------------------------------------------------
# Helpers of the transformer
# ---------------------------------------------------------------------------


@dataclass(frozen=True)
class _Comments:
    texts: tuple[str, ...]
    first: Token


@dataclass(frozen=True)
class _Section:
    name: str
    items: Any


@dataclass(frozen=True)
class _FileComment:
    where: str  # "top" | "end"
    text: str


@dataclass(frozen=True)
class _Kwarg:
    name: Token
    value: ir.Arg


def _span(token: Token) -> ir.Span:
    assert token.line is not None and token.column is not None  # the parser keeps every token's position
    return ir.Span(token.line, token.column)


def _error(message: str, token: Token, hint: str | None = None) -> PlanError:
    return PlanError(message, span=_span(token), hint=hint, length=len(token.value))


def _comment_line(token: Token) -> str:
    """The comment itself (from `#`), without the line break a LINE_COMMENT starts with."""
    return token.value.rsplit("\n", 1)[-1].lstrip(" \t")


def _comment_text(token: Token) -> str:
    text = _comment_line(token)[1:]
    return (text[1:] if text.startswith(" ") else text).rstrip()


def _comment_error(message: str, token: Token, hint: str) -> PlanError:
    assert token.line is not None  # the parser keeps every token's position
    col = (token.end_column or 1) - len(_comment_line(token))
    span = ir.Span(token.end_line or token.line, col)
    return PlanError(message, span=span, hint=hint, length=len(_comment_line(token).rstrip()))


def _suggest(word: str, options: Sequence[str], aliases: dict[str, str] | None = None) -> str | None:
    """The option `word` most likely means, or None."""
    lowered = {option.lower(): option for option in options}
    if word.lower() in lowered:
        return lowered[word.lower()]
    if aliases and word.lower() in aliases:
        return aliases[word.lower()]
    close = difflib.get_close_matches(word, list(options), n=1, cutoff=0.6)
    return close[0] if close else None


def _one_of(options: Sequence[str]) -> str:
    quoted = [f"`{option}`" for option in options]
    return quoted[0] if len(quoted) == 1 else ", ".join(quoted[:-1]) + " or " + quoted[-1]


def _choose(token: Token, options: Sequence[str], what: str, aliases: dict[str, str] | None = None) -> str:
    """`token`'s text if it is one of `options`; else PlanError with a suggestion."""
    if token.value in options:
        return token.value
    guess = _suggest(token.value, options, aliases)
    hint = f"did you mean `{guess}`? " if guess else ""
    raise _error(f"unknown {what} `{token.value}`", token, f"{hint}expected {_one_of(options)}")


def _amount(number: Token, unit: Token, units: dict[str, int], what: str) -> int:
    """An integer quantity written as NUMBER UNIT, e.g. `1.5 MiB` -> 1572864."""
    value = scaled(number.value, units[_choose(unit, list(units), f"{what} unit")])
    if value is None:
        smallest = min(units, key=units.__getitem__)
        raise _error(
            f"`{number} {unit}` is not a whole number of {smallest}",
            number,
            f"{what}s are stored as integer {smallest}; round it",
        )
    return value


def _agreeing(approximate: tuple[Token, Token], exact: tuple[Token, int], what: str) -> int:
    """The exact bytes of a header size written both ways (`21.89 MiB (22955008 B)`,
    remat_dsl.plan.units.format_bytes), after checking that the two agree: the first,
    rounded as written, must be the second.  Raises PlanError naming both."""
    number, unit = approximate
    factor = SIZE_UNITS[_choose(unit, list(SIZE_UNITS), "size unit")]
    token, nbytes = exact
    tolerance = Decimal(5).scaleb(-_decimals(number.value) - 1) * factor
    if abs(Decimal(number.value) * factor - nbytes) > tolerance:
        raise _error(
            f"the {what} says `{number} {unit}` and `({token} B)`, which disagree", number,
            f"edit one and remove the other: `{what} {number} {unit}`, or `{what} {token} B`",
        )  # fmt: skip
    return nbytes


def _decimals(number: str) -> int:
    """How many decimals a NUMBER writes, trailing zeros aside: `1.230` -> 2."""
    return len(number.partition(".")[2].rstrip("0"))


def _rounded(number: str, decimals: int) -> str:
    """`number` rounded half-up to `decimals` decimals, for hints."""
    return str(Decimal(number).quantize(Decimal(1).scaleb(-decimals), rounding=ROUND_HALF_UP))


def parse_size(text: str) -> int:
    """Bytes from a size as the plan's tables write it: `64 KiB`, `1.5 MiB` or `4096 B`
    (remat_dsl.plan.units, EXACT_SIZE_UNITS).

    Raises PlanError for a missing or unknown unit or a fractional number of bytes.
    """
    try:
        return units.parse_size(text, units=EXACT_SIZE_UNITS)
    except UnitError as error:
        raise PlanError(error.message, hint=error.hint) from None


def _split_comments(children: list) -> tuple[tuple[str, ...], list]:
    if children and isinstance(children[0], _Comments):
        return children[0].texts, children[1:]
    return (), children


def _items(children: list) -> tuple:
    """A section's items; a comment after its last item has nothing to attach to."""
    if children and isinstance(children[-1], _Comments):
        raise _comment_error(
            "comment is not followed by an item of this section",
            children[-1].first,
            "full-line comments are kept with the item below them; move it above an item "
            "(or to column 1 at the very end of the file)",
        )
    return tuple(children)


def _drop_heading(items: tuple, heading: Sequence[str]) -> tuple:
    """Drop the printer's column heading (the first comment of the section) if present."""
    words = " ".join(heading).removeprefix("#").split()
    if not items or not items[0].comments or items[0].comments[0].split() != words:
        return items
    return (replace(items[0], comments=items[0].comments[1:]),) + items[1:]


def _with_outputs(ops: tuple[ir.Op, ...], tensors: tuple[ir.TensorDecl, ...]) -> tuple[ir.Op, ...]:
    """Op.outputs: the tensors each op produces, in output order (see the printer)."""
    produced: dict[str, list[ir.TensorDecl]] = {}
    for t in tensors:
        produced.setdefault(t.producer, []).append(t)
    return tuple(
        replace(op, outputs=tuple(t.name for t in sorted(produced.get(op.name, []), key=lambda t: t.index)))
        for op in ops
    )


# ---------------------------------------------------------------------------
# The transformer: one method per grammar rule
# ---------------------------------------------------------------------------


def constraint_of(kind: Token, value, comments: tuple[str, ...] = ()) -> ir.Constraint:
    """A Constraint from its kind word and its value: a STRING token (a glob) or a size,
    (NUMBER, UNIT or None).  Raises PlanError at the word that is wrong."""
    word = _choose(kind, ir.CONSTRAINT_KINDS, "constraint")
    is_pattern = isinstance(value, Token)
    if word == "budget" and is_pattern:
        raise _error("`budget` takes a size", value, "write for example `budget 2 GiB`")
    if word != "budget" and not is_pattern:
        raise _error(
            f"`{word}` takes a quoted glob pattern", kind, f'write for example `{word} "transformer.h.*.attn.*"`'
        )
    if is_pattern:
        return ir.Constraint(word, json.loads(value.value), None, comments, _span(kind))
    number, unit = value  # a size: NUMBER and its UNIT (bytes when a constraints file gives none)
    return ir.Constraint(
        word, None, _amount(number, unit or Token("UNIT", "B"), SIZE_UNITS, "size"), comments, _span(kind)
    )


@dataclass(frozen=True)
class _Head:
    """The header's lines: the Header, and the graph's autocast line (None if absent)."""

    header: ir.Header
    autocast: ir.Autocast | None


@dataclass(frozen=True)
class _Shape:
    """A shape with size symbols, as read: (symbol, size) per dim, either None where the
    text has none (NOTE: [Sizes that vary] in remat_dsl/plan/ir.py)."""

    dims: tuple[tuple[Token | None, Token | None], ...]


def _symbol_error(shape: _Shape, where: str, why: str) -> PlanError:
    name = next(sym for sym, _ in shape.dims if sym is not None)
    return _error(
        f"size symbol '{name}' {where}", name,
        f"only the inputs declare size symbols (`x  float32[B <= 16, 32]`) and the tangents name them; {why}",
    )  # fmt: skip


def _declared_symbols(inputs: Sequence[ir.ValueDecl]) -> dict[str, int]:
    """The size symbols the inputs declare, with their bounds; raises PlanError at a symbol
    without a bound in its first use or with another bound than there."""
    bounds: dict[str, int] = {}
    for decl in inputs:
        if not isinstance(decl.dims, _Shape):
            continue
        for sym, size in decl.dims.dims:
            if sym is None:
                continue
            if size is None and sym.value not in bounds:
                raise _error(
                    f"size symbol '{sym}' has no bound", sym,
                    f"declare it with its largest size where the inputs first use it: `{sym} <= N`",
                )  # fmt: skip
            if size is not None and bounds.setdefault(sym.value, int(size)) != int(size):
                raise _error(
                    f"size symbol '{sym}' bounded by {size} here and by {bounds[sym.value]} above", size,
                    f"give '{sym}' one bound: write `{sym}` alone after its declaration",
                )  # fmt: skip
    return bounds


def _sized(decl: ir.ValueDecl, bounds: dict[str, int]) -> ir.ValueDecl:
    """`decl` with its sizes and size symbols (NOTE: [Sizes that vary] in
    remat_dsl/plan/ir.py); raises PlanError at a symbol `bounds` does not declare."""
    if not isinstance(decl.dims, _Shape):
        return decl
    shape: list[int] = []
    dims: list[str | None] = []
    for sym, size in decl.dims.dims:
        if sym is None:
            assert size is not None  # the grammar: a dim without a symbol is an INT
            shape.append(int(size))
            dims.append(None)
            continue
        if sym.value not in bounds:
            if not bounds:
                raise _symbol_error(decl.dims, f"in the {decl.kind}s", "parameters and buffers have fixed shapes")
            raise _error(
                f"size symbol '{sym}' is not declared by the inputs", sym,
                f"the inputs declare {', '.join(sorted(bounds))}: use one of them, or declare '{sym}' there",
            )  # fmt: skip
        if size is not None and int(size) != bounds[sym.value]:
            raise _error(
                f"size symbol '{sym}' bounded by {size} here and by {bounds[sym.value]} in the inputs", size,
                f"write `{sym}` alone: the inputs declare its bound",
            )  # fmt: skip
        shape.append(bounds[sym.value])
        dims.append(sym.value)
    return replace(decl, shape=tuple(shape), dims=tuple(dims))


@dataclass(frozen=True)
class _SizeText:
    """A size expression as read (NOTE: [Size expressions] in remat_dsl/plan/ir.py): terms of
    (symbol tokens, coefficient), resolved against the inputs' symbols by `_resolve_sizes`;
    `first`: its first token, where an error points."""

    terms: tuple[tuple[tuple[Token, ...], int], ...]
    first: Token


SIZE_LIMIT = 1 << 62  # the largest magnitude of an integer in a size expression (torch sizes are int64)


def _bare_name(token: Token) -> PlanError:
    return _error(
        f"bare name `{token}` in an argument", token,
        f"refer to a value with `%`: write `%{token}` (constants are written `{SYM_PREFIX}NAME`, size expressions"
        " name the size symbols the inputs declare)",
    )  # fmt: skip


def _bounded(value: int, token: Token) -> int:
    if abs(value) >= SIZE_LIMIT:
        raise _error(
            "integer out of range in a size expression", token, "size expressions stay below 2**62 in magnitude"
        )
    return value


def _as_size(value, token: Token | None = None) -> _SizeText:
    """`value` (an int or a _SizeText from the rules under `size`) as a _SizeText."""
    if isinstance(value, _SizeText):
        return value
    if type(value) is int and token is not None:
        return _SizeText((((), value),), token)
    raise _error(
        f"`{value}` in a size expression", token or Token("NAME", "?"),
        "size expressions hold integers and the size symbols the inputs declare, joined by +, - and *",
    )  # fmt: skip


def _size_sum(left, right, sign: int) -> "_SizeText | int":
    if type(left) is int and type(right) is int:
        return left + sign * right
    first = left.first if isinstance(left, _SizeText) else right.first
    a, b = _as_size(left, first), _as_size(right, first)
    return _SizeText(a.terms + tuple((symbols, sign * c) for symbols, c in b.terms), a.first)


def _lone_name(text: _SizeText) -> bool:
    return len(text.terms) == 1 and len(text.terms[0][0]) == 1 and text.terms[0][1] == 1


def _resolve_size(text: _SizeText, bounds: dict[str, int]) -> "ir.SizeExpr | int":
    """`text` as a SizeExpr over the declared symbols `bounds`, or an int when no symbol is
    left; raises PlanError at a name the inputs do not declare or an integer out of range."""
    for symbols, coefficient in text.terms:
        _bounded(coefficient, text.first)
        for token in symbols:
            if token.value not in bounds:
                if _lone_name(text):
                    raise _bare_name(token)
                declared = ", ".join(sorted(bounds)) or "none"
                raise _error(
                    f"size symbol '{token}' is not declared by the inputs", token,
                    f"the inputs declare {declared}; a size expression names those (`x  int64[B <= 8, S <= 512]`)",
                )  # fmt: skip
    terms = ir.canonical_terms((tuple(t.value for t in symbols), c) for symbols, c in text.terms)
    for _, coefficient in terms:
        _bounded(coefficient, text.first)
    if not any(symbols for symbols, _ in terms):
        return terms[0][1] if terms else 0
    return ir.SizeExpr(terms)


def _resolve_arg(arg, bounds: dict[str, int]):
    """`arg` with its size expressions resolved (`_resolve_size`)."""
    if isinstance(arg, _SizeText):
        return _resolve_size(arg, bounds)
    if isinstance(arg, ir.Call):
        return replace(
            arg,
            args=tuple(_resolve_arg(a, bounds) for a in arg.args),
            kwargs=tuple((k, _resolve_arg(v, bounds)) for k, v in arg.kwargs),
        )
    if isinstance(arg, ir.ListArg):
        return ir.ListArg(tuple(_resolve_arg(a, bounds) for a in arg.items))
    if isinstance(arg, ir.TupleArg):
        return ir.TupleArg(tuple(_resolve_arg(a, bounds) for a in arg.items))
    return arg


def _resolve_op(op: ir.Op, bounds: dict[str, int]) -> ir.Op:
    args = tuple(_resolve_arg(a, bounds) for a in op.args)
    kwargs = tuple((k, _resolve_arg(v, bounds)) for k, v in op.kwargs)
    return op if (args, kwargs) == (op.args, op.kwargs) else replace(op, args=args, kwargs=kwargs)


class _Builder(Transformer):
    """Builds ir dataclasses from the parse tree of grammar/plan.lark."""

    # --- file structure
    def start(self, c: list) -> ir.Plan:
        version = next(x for x in c if isinstance(x, Token))
        if version.value not in READ_VERSIONS:
            raise _error(
                f"unsupported plan version {version}", version,
                f"this tool reads `remat-plan {FORMAT_VERSION}` (and version 1, which `remat fmt` upgrades)",
            )  # fmt: skip
        sections = {x.name: x.items for x in c if isinstance(x, _Section)}
        head = next(x for x in c if isinstance(x, _Head))
        header, autocast = head.header, head.autocast
        top = tuple(x.text for x in c if isinstance(x, _FileComment) and x.where == "top")
        end = tuple(x.text for x in c if isinstance(x, _FileComment) and x.where == "end")
        inputs = sections["inputs"]
        declared = tuple(x for x in inputs if isinstance(x, ir.ValueDecl))
        bounds = _declared_symbols(declared)
        graph = ir.Graph(
            inputs=tuple(_sized(d, bounds) for d in declared),
            parameters=tuple(_sized(d, {}) for d in sections["parameters"]),
            buffers=tuple(_sized(d, {}) for d in sections.get("buffers", ())),
            tangents=tuple(_sized(d, bounds) for d in sections.get("tangents", ())),
            tensors=sections["tensors"],
            ops=_with_outputs(tuple(_resolve_op(op, bounds) for op in sections["ops"]), sections["tensors"]),
            outputs=_resolve_arg(sections["outputs"], bounds),
            gradients=tuple(replace(g, value=_resolve_arg(g.value, bounds)) for g in sections["gradients"]),
            updates=sections.get("updates", ()),
            constants=tuple(x for x in inputs if isinstance(x, ir.ConstantInput)),
            autocast=autocast,
        )
        digest = next((x for x in c if isinstance(x, ir.Digest)), None)
        return ir.Plan(
            replace(header, comments=top), graph, sections["forward"], sections["backward"], end,
            sections.get("constraints", ()), digest,
        )  # fmt: skip

    def top_comment(self, c: list) -> _FileComment:
        return _FileComment("top", _comment_text(c[0]))

    def end_comment(self, c: list) -> _FileComment:
        return _FileComment("end", _comment_text(c[0]))

    def comments(self, c: list) -> _Comments:
        return _Comments(tuple(_comment_text(t) for t in c), c[0])

    # --- header
    def header(self, c: list) -> "_Head":
        entries = {key: value for entry in c for key, value in entry.items()}
        autocast = entries.pop("autocast", None)  # the graph's (ir.Graph.autocast), printed in the header
        return _Head(ir.Header(**entries), autocast)

    def autocast(self, c: list) -> dict:
        return {"autocast": ir.Autocast(c[0].value, _span(c[0]))}

    def model(self, c: list) -> dict:
        return {"model": self._string(c[0])}

    def device(self, c: list) -> dict:
        return {"device": self._string(c[0]) if c[0].type == "STRING" else c[0].value}

    def costs(self, c: list) -> dict:
        return {"costs": self._string(c[0])}

    def budget(self, c: list) -> dict:
        if len(c) == 1:
            number, unit = c[0]
            return {"budget": _amount(number, unit, SIZE_UNITS, "size")}
        return {"budget": _agreeing(c[0], c[1], "budget")}

    def exact(self, c: list) -> tuple[Token, int]:
        return c[0], _amount(c[0], c[1], EXACT_SIZE_UNITS, "size")

    def counts(self, c: list) -> dict:
        return {"counts": self._string(c[0])}

    def solver(self, c: list) -> dict:
        return {"solver": self._string(c[0])}

    def status(self, c: list) -> dict:
        return {"status": _choose(c[0], STATUSES, "status")}

    def gap(self, c: list) -> dict:
        number = c[0]
        if _decimals(number.value) > GAP_PERCENT_DECIMALS:
            raise _error(
                f"gap `{number}%` has more than {GAP_PERCENT_DECIMALS} decimals",
                number,
                f"gaps are stored to {GAP_STEP} (see ir.Header); write e.g."
                f" `{_rounded(number.value, GAP_PERCENT_DECIMALS)}%`",
            )
        return {"gap": float(Decimal(number.value).scaleb(-2))}

    def solve_time(self, c: list) -> dict:
        number, unit = c
        if unit.value != SOLVE_TIME_UNIT:
            raise _error(
                f"unknown solve-time unit `{unit}`",
                unit,
                f"the solve time is written in seconds, e.g. `2.4 {SOLVE_TIME_UNIT}`",
            )
        if _decimals(number.value) > SECONDS_DECIMALS:
            raise _error(
                f"solve time `{number} {unit}` has more than {SECONDS_DECIMALS} decimal",
                number,
                "solve times are stored to 0.1 s (see ir.Header); write e.g."
                f" `{_rounded(number.value, SECONDS_DECIMALS)} s`",
            )
        return {"solve_seconds": float(number.value)}

    def peak(self, c: list) -> dict:
        number, unit, *exact, where = c
        if not PEAK_AT_RE.fullmatch(where.value):
            raise _error(
                f"bad peak position `{where}`", where, "write `forward:K` or `backward:K` (K: instruction number)"
            )
        nbytes = (
            _agreeing((number, unit), exact[0], "peak") if exact else _amount(number, unit, EXACT_SIZE_UNITS, "size")
        )
        return {"peak_bytes": nbytes, "peak_at": where.value}

    def time(self, c: list) -> dict:
        return {"time_us": c[0]}

    def compute(self, c: list) -> dict:
        return {"compute_us": c[0]}

    def recompute(self, c: list) -> dict:
        return {"recompute_us": c[0]}

    def bandwidth(self, c: list) -> dict:
        return {"bandwidth": _amount(c[0], c[1], BANDWIDTH_UNITS, "bandwidth")}

    def optimizer(self, c: list) -> dict:
        text = self._string(c[0])
        try:
            optimizer = parse_optimizer(text)
        except OptimizerError as e:
            raise _error(f"bad optimizer: {e}", c[0], 'write e.g. `optimizer  "adamw lr=0.001"`') from None
        if optimizer.text() != text:
            raise _error(
                "the optimizer line must give every hyper-parameter as the printer writes it",
                c[0],
                f"write `optimizer  \"{optimizer.text()}\"` (or run `remat fmt`)",
            )
        return {"optimizer": text}

    def update_speed(self, c: list) -> dict:
        device_number, device_unit, host_number, host_unit, overhead = c
        return {
            "device_update": _amount(device_number, device_unit, BANDWIDTH_UNITS, "bandwidth"),
            "host_update": _amount(host_number, host_unit, BANDWIDTH_UNITS, "bandwidth"),
            "host_update_overhead_us": overhead,
        }

    def size(self, c: list) -> tuple[Token, Token]:
        """NUMBER UNIT, read by the rule that holds it: tables take EXACT_SIZE_UNITS
        (a `KB` written for `KiB` is an error), budgets every unit (remat_dsl.plan.units)."""
        return c[0], c[1]

    def duration(self, c: list) -> int:
        return _amount(c[0], c[1], DURATION_UNITS, "duration")

    # --- constraints
    def constraints(self, c: list) -> _Section:
        return _Section("constraints", _items(c))

    def constraint(self, c: list) -> ir.Constraint:
        comments, (kind, value) = _split_comments(c)
        return constraint_of(kind, value, comments)

    # --- the FB-graph
    def inputs(self, c: list) -> _Section:
        items = _items(c)
        constants = [x for x in items if isinstance(x, ir.ConstantInput)]
        if constants and not isinstance(items[-1], ir.ConstantInput):
            late = next(x for x in items[items.index(constants[0]) :] if isinstance(x, ir.ValueDecl))
            raise PlanError(
                f"input '{late.name}' comes after the constant '{constants[0].name}'", span=late.span,
                hint="list the tensor inputs first, then the constants (`NAME = VALUE`)", length=len(late.name),
            )  # fmt: skip
        return _Section("inputs", tuple(replace(d, kind="input") if isinstance(d, ir.ValueDecl) else d for d in items))

    def constant_input(self, c: list) -> ir.ConstantInput:
        comments, (name, value) = _split_comments(c)
        if not (value is None or type(value) in (bool, int, float, str)):
            raise PlanError(
                f"constant input '{name.value}' must be None, True, False, a number or a string", span=_span(name),
                hint="constant inputs are the forward's non-tensor arguments as captured", length=len(name.value),
            )  # fmt: skip
        return ir.ConstantInput(name.value, value, comments, _span(name))

    def parameters(self, c: list) -> _Section:
        return _Section("parameters", tuple(replace(d, kind="parameter") for d in _items(c)))

    def buffers(self, c: list) -> _Section:
        return _Section("buffers", tuple(replace(d, kind="buffer") for d in _items(c)))

    def tangents(self, c: list) -> _Section:
        return _Section("tangents", tuple(replace(d, kind="tangent") for d in _items(c)))

    def value_decl(self, c: list) -> ir.ValueDecl:
        comments, (name, dtype, shape) = _split_comments(c)
        if isinstance(shape, _Shape):  # the symbols ride in `dims` until `_sized` resolves them, every input read
            return ir.ValueDecl("", name.value, (), dtype.value, comments, _span(name), cast(Any, shape))
        return ir.ValueDecl("", name.value, shape, dtype.value, comments, _span(name))

    def tensors(self, c: list) -> _Section:
        return _Section("tensors", _drop_heading(_drop_heading(_items(c), TENSOR_HEADING_V1), TENSOR_HEADING))

    def tensor_decl(self, c: list) -> ir.TensorDecl:
        comments, (name, shape, dtype, size, *producer) = _split_comments(c)
        if isinstance(shape, _Shape):
            raise _symbol_error(shape, "in the tensors section", "a tensor's shape is its size at the largest inputs")
        nbytes = _amount(size[0], size[1], EXACT_SIZE_UNITS, "size")
        op, colon, index = (producer[0] if producer else name).value.rpartition(":")
        op, index = (op, int(index)) if colon else (index, 0)
        return ir.TensorDecl(name.value, shape, dtype.value, nbytes, op, index, comments, _span(name))

    def ops(self, c: list) -> _Section:
        return _Section("ops", _drop_heading(_items(c), OP_HEADING))

    def op(self, c: list) -> ir.Op:
        comments, (name, call, time_us, size, phase, *random) = _split_comments(c)
        temp = _amount(size[0], size[1], EXACT_SIZE_UNITS, "size")
        return ir.Op(
            name.value, _choose(phase, PHASES, "phase"), call.target, call.args, call.kwargs, (), time_us, temp,
            bool(random), comments, _span(name),
        )  # fmt: skip

    def outputs(self, c: list) -> _Section:
        return _Section("outputs", c[0])

    def gradients(self, c: list) -> _Section:
        return _Section("gradients", tuple(c))

    def gradient(self, c: list) -> ir.Gradient:
        return ir.Gradient(c[0].value, c[1], _span(c[0]))

    def updates(self, c: list) -> _Section:
        return _Section("updates", tuple(c))

    def update(self, c: list) -> ir.BufferUpdate:
        return ir.BufferUpdate(c[0].value, c[1].value[1:], _span(c[0]))

    def shape(self, c: list) -> "tuple[int, ...] | _Shape":
        for dim in c:
            size = dim[1] if isinstance(dim, tuple) else dim
            if size is not None and size.value.startswith("-"):
                raise _error(f"negative dimension {size}", size, "dimensions are integers >= 0")
        if all(isinstance(dim, Token) for dim in c):
            return tuple(int(dim) for dim in c)
        return _Shape(tuple(dim if isinstance(dim, tuple) else (None, dim) for dim in c))

    def bounded_dim(self, c: list) -> tuple[Token, Token]:
        return c[0], c[1]

    def named_dim(self, c: list) -> tuple[Token, None]:
        return c[0], None

    # --- arguments
    def ref(self, c: list) -> ir.Ref:
        return ir.Ref(c[0].value[1:], _span(c[0]))

    def sym(self, c: list) -> "ir.Sym | _SizeText":
        if c[0].value.startswith(SYM_PREFIX):
            return ir.Sym(c[0].value)
        if not c[0].value.isidentifier():
            raise _bare_name(c[0])
        return _SizeText(((((c[0],), 1)),), c[0])  # a size symbol, checked once the inputs are read

    def integer(self, c: list) -> int:
        return int(c[0])

    def size_add(self, c: list) -> "_SizeText | int":
        return _size_sum(c[0], c[1], 1)

    def size_sub(self, c: list) -> "_SizeText | int":
        return _size_sum(c[0], c[1], -1)

    def size_mul(self, c: list) -> "_SizeText | int":
        if type(c[0]) is int and type(c[1]) is int:
            return c[0] * c[1]
        first = c[0].first if isinstance(c[0], _SizeText) else c[1].first
        a, b = _as_size(c[0], first), _as_size(c[1], first)
        terms = tuple((x + y, p * q) for x, p in a.terms for y, q in b.terms)
        for _, coefficient in terms:
            _bounded(coefficient, a.first)
        return _SizeText(terms, a.first)

    def floating(self, c: list) -> float:
        return float(c[0])

    def string(self, c: list) -> str:
        return self._string(c[0])

    def none(self, c: list) -> None:
        return None

    def true(self, c: list) -> bool:
        return True

    def false(self, c: list) -> bool:
        return False

    def pos_inf(self, c: list) -> float:
        return float("inf")

    def neg_inf(self, c: list) -> float:
        return float("-inf")

    def nan(self, c: list) -> float:
        return float("nan")

    def call(self, c: list) -> ir.Call:
        target, *items = c
        args = [x for x in items if not isinstance(x, _Kwarg)]
        kwargs = [x for x in items if isinstance(x, _Kwarg)]
        if kwargs and not isinstance(items[-1], _Kwarg):
            first = kwargs[0].name
            raise _error("positional argument after a keyword argument", first, "put keyword arguments last")
        return ir.Call(target.value, tuple(args), tuple((k.name.value, k.value) for k in kwargs))

    def kwarg(self, c: list) -> _Kwarg:
        return _Kwarg(c[0], c[1])

    def list_arg(self, c: list) -> ir.ListArg:
        return ir.ListArg(tuple(c))

    def tuple_arg(self, c: list) -> ir.TupleArg:
        return ir.TupleArg(tuple(c))

    @staticmethod
    def _string(token: Token) -> str:
        try:
            return json.loads(token.value)
        except json.JSONDecodeError as e:
            raise _error(f"bad string: {e.msg}", token, 'strings use JSON escapes: \\" \\\\ \\n \\t \\uXXXX') from None

    # --- the digest
    def digest(self, c: list) -> ir.Digest:
        graph, *chunks = c
        return ir.Digest(graph.value, tuple(chunks), _span(graph))

    def digest_items(self, c: list) -> str:
        return c[0].value

    # --- the schedule
    def forward(self, c: list) -> _Section:
        return _Section("forward", _items(c))

    def backward(self, c: list) -> _Section:
        return _Section("backward", _items(c))

    def instruction(self, c: list) -> ir.Instruction:
        comments, (verb, target, *rest) = _split_comments(c)
        verb_text = _choose(verb, ir.VERBS, "verb", VERB_ALIASES)
        right = ir.VERB_STREAM[verb_text]  # the verb says its stream; `on STREAM` may repeat it
        stream = rest.pop(0) if rest and rest[0].type != "COMMENT" else None
        if stream is not None and stream.value not in ir.STREAMS:
            raise _error(
                f"unknown stream `{stream}`", stream,
                f"`{verb_text}` runs on `{right}`: write `{verb_text} {target}` "
                f"(the streams are {_one_of(ir.STREAMS)})",
            )  # fmt: skip
        if stream is not None and stream.value != right:
            raise _error(
                f"`{verb_text}` runs on stream `{right}`, not `{stream}`", stream, f"write `{verb_text} {target}`"
            )
        text = _comment_text(rest[0]) if rest else None
        return ir.Instruction(verb_text, target.value, right, comments, text, _span(verb))


# ---------------------------------------------------------------------------
# Syntax errors: Lark exceptions -> PlanError
# ---------------------------------------------------------------------------

_EXAMPLE_HEAD = """remat-plan 1
header
  model "m"
  device cpu
  budget 1 KiB
  counts "c"
  solver "s"
  status optimal
  peak 0 B at forward:0
  time 0.000 ms
  compute 0.000 ms
  recompute 0.000 ms
  bandwidth 1 GB/s
inputs
parameters
tensors
ops
"""
_EXAMPLE_SCHEDULE = _EXAMPLE_HEAD + "outputs\n  None\ngradients\nforward\n"

EXAMPLES = {
    "missing-on": [_EXAMPLE_SCHEDULE + "  compute a b\n", _EXAMPLE_SCHEDULE + "  # c\n  compute a b\n"],
    "size-unit": [_EXAMPLE_HEAD.replace("budget 1 KiB", "budget 1024")],
    "duration-unit": [_EXAMPLE_HEAD.replace("time 0.000 ms", "time 0.1")],
    "bandwidth-unit": [_EXAMPLE_HEAD.replace("1 GB/s", "1000000000")],
    "gap-value": [_EXAMPLE_HEAD.replace("optimal\n", f"optimal\n  gap {value}\n") for value in ("x", "")],
    "gap-unit": [_EXAMPLE_HEAD.replace("optimal\n", f"optimal\n  gap 1{value}\n") for value in ("", " x")],
    "solve-time-value": [
        _EXAMPLE_HEAD.replace("optimal\n", f"optimal\n{gap}  solve-time {value}\n")
        for gap in ("", "  gap 1%\n")
        for value in ("x", "")
    ],
    "solve-time-unit": [
        _EXAMPLE_HEAD.replace("optimal\n", f"optimal\n{gap}  solve-time 1\n") for gap in ("", "  gap 1%\n")
    ],
    "one-tuple": [_EXAMPLE_HEAD + "outputs\n  (%a)\n"],
    "negative": (
        [
            _EXAMPLE_HEAD + f"{comment}  o = f({args})  {time}  {temp}  forward\n"
            for comment in ("", "  # c\n")
            for args in ("", "%a", "%a, 1")
            for time, temp in (("-0.010 ms", "0 B"), ("0.010 ms", "-4 B"))
        ]
        + [
            _EXAMPLE_HEAD.replace("tensors\n", f"tensors\n{comment}  t  [1]  float32  -4 B  t\n")
            for comment in ("", "  # c\n")
        ]
        + [
            _EXAMPLE_HEAD.replace("time 0.000 ms", "time -0.001 ms"),
            _EXAMPLE_HEAD.replace("budget 1 KiB", "budget -1 KiB"),
        ]
    ),
    "after-size": (
        [
            _EXAMPLE_HEAD.replace("tensors\n", "tensors\n" + lines)
            for lines in (
                "  t  [1]  float32  4 B\n",
                "  t  [1]  float32  4 B\n  u  [1]  float32  4 B  u\n",
                "  # c\n  t  [1]  float32  4 B\n  u  [1]  float32  4 B  u\n",
            )
        ]
        + [
            _EXAMPLE_HEAD + lines
            for lines in (
                "  o = f()  0.010 ms  0 B\n",
                "  o = f()  0.010 ms  0 B\n  p = f()  0.010 ms  0 B  forward\n",
                "  # c\n  o = f()  0.010 ms  0 B\n  p = f()  0.010 ms  0 B  forward\n",
            )
        ]
    ),
}


def _missing_on(line: str) -> tuple[str, str]:
    words = line.split("#")[0].split()
    stream = ir.VERB_STREAM.get(words[0]) if words else None
    if stream and len(words) >= 2:
        return (
            "expected the end of the instruction or `on STREAM`",
            f"write `{words[0]} {words[1]}` (its stream, `{stream}`, is implied)",
        )
    return "expected the end of the instruction or `on STREAM`", "write `VERB TARGET`, e.g. `compute fc1`"


def _after_size(line: str) -> tuple[str, str] | None:
    """A tensor or op line that ends too early after its size (a lost unit or column)."""
    if "=" in line:
        return "expected the phase after the temp size", "an op line ends `TIME  TEMP  forward|backward  [random]`"
    if "[" in line:
        return (
            "expected the producer after the size",
            "a tensor line is `NAME  [SHAPE]  DTYPE  SIZE  PRODUCER`; sizes need a unit (B, KiB, MiB, GiB)",
        )
    return None


def _header_value(line: str) -> str:
    """What follows the key of a header line, a comment and outer blanks aside."""
    match = re.match(r"\s*\S+\s+([^#]*)", line)
    return match.group(1).strip() if match else ""


def _amount_value(line: str, what: str, key: str, unit: str, hint: str) -> tuple[str, str]:
    """The message for a bad `gap` or `solve-time` value: missing, negative, unitless or other."""
    value = _header_value(line)
    if not value:
        return f"expected the {what} after `{key}`", hint
    if value.startswith("-"):
        return f"a {what.split(' (')[0]} cannot be negative (`{value}`)", hint
    if re.fullmatch(r"[0-9]+(\.[0-9]+)?", value):
        return f"a {what.split(' (')[0]} needs {unit}", hint
    return f"bad {what.split(' (')[0]} `{value}`", hint


def _gap_value(line: str) -> tuple[str, str]:
    hint = "write the relative MIP gap in percent, e.g. `gap         1.23%` (leave the line out when there is none)"
    return _amount_value(line, "gap (in percent)", "gap", "a `%`", hint)


def _solve_time_value(line: str) -> tuple[str, str]:
    hint = "write the seconds spent solving, e.g. `solve-time  2.4 s` (leave the line out when unknown)"
    return _amount_value(line, "solve time (in seconds)", "solve-time", "a unit", hint)


HEADER_VALUE_LABELS = ("gap-", "solve-time-")  # errors located on the whole value of the line

# label -> (the source line -> message and hint, or None where the label does not fit).
EXAMPLE_MESSAGES: dict[str, Callable[[str], tuple[str, str] | None]] = {
    "missing-on": _missing_on,
    "size-unit": lambda line: ("a size needs a unit", "write e.g. `4096 B` or `4 KiB`; units are B, KiB, MiB, GiB"),
    "duration-unit": lambda line: ("a duration needs a unit", "write milliseconds, e.g. `0.120 ms` (or us, s)"),
    "bandwidth-unit": lambda line: ("a bandwidth needs a unit", "write e.g. `12 GB/s` or `12000000000 B/s`"),
    "one-tuple": lambda line: ("a one-element tuple needs a trailing comma", "write `(x,)`"),
    "negative": lambda line: (
        "durations and sizes cannot be negative",
        "times and sizes are measured, >= 0: re-run `remat plan` (or `remat profile`)",
    ),
    "gap-value": _gap_value,
    "gap-unit": _gap_value,
    "solve-time-value": _solve_time_value,
    "solve-time-unit": _solve_time_value,
    "after-size": _after_size,
}

TERMINAL_WORDS = {
    "NAME": "a name",
    "REF": "a `%name` reference",
    "BARE": "a word",
    "UNIT": "a unit",
    "NUMBER": "a number",
    "INT": "an integer",
    "FLOAT": "a number",
    "STRING": 'a "quoted string"',
    "COMMENT": "a comment",
    "LINE_COMMENT": "a comment line",
    "RANDOM": "`random`",
    "_NL": "a line starting at column 1",
    "_NLI": "an indented line",
    "$END": "the end of the file",
}
ARG_STARTERS = {"REF", "INT", "FLOAT", "STRING"}
LINE_STARTS = {"_NL", "_NLI", "LINE_COMMENT", "$END"}


def _position_only(state: Any) -> Any:
    """Compare parser states by LALR state alone: the stack depth varies with optional sections."""
    return getattr(state, "position", state)


def _parse_example(text: str) -> Tree:
    try:
        return _lark().parse(text)
    except UnexpectedInput as error:
        error.state = _position_only(error.state)
        raise


def _match_example(error: UnexpectedInput) -> str | None:
    error.state = _position_only(getattr(error, "state", None))
    if error.state is None:
        return None
    return error.match_examples(_parse_example, EXAMPLES, use_accepts=True)


def _terminal_word(name: str) -> str:
    if name in TERMINAL_WORDS:
        return TERMINAL_WORDS[name]
    pattern = _lark().get_terminal(name).pattern
    return f"`{pattern.value}`" if isinstance(pattern, PatternStr) else name.lower()


def _expected_words(expected: set[str]) -> str:
    names = set(expected)
    words = []
    if ARG_STARTERS <= names:
        names -= ARG_STARTERS | {"NAME", "LPAR", "LSQB"} | {n for n in names if _is_arg_keyword(n)}
        words.append("an argument")
    words += sorted({_terminal_word(name) for name in names})
    return words[0] if len(words) == 1 else ", ".join(words[:-1]) + " or " + words[-1]


def _is_arg_keyword(name: str) -> bool:
    pattern = _lark().get_terminal(name).pattern if name in _terminal_names() else None
    return isinstance(pattern, PatternStr) and pattern.value in ("None", "True", "False", "inf", "-inf", "nan")


@functools.cache
def _terminal_names() -> frozenset[str]:
    return frozenset(t.name for t in _lark().terminals)


def _keywords(expected: set[str]) -> list[str]:
    """The literal words among the expected terminals (section names, header keys, ...)."""
    words = []
    for name in expected & _terminal_names():
        pattern = _lark().get_terminal(name).pattern
        if isinstance(pattern, PatternStr) and pattern.value[:1].isalpha():
            words.append(pattern.value)
    return sorted(words)


def _found(token: Token, expected: set[str]) -> str:
    if token.type in ("_NL", "_NLI"):
        return TERMINAL_WORDS[token.type] if expected <= LINE_STARTS else "the end of the line"
    if token.type == "$END":
        return "the end of the file"
    if token.type in ("COMMENT", "LINE_COMMENT"):
        return "a comment"
    return f"`{token.value}`"


def _section_order(text: str) -> tuple[str, ...]:
    """The order of the sections in the format `text` declares (for hints)."""
    return SECTIONS_V1 if re.search(r"^remat-plan 1[ \t]*\r?$", text, re.M) else SECTIONS


def _token_hint(token: Token, expected: set[str], order: tuple[str, ...] = SECTIONS) -> str | None:
    """A concrete fix for the commonest ways to end up with `token` where `expected` was due."""
    keywords = _keywords(expected)
    if _in_size(expected):
        return SIZE_HINT
    if token.type in ("COMMENT", "LINE_COMMENT"):
        return (
            "comments go on their own line above an item of inputs, parameters, buffers, "
            "tangents, tensors, ops, forward or backward (or at the top or end of the file); "
            "only schedule instructions keep a comment after them"
        )
    if token.type == "_NL" and "_NLI" in expected:
        return "the items of a section are indented under its name"
    if token.type == "_NLI" and "_NL" in expected:
        return "this section takes no more items here; section names start at column 1"
    if token.type == "REF" and "NAME" in expected:
        return f"`%` marks references inside arguments; write `{token.value[1:]}`"
    if token.type != "REF" and "REF" in expected and "NAME" not in expected:
        return f"refer to the value with `%`: write `%{token.value}`"
    if token.type == "$END":
        return "the file ends early; a plan has the sections " + ", ".join(s for s in order if s != "constraints")
    is_section = set(keywords) & set(SECTIONS)
    if token.value in HEADER_KEYS and keywords and set(keywords) <= set(HEADER_KEYS):
        return (
            "the header's lines come once each, in this order: "
            + ", ".join(HEADER_KEYS)
            + " (autocast, costs, gap, solve-time, optimizer and update-speed may be left out)"
        )
    if token.value in SECTIONS and is_section:
        return "sections come in this order: " + ", ".join(order)
    guess = _suggest(token.value, keywords) if token.value[:1].isalpha() else None
    if guess:
        return f"did you mean `{guess}`?"
    if is_section:
        return f"expected a section name ({_one_of(keywords)}); the items of a section are indented under it"
    return None


def _token_message(token: Token, expected: set[str]) -> str:
    if token.type in ("COMMENT", "LINE_COMMENT") and token.type not in expected:
        return "a comment cannot go here"
    word = token.value[:1].isalpha() and token.type not in ("COMMENT", "LINE_COMMENT")
    if word and token.value not in SECTIONS and set(_keywords(expected)) & set(SECTIONS):
        return f"unknown section `{token.value}`"
    return f"expected {_expected_words(expected)}, found {_found(token, expected)}"


def _describe(error: UnexpectedInput, order: tuple[str, ...]) -> tuple[str, str | None]:
    if isinstance(error, UnexpectedToken):
        expected = set(error.expected)
        return _token_message(error.token, expected), _token_hint(error.token, expected, order)
    char = error.char if isinstance(error, UnexpectedCharacters) else "?"
    # LALR raises UnexpectedToken or UnexpectedCharacters, which has `allowed`
    allowed = error.allowed  # type: ignore[attr-defined]
    hint = SIZE_HINT if _in_size(set(allowed or ())) else None
    return f"unexpected character `{char}`, expected {_expected_words(set(allowed or ()))}", hint


SIZE_HINT = (
    "a size expression (`B*S`, `S - 1`, `4*B*S + 2`) joins integers and the size symbols the inputs declare with"
    " +, - and *; it has no /, **, floats, calls or references"
)


def _in_size(expected: set[str]) -> bool:
    """Whether the parser stood inside a size expression (NOTE: [Size expressions] in
    remat_dsl/plan/ir.py): after an operator, or after an operand where one may follow."""
    return expected == {"NAME", "INT"} or {"STAR", "PLUS", "MINUS"} <= expected


def _end_of_text(text: str) -> tuple[int, int]:
    body = text.rstrip("\r\n")
    return body.count("\n") + 1, len(body.split("\n")[-1]) + 1


def _where(error: UnexpectedInput, text: str) -> tuple[int, int, int]:
    """Line, column and caret length of the culprit."""
    if not isinstance(error, UnexpectedToken):
        return error.line, error.column, 1
    token = error.token
    if token.type == "$END":
        return (*_end_of_text(text), 1)
    if token.type in ("_NL", "_NLI"):
        if set(error.expected) <= LINE_STARTS:  # wanted another kind of line: point at it
            return token.end_line, token.end_column, 1
        return token.line, token.column, 1  # the line ended early: point at its end
    return token.line, token.column, max(1, len(token.value))


def _number_before(line: str, col: int) -> tuple[int, int] | None:
    """Column and length of the number that ends just before column `col`, if any."""
    match = re.search(r"[0-9.]+(?=[ \t]*$)", line[: col - 1])
    return (match.start() + 1, len(match.group())) if match else None


def _column_one_word(
    error: UnexpectedInput, source_line: str, col: int, order: tuple[str, ...]
) -> tuple[str, str, int] | None:
    """Message, hint and length for a wrong word at column 1 (a section name is due there).

    Covers a misspelled section name, also one that starts with a real one (`backwards`:
    the lexer reads `backward` and stumbles on `s`), and an instruction left unindented.
    """
    if not isinstance(error, UnexpectedToken) or error.token.type in ("_NL", "_NLI", "$END"):
        return None
    match = re.match(r"[A-Za-z_][^\s#]*", source_line)
    if not match or col > match.end() or match.group() in SECTIONS:
        return None
    word = match.group()
    if word in ir.VERBS or word in VERB_ALIASES:
        return (
            "this instruction starts at column 1, where a section name belongs",
            f"indent the items of a section: write `  {source_line.strip()}`",
            len(word),
        )
    guess = _suggest(word, SECTIONS)
    hint = f"did you mean `{guess}`?" if guess else "sections come in this order: " + ", ".join(order)
    return f"unknown section `{word}`", hint, len(word)


def _syntax_error(error: UnexpectedInput, text: str, path: str | None) -> PlanError:
    line, col, length = _where(error, text)
    label = _match_example(error)
    source_line = text.split("\n")[line - 1] if 0 < line <= text.count("\n") + 1 else ""
    order = _section_order(text)
    column_one = _column_one_word(error, source_line, col, order)
    hint: str | None
    if column_one is not None and not label:
        message, hint, length = column_one
        return PlanError(message, span=ir.Span(line, 1), hint=hint, path=path, source=text, length=length)
    if label == "missing-on":
        length = 1  # point at where `on` belongs
    elif label and label.startswith(HEADER_VALUE_LABELS) and _header_value(source_line):
        value = re.match(r"\s*\S+\s+", source_line)  # underline the whole value
        assert value is not None  # _header_value found a value after the key
        col, length = value.end() + 1, len(_header_value(source_line))
    elif label and label.endswith("-unit"):
        col, length = _number_before(source_line, col) or (col, length)  # the number lacking a unit
    message, hint = (EXAMPLE_MESSAGES[label](source_line) if label else None) or _describe(error, order)
    return PlanError(message, span=ir.Span(line, col), hint=hint, path=path, source=text, length=length)
