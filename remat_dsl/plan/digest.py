"""The digest that seals a plan's graph sections.

NOTE: [Graph digest]
The graph sections (inputs, parameters, buffers, tangents, tensors, ops, outputs,
gradients, updates) describe the model as it was captured; only the schedule, the
header's budget and the comments are the user's to edit.  A plan that says a parameter
has no gradient, or that an op computes something else, trains wrong.  So the printer
ends every plan with a `digest` section::

    digest
      graph  sha256:5a1f...                      # 128 bits of SHA-256 over every item
      items  AbC-9x...                           # 12 bits per item, base64url, 2 chars each

The header's `autocast` line, when there is one, is the first item: the graph was
captured under it (ir.Autocast), and the generated module checks the caller's autocast
state against it.  Its text lines come next (`header_items`): the model, the device, what
predicted the costs, what the budget counts and the solver, which a reviewer reads as what
the plan is for and the generated module carries (as data, NOTE: [Plan text as data] in
remat_dsl.codegen.generate).  An item is one line of a graph section (one declaration, tensor, op, gradient or update;
the whole `outputs` value), written in a layout-free form (`item_texts`), so `remat fmt`
and future layouts do not change it.  The verifier (remat_dsl.check.verify) recomputes both: a
different `graph` hash means the graph was edited; the first item whose 12-bit hash
differs from the stored one is the first edited line (a deleted line shows up as the
line that took its place).  The hash is not a signature: it catches edits, not forgery;
`remat check --model` compares the graph with a fresh capture of the model itself.
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import dataclass

from remat_dsl.plan import ir

ITEM_BITS = 12
ITEM_CHARS = 2  # base64url characters per item
GRAPH_HEX = 32  # hex digits of the graph hash (128 bits)
CHUNK_ITEMS = 48  # items per `items` line: 96 characters
PREFIX = "sha256:"


@dataclass(frozen=True)
class Item:
    """One line of a graph section: its section, its text, where it is (None if made in code)."""

    section: str
    text: str
    span: ir.Span | None


def canonical_arg(arg: ir.Arg) -> str:
    """A layout-free text of an argument (exact for floats, strings and nesting)."""
    if arg is None or isinstance(arg, bool):
        return repr(arg)
    if isinstance(arg, int):
        return str(arg)
    if isinstance(arg, float):
        return repr(arg) if math.isfinite(arg) else str(arg)
    if isinstance(arg, str):
        return json.dumps(arg)
    if isinstance(arg, ir.Ref):
        return "%" + arg.name
    if isinstance(arg, ir.Sym):
        return arg.name
    if isinstance(arg, ir.Call):
        parts = [canonical_arg(a) for a in arg.args] + [f"{k}={canonical_arg(v)}" for k, v in arg.kwargs]
        return f"{arg.target}({', '.join(parts)})"
    if isinstance(arg, ir.ListArg):
        return "[" + ", ".join(canonical_arg(a) for a in arg.items) + "]"
    if isinstance(arg, ir.TupleArg):
        return "(" + "".join(canonical_arg(a) + ", " for a in arg.items) + ")"
    if isinstance(arg, ir.SizeExpr):  # NOTE: [Size expressions] in remat_dsl/plan/ir.py
        return "size(" + " ".join(f"{c}*{'*'.join(symbols) or 1}" for symbols, c in arg.terms) + ")"
    raise ValueError(f"cannot digest argument {arg!r}")


HEADER_TEXTS = ("model", "device", "costs", "counts", "solver", "optimizer")  # the header text lines the digest seals


def header_items(header: ir.Header) -> list[Item]:
    """The header's text lines as items (NOTE: [Graph digest]); `costs` only when present."""
    values = {key: getattr(header, key) for key in HEADER_TEXTS}
    return [Item("header", f"{key} {json.dumps(value)}", None) for key, value in values.items() if value is not None]


def items(
    graph: ir.Graph, outputs_span: ir.Span | None = None, *, costs: bool = True, header: ir.Header | None = None
) -> list[Item]:
    """The graph's items in document order (see NOTE: [Graph digest]).

    costs: include each op's measured time and temporary bytes (False compares the
    structure alone, as `remat check --model` does against a fresh capture).
    header: the plan's header, whose text lines follow the autocast item (None: left out).
    """
    result = [Item("header", f"autocast {graph.autocast.dtype}", graph.autocast.span)] if graph.autocast else []
    result += header_items(header) if header is not None else []
    for section, values in (
        ("inputs", graph.inputs),
        ("parameters", graph.parameters),
        ("buffers", graph.buffers),
        ("tangents", graph.tangents),
    ):
        result += [Item(section, f"{v.kind} {v.name} {v.dtype}{_decl_shape(v)}", v.span) for v in values]
        if section == "inputs":
            result += [Item(section, f"constant {c.name} = {canonical_arg(c.value)}", c.span) for c in graph.constants]
    result += [
        Item("tensors", f"{t.name} {list(t.shape)} {t.dtype} {t.nbytes} {t.producer}:{t.index}", t.span)
        for t in graph.tensors
    ]
    for op in graph.ops:
        call = canonical_arg(ir.Call(op.target, op.args, op.kwargs))
        cost = f" {op.time_us}us {op.temp_bytes}B" if costs else ""
        result.append(Item("ops", f"{op.name} = {call}{cost} {op.phase} {op.random}", op.span))
    result.append(Item("outputs", canonical_arg(graph.outputs), outputs_span))
    result += [Item("gradients", f"{g.parameter} = {canonical_arg(g.value)}", g.span) for g in graph.gradients]
    result += [Item("updates", f"{u.buffer} = %{u.tensor}", u.span) for u in graph.updates]
    return result


def _sha(text: str) -> bytes:
    return hashlib.sha256(text.encode("utf-8")).digest()


def graph_hash(graph_items: list[Item]) -> str:
    """`sha256:` and 32 hex digits over every item, section by section."""
    text = "\n".join(f"{item.section}\t{item.text}" for item in graph_items)
    return PREFIX + _sha(text).hex()[:GRAPH_HEX]


def item_hash(item: Item) -> int:
    """The item's 12-bit hash."""
    digest = _sha(f"{item.section}\t{item.text}")
    return int.from_bytes(digest[:2], "big") >> (16 - ITEM_BITS)


def encode_items(hashes: list[int]) -> tuple[str, ...]:
    """12-bit hashes as base64url text, CHUNK_ITEMS items (96 characters) a line."""
    chunks = []
    for start in range(0, len(hashes), CHUNK_ITEMS):
        part = hashes[start : start + CHUNK_ITEMS]
        chunks.append("".join(_ALPHABET[h >> 6] + _ALPHABET[h & 63] for h in part))
    return tuple(chunks)


def decode_items(chunks: tuple[str, ...]) -> list[int] | None:
    """The hashes `encode_items` wrote, or None when the text is not such an encoding."""
    text = "".join(chunks)
    if len(text) % ITEM_CHARS or any(c not in _INDEX for c in text):
        return None
    return [(_INDEX[text[i]] << 6) | _INDEX[text[i + 1]] for i in range(0, len(text), ITEM_CHARS)]


_ALPHABET = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"  # base64url
_INDEX = {c: i for i, c in enumerate(_ALPHABET)}


def digest_of(graph: ir.Graph, header: ir.Header) -> ir.Digest:
    """The digest the printer writes for `graph` under `header`."""
    graph_items = items(graph, header=header)
    return ir.Digest(graph_hash(graph_items), encode_items([item_hash(i) for i in graph_items]))


def _decl_shape(decl: ir.ValueDecl) -> list:
    """A declaration's shape as the digest reads it: its sizes, each with its size symbol
    where one varies (NOTE: [Sizes that vary] in remat_dsl/plan/ir.py)."""
    if not decl.dims:
        return list(decl.shape)
    return [size if sym is None else f"{sym}<={size}" for size, sym in zip(decl.shape, decl.dims)]
