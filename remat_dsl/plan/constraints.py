"""The constraint language: what a person requires of a plan, whatever the solver.

    keep        "transformer.h.*.attn.*"     # never recompute these tensors
    recompute   "*.mlp.act*"                 # do not keep them for the backward: recompute
    offload     "transformer.h.0.*"          # keep them on the host between forward and backward
    no-offload  "*.ln_*"                     # never offload these
    budget      2 GiB                        # the budget when --budget is not given

Constraints live in a plan's `constraints` section (so `remat plan --from old.plan`
re-solves with them) or in a separate file of the same lines (`--constraints FILE`).
Patterns are globs (fnmatch) over tensor names.

NOTE: [Applying constraints]
Solvers decide an op order; constraints edit that order before the one lowering, and add
transfers after it, so every solver honours them the same way:
* keep and offload: a producer of a matching tensor runs once; its later runs are
  dropped from the order, so the tensor lives from its compute to its last use;
* recompute: a matching tensor used by the backward gets its producer run again right
  before its first backward use, so the lowering frees it after its last forward use;
* offload: after lowering, a matching tensor that crosses from forward to backward is
  offloaded after its last forward use (wait, delete) and prefetched before its first
  backward use (wait just before it).
The exact simulation then checks the result against the budget.
"""

from __future__ import annotations

import difflib
import fnmatch
import functools
from dataclasses import replace
from typing import Any

from lark import Token

from remat_dsl.plan import ir
from remat_dsl.plan.errors import PlanError, RematError

# --- reading -----------------------------------------------------------------


def read_constraints(path: str) -> tuple[ir.Constraint, ...]:
    """Parse a constraints file (grammar/constraints.lark).  Raises PlanError
    (file:line:col, hint) or RematError (the file cannot be read)."""
    from lark.exceptions import UnexpectedInput

    from remat_dsl.plan.files import read_text
    from remat_dsl.plan.parser import constraint_of

    text = read_text(path, "constraints file")
    try:
        tree = _lark().parse(text)
    except UnexpectedInput as error:
        raise _syntax_error(error, text, path) from None
    result = []
    for line in tree.children:
        if line.data != "constraint":
            continue
        kind, value = line.children[:2]
        if not isinstance(value, Token):  # a size: NUMBER [UNIT]
            value = (value.children[0], value.children[1] if len(value.children) > 1 else None)
        try:
            constraint = constraint_of(kind, value)
        except PlanError as error:
            raise error.with_source(path, text) from None
        result.append(replace(constraint, source=f"{path}:{kind.line}"))
    return tuple(result)


@functools.cache
def _lark():
    """The parser of grammar/constraints.lark (NOTE: [Parser tables] in remat_dsl/plan/parser.py)."""
    from remat_dsl.plan import tables

    return tables.parser("constraints")


def _syntax_error(error, text: str, path: str) -> PlanError:
    """A line the grammar refuses: a kind without its value, or a value of the wrong kind."""
    line = text.split("\n")[error.line - 1] if 0 < error.line <= text.count("\n") + 1 else ""
    words = line.split("#")[0].split()
    kind = words[0] if words else ""
    col = line.index(kind) + 1 if kind else error.column
    where: dict[str, Any] = dict(path=path, source=text)
    if kind and kind not in ir.CONSTRAINT_KINDS:
        close = difflib.get_close_matches(kind, ir.CONSTRAINT_KINDS, n=1)
        guess = f"did you mean `{close[0]}`? " if close else ""
        return PlanError(
            f"unknown constraint `{kind}`",
            span=ir.Span(error.line, col),
            length=len(kind),
            hint=f"{guess}expected keep, recompute, offload, no-offload or budget",
            **where,
        )
    if kind == "budget":
        return PlanError(
            "`budget` takes a size",
            span=ir.Span(error.line, error.column),
            hint="write for example `budget 2 GiB`",
            **where,
        )
    if kind:
        return PlanError(
            f"`{kind}` takes a quoted glob pattern",
            span=ir.Span(error.line, col),
            length=len(kind),
            hint=f'write for example `{kind} "transformer.h.*.attn.*"`',
            **where,
        )
    return PlanError(
        "expected a constraint",
        span=ir.Span(error.line, error.column),
        hint='one a line: keep, recompute, offload or no-offload "GLOB", or budget SIZE',
        **where,
    )


def located(constraints: tuple[ir.Constraint, ...], path: str) -> tuple[ir.Constraint, ...]:
    """Constraints of a plan file, with `source` set to `PATH:LINE` for messages."""
    return tuple(replace(c, source=f"{path}:{c.span.line}" if c.span else path) for c in constraints)


def budget_of(constraints: tuple[ir.Constraint, ...]) -> int | None:
    """The last `budget` constraint's size in bytes, or None."""
    sizes = [c.size for c in constraints if c.kind == "budget"]
    return sizes[-1] if sizes else None


# --- matching and conflicts ----------------------------------------------------


def matching(graph: ir.Graph, constraints, kind: str) -> dict[str, ir.Constraint]:
    """tensor name -> the first constraint of `kind` whose pattern matches it."""
    result: dict[str, ir.Constraint] = {}
    for c in constraints:
        if c.kind != kind:
            continue
        for t in graph.tensors:
            if fnmatch.fnmatchcase(t.name, c.pattern):
                result.setdefault(t.name, c)
    return result


def unmatched(graph: ir.Graph, constraints) -> list[str]:
    """`FILE:LINE:COL: warning: ...` for every pattern that matches no tensor of `graph`
    (a typo, or a pattern written for another model)."""
    names = [t.name for t in graph.tensors]
    warnings = []
    for c in constraints:
        if c.kind == "budget" or any(fnmatch.fnmatchcase(name, c.pattern) for name in names):
            continue
        where = f"{_where(c)}:{c.span.col}" if c.source and c.span else _where(c)
        warnings.append(f"{where}: warning: `{c.kind} \"{c.pattern}\"` matches no tensor of the graph")
    return warnings


CONFLICTS = (("keep", "recompute"), ("offload", "no-offload"), ("offload", "recompute"))


def check_conflicts(graph: ir.Graph, constraints) -> None:
    """Raise RematError naming two constraint lines that cannot both hold for one tensor."""
    for first, second in CONFLICTS:
        a, b = matching(graph, constraints, first), matching(graph, constraints, second)
        both = sorted(set(a) & set(b))
        if both:
            raise RematError(
                f"error: constraints conflict on tensor '{both[0]}'"
                + (f" and {len(both) - 1} more" if len(both) > 1 else "")
                + f": {_where(a[both[0]])} says `{first} \"{a[both[0]].pattern}\"`, "
                f"{_where(b[both[0]])} says `{second} \"{b[both[0]].pattern}\"`",
                hint=f"narrow one of the two patterns or remove one line; a tensor cannot be both {first} and {second}",
            )


def _where(c: ir.Constraint) -> str:
    return c.source or (f"line {c.span.line}" if c.span else "a constraint")


def constraint_lines(constraints) -> str:
    """`FILE:LINE` of every pattern constraint, for messages about all of them."""
    return ", ".join(_where(c) for c in constraints if c.kind != "budget")


# --- checking a plan against its own constraints -----------------------------


def check_plan(plan: ir.Plan) -> None:
    """Raise PlanError at the first instruction that breaks the plan's own constraints:
    a `recompute` of a kept tensor's producer, an `offload` of a no-offload tensor."""
    graph, constraints = plan.graph, plan.constraints
    if not constraints:
        return
    keep = matching(graph, constraints, "keep")
    kept_ops = {t.producer: keep[t.name] for t in graph.tensors if t.name in keep}
    no_offload = matching(graph, constraints, "no-offload")
    for ins in (*plan.forward, *plan.backward):
        if ins.verb == "recompute" and ins.target in kept_ops:
            c = kept_ops[ins.target]
            raise PlanError(
                f"'{ins.target}' is recomputed, but the constraint `keep \"{c.pattern}\"` (line"
                f" {c.span.line if c.span else '?'}) says its output is never recomputed",
                span=ins.span,
                hint="delete this recompute and the delete before it, or narrow the keep pattern",
                length=len(ins.verb),
            )
        if ins.verb == "offload" and ins.target in no_offload:
            c = no_offload[ins.target]
            raise PlanError(
                f"'{ins.target}' is offloaded, but the constraint `no-offload \"{c.pattern}\"` (line"
                f" {c.span.line if c.span else '?'}) forbids it",
                span=ins.span,
                hint="remove this offload with its wait, delete, prefetch and wait, or narrow the pattern",
                length=len(ins.verb),
            )
