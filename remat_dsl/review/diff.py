"""Reviewing plan changes: `remat diff`, `remat git-diff` (git's external diff) and `remat textconv`.

`remat diff OLD NEW` prints a semantic summary, then the unified line diff of the two
canonical texts (`difflib`, so layout-only edits never show up as changes):

- budget, predicted peak (bytes, where) and predicted time (microseconds, shown in ms)
  before and after, from simulating each plan (`remat_dsl.check.replay`);
- the solver's status and, when either plan has one, its MIP gap, from the headers.  The
  header's `solve-time` is how long the solver ran, not a property of the plan: a
  change of it is one `note:` line, it is left out of the line diff, and `--exit-code`
  ignores it (`printer.without_solve_time`);
- tensors whose policy changed.  A tensor is `offloaded` when the schedule has an
  `offload` of it, `recomputed` when it has a `recompute` of its producer (both when it
  has both), `kept` otherwise (computed once, never deleted-then-recomputed);
- operations (instructions, named `VERB TARGET` within their section) added, removed or
  moved.  The k-th `VERB TARGET` of a section is matched with the k-th one of the same
  section of the other plan; of the matched ones, those outside a longest common
  subsequence of the two orders are `moved` (their relative position changed).

Positions are `SECTION:K`, the 1-based index of the instruction (as in `peak_at`).
The output is plain text (no colors), so it reads the same in a pipe, a pager or CI.

Git integration (see docs/reviewing.md, "In git"): with `*.plan diff=remat` in
.gitattributes, `diff.remat.command = remat git-diff` makes `git diff` print this summary
and `diff.remat.textconv = remat textconv` makes `git log -p` diff a summary header plus
the canonical text.  In those two git modes a file that is not a valid plan is shown
as its raw text with a note instead of failing, since git stops on a failing driver.
"""

from __future__ import annotations

import difflib
import os
from collections import Counter
from dataclasses import dataclass
from decimal import Decimal

from remat_dsl.plan import ir
from remat_dsl.plan.errors import PlanError
from remat_dsl.plan.files import read_text

KEPT, RECOMPUTED, OFFLOADED = "kept", "recomputed", "offloaded"
# The label a verb of ir.INSTRUCTIONS gives the tensors it acts on in `policies` (a verb of
# an op: the op's outputs), None for none; tests/test_instructions.py checks the keys.
POLICIES = {
    "compute": None,
    "recompute": RECOMPUTED,
    "delete": None,
    "offload": OFFLOADED,
    "prefetch": None,
    "wait": None,
    "update": None,
    "host_update": None,
    "prefetch_states": None,
    "offload_states": None,
    "wait_states": None,
}
MAX_LISTED = 50  # changes listed per kind in the summary; the line diff shows them all
ABSENT = "(absent)"
NO_GAP = "(none)"  # a plan whose solver reports no gap
NO_SOLVE_TIME = "(unknown)"


# ---------------------------------------------------------------------------
# One side of a diff
# ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Figures:
    """What a plan predicts.  budget, peak_bytes: bytes; time_us: microseconds.

    note: why the figures come from the plan's header instead of a simulation (the
    plan does not simulate), or None.
    """

    budget: int
    peak_bytes: int
    peak_at: str
    time_us: int
    note: str | None = None


@dataclass(frozen=True)
class Side:
    """One file of a diff: its label, its text (canonical when it parses), its plan.

    plan is None for an absent file (`/dev/null`, text "") or one that is not a valid
    plan (`error` says why; text is then the raw file).
    """

    label: str
    text: str
    plan: ir.Plan | None = None
    error: str | None = None


def load_side(path: str, label: str | None = None, *, lenient: bool = False) -> Side:
    """Read and canonicalise the plan at `path` (`/dev/null`: an absent file).

    Raises RematError when the file cannot be read, and PlanError when it does not parse
    unless `lenient` (git modes), where the raw text and the error come back instead.
    """
    label = label or path
    if path == os.devnull:
        return Side(label, "")
    text = read_text(path, "plan")
    try:
        plan = _parse(text, path)
        return Side(label, _print(plan, path), plan)
    except PlanError as error:
        if not lenient:
            raise
        return Side(label, text, None, _brief(error))


def _parse(text: str, path: str) -> ir.Plan:
    from remat_dsl.plan.parser import parse

    return parse(text, path)


def _print(plan: ir.Plan, path: str) -> str:
    from remat_dsl.plan.printer import print_plan

    try:
        return print_plan(plan)
    except ValueError as exc:
        raise PlanError(f"cannot print the plan canonically: {exc}", path=path) from None


def _brief(error: PlanError) -> str:
    """`line N: MESSAGE` (or just MESSAGE): the error without the file path, for one summary line."""
    return f"line {error.span.line}: {error.message}" if error.span else error.message


def figures(plan: ir.Plan) -> Figures:
    """Budget, peak and time of `plan`, simulated; the header's when it does not simulate."""
    from remat_dsl.check.replay import simulate

    h = plan.header
    try:
        sim = simulate(plan)
    except (PlanError, ValueError) as error:
        message = _brief(error) if isinstance(error, PlanError) else str(error)
        return Figures(h.budget, h.peak_bytes, h.peak_at, h.time_us, note=message.splitlines()[0])
    return Figures(h.budget, sim.peak_bytes, sim.peak_at, sim.time_us)


def policies(plan: ir.Plan) -> dict[str, str]:
    """Tensor name -> `kept`, `recomputed`, `offloaded` or `offloaded, recomputed`, in table order."""
    labels: dict[str, set[str]] = {}
    for ins in plan.forward + plan.backward:
        label = POLICIES.get(ins.verb)
        if label is None:
            continue
        names: tuple[str, ...] = (ins.target,)
        if ir.INSTRUCTIONS[ins.verb].operand == "op":
            op = plan.graph.op_by_name.get(ins.target)
            names = op.outputs if op is not None else ()
        for name in names:
            labels.setdefault(name, set()).add(label)
    found = {name: [label for label in (OFFLOADED, RECOMPUTED) if label in given] for name, given in labels.items()}
    return {t.name: ", ".join(found.get(t.name, [])) or KEPT for t in plan.graph.tensors}


# ---------------------------------------------------------------------------
# Changes between two plans
# ---------------------------------------------------------------------------


@dataclass(frozen=True)
class OpChange:
    """An instruction added (`+`), removed (`-`) or moved (`~`); positions are 1-based, 0 if none."""

    kind: str
    section: str
    verb: str
    target: str
    old_pos: int
    new_pos: int


def _keyed(instructions: tuple[ir.Instruction, ...]) -> dict[tuple[str, str, int], int]:
    """(verb, target, occurrence) -> 1-based position, in section order."""
    seen: Counter = Counter()
    keys = {}
    for pos, ins in enumerate(instructions, 1):
        keys[(ins.verb, ins.target, seen[(ins.verb, ins.target)])] = pos
        seen[(ins.verb, ins.target)] += 1
    return keys


def section_changes(section: str, old: tuple[ir.Instruction, ...], new: tuple[ir.Instruction, ...]) -> list[OpChange]:
    """The instructions of one section added, removed or moved between `old` and `new`."""
    a, b = _keyed(old), _keyed(new)
    changes = [OpChange("-", section, k[0], k[1], pos, 0) for k, pos in a.items() if k not in b]
    changes += [OpChange("+", section, k[0], k[1], 0, pos) for k, pos in b.items() if k not in a]
    old_common = [k for k in a if k in b]
    new_common = sorted(old_common, key=b.__getitem__)
    matcher = difflib.SequenceMatcher(None, old_common, new_common, autojunk=False)
    stable = {k for block in matcher.get_matching_blocks() for k in old_common[block.a : block.a + block.size]}
    changes += [OpChange("~", section, k[0], k[1], a[k], b[k]) for k in old_common if k not in stable]
    return sorted(changes, key=lambda c: (c.new_pos or c.old_pos, c.kind))


def operation_changes(old: ir.Plan, new: ir.Plan) -> list[OpChange]:
    """Added, removed and moved instructions, forward section first."""
    return section_changes(ir.FORWARD, old.forward, new.forward) + section_changes(
        ir.BACKWARD, old.backward, new.backward
    )


def policy_changes(old: ir.Plan, new: ir.Plan) -> list[tuple[str, str, str]]:
    """(tensor, old policy, new policy) for the tensors of both plans whose policy changed."""
    a, b = policies(old), policies(new)
    return [(name, a[name], b[name]) for name in b if name in a and a[name] != b[name]]


# ---------------------------------------------------------------------------
# Rendering
# ---------------------------------------------------------------------------


def _size(nbytes: int) -> str:
    from remat_dsl.plan.units import format_bytes

    return format_bytes(nbytes)


def _ms(us: int) -> str:
    return f"{us / 1000:.3f} ms"


def _delta(old: int, new: int, unit: str) -> str:
    """`(-4096 B, -11.0%)`, `(+0.001 ms, +0.7%)` or `(unchanged)`; unit `B` (bytes) or `ms` (from microseconds)."""
    if old == new:
        return "(unchanged)"
    change = f"{new - old:+d} B" if unit == "B" else f"{(new - old) / 1000:+.3f} ms"
    return f"({change}, {100 * (new - old) / old:+.1f}%)" if old else f"({change})"


def _gap(h: ir.Header) -> str:
    from remat_dsl.plan.printer import format_gap

    return NO_GAP if h.gap is None else format_gap(h.gap)


def _points(old: str, new: str) -> str:
    """The change from gap `old` to gap `new` (printed percentages) in percentage points."""
    delta = Decimal(new.rstrip("%")) - Decimal(old.rstrip("%"))
    whole, _, frac = f"{delta:+f}".partition(".")
    return f"({whole}.{frac.rstrip('0').ljust(2, '0')} points)"


def _status_rows(old: ir.Plan | None, new: ir.Plan | None) -> list[list[str]]:
    """Rows `what, before, after, change` for the status and, if either plan has one, the gap."""

    def row(what: str, show) -> list[str]:
        before, after = (show(p.header) if p else ABSENT for p in (old, new))
        if not (old and new):
            change = ""
        elif before == after:
            change = "(unchanged)"
        elif what == "gap" and NO_GAP not in (before, after):
            change = _points(before, after)
        else:
            change = "(changed)"
        return [what, before, after, change]

    rows = [row("status", lambda h: h.status)]
    if any(p and p.header.gap is not None for p in (old, new)):
        rows.append(row("gap", _gap))
    return rows


def _solve_time_note(old: ir.Plan, new: ir.Plan) -> str | None:
    """One line when the solve times differ: they are not a change of the plan."""
    from remat_dsl.plan.printer import format_seconds

    a, b = old.header.solve_seconds, new.header.solve_seconds
    if a == b:
        return None
    show = [NO_SOLVE_TIME if t is None else format_seconds(t) for t in (a, b)]
    return (
        f"  note: solve time {show[0]} -> {show[1]} (how long the solver ran, not a change of the plan; not in the line"
        " diff)"
    )


def _figure_rows(old: Figures | None, new: Figures | None) -> list[list[str]]:
    """Rows `what, before, after, change` for budget, peak and time; ABSENT for a missing side."""
    fields = [
        ("budget", lambda f: f.budget, lambda f: _size(f.budget), "B"),
        ("predicted peak", lambda f: f.peak_bytes, lambda f: f"{_size(f.peak_bytes)} at {f.peak_at}", "B"),
        ("predicted time", lambda f: f.time_us, lambda f: _ms(f.time_us), "ms"),
    ]
    rows = []
    for what, value, show, unit in fields:
        change = _delta(value(old), value(new), unit) if old and new else ""
        rows.append([what, show(old) if old else ABSENT, show(new) if new else ABSENT, change])
    return rows


def _table(rows: list[list[str]], indent: str = "  ") -> list[str]:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return [indent + "  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip() for row in rows]


def _capped(lines: list[str], indent: str = "  ") -> list[str]:
    if len(lines) <= MAX_LISTED:
        return lines
    return lines[:MAX_LISTED] + [f"{indent}... and {len(lines) - MAX_LISTED} more (see the line diff below)"]


def _op_line(c: OpChange) -> list[str]:
    where = {
        "+": f"{c.section}:{c.new_pos}",
        "-": f"{c.section}:{c.old_pos}",
        "~": f"{c.section}:{c.old_pos} -> {c.section}:{c.new_pos}",
    }[c.kind]
    return [c.kind, where, c.verb, c.target]


def summary_lines(old: Side, new: Side) -> list[str]:
    """The semantic summary of a diff from `old` to `new` (see the module docstring)."""
    fig_old = figures(old.plan) if old.plan else None
    fig_new = figures(new.plan) if new.plan else None
    lines = [f"plan summary: {old.label} -> {new.label}"]
    rows = _figure_rows(fig_old, fig_new) + _status_rows(old.plan, new.plan)
    lines += _table([["", "before", "after", "change"], *rows])
    for side, fig in ((old, fig_old), (new, fig_new)):
        if side.error:
            lines.append(f"  note: {side.label} is not a valid plan: {side.error.splitlines()[0]}")
        elif fig and fig.note:
            lines.append(f"  note: {side.label} does not simulate, figures from its header: {fig.note}")
    if old.plan and new.plan:
        solve_time = _solve_time_note(old.plan, new.plan)
        lines += [solve_time] if solve_time else []
        lines += _change_lines(old.plan, new.plan)
    return lines


def _change_lines(old: ir.Plan, new: ir.Plan) -> list[str]:
    policy = policy_changes(old, new)
    lines = [f"tensors with a new policy: {len(policy)}"]
    if policy:
        lines += _capped(_table([[name, f"{a} -> {b}"] for name, a, b in policy], "    "), "    ")
    graph_note = _graph_note(old, new)
    lines += [graph_note] if graph_note else []
    ops = operation_changes(old, new)
    counts = Counter(c.kind for c in ops)
    lines.append(f"operations: {counts['+']} added, {counts['-']} removed, {counts['~']} moved")
    if ops:
        lines += _capped(_table([_op_line(c) for c in ops], "    "), "    ")
    return lines


def _graph_note(old: ir.Plan, new: ir.Plan) -> str | None:
    a = {t.name for t in old.graph.tensors}
    b = {t.name for t in new.graph.tensors}
    if a == b:
        return None
    return f"  note: the graphs differ: {len(b - a)} tensor(s) only after, {len(a - b)} only before"


def compared_text(side: Side) -> str:
    """The text the line diff and `--exit-code` compare: the canonical text less its
    `solve-time` line for a plan, the raw text otherwise."""
    if side.plan is None:
        return side.text
    from remat_dsl.plan.printer import without_solve_time

    return without_solve_time(side.text)


def line_diff(old: Side, new: Side) -> list[str]:
    """The unified diff of the two texts (canonical where they parse, `solve-time` left
    out), without line ends."""
    a, b = compared_text(old), compared_text(new)
    return list(difflib.unified_diff(a.splitlines(), b.splitlines(), old.label, new.label, lineterm=""))


def render(old: Side, new: Side) -> str:
    """Summary, a blank line, then the line diff (or a line saying the texts are equal)."""
    diff = line_diff(old, new)
    if diff:
        body = diff
    elif old.text != new.text:
        body = ["(the canonical texts are identical but for the solve time)"]
    else:
        body = ["(the canonical texts are identical)"]
    return "\n".join(summary_lines(old, new) + [""] + body) + "\n"


def textconv(side: Side) -> str:
    """A summary header of one plan, as `#` lines, then its canonical text (for `git log -p`)."""
    lines = ["# remat textconv: plan summary, then the canonical text"]  # no path: git passes temporary files
    if side.plan is None:
        lines.append(f"#   not a valid plan: {(side.error or 'empty file').splitlines()[0]}")
        return "\n".join(lines) + "\n" + side.text
    fig = figures(side.plan)
    rows = [
        ["budget", _size(fig.budget)],
        ["predicted peak", f"{_size(fig.peak_bytes)} at {fig.peak_at}"],
        ["predicted time", _ms(fig.time_us)],
    ]
    h = side.plan.header
    rows.append(["status", h.status if h.gap is None else f"{h.status}, gap {_gap(h)}"])
    per_tensor = policies(side.plan)
    rows.append([KEPT, f"{sum(p == KEPT for p in per_tensor.values())} tensors"])
    rows += [[p, name] for name, p in per_tensor.items() if p != KEPT]
    lines += _table(rows, "#   ")
    if fig.note:
        lines.append(f"#   note: does not simulate, figures from its header: {fig.note}")
    return "\n".join(lines) + "\n" + side.text


# ---------------------------------------------------------------------------
# Commands
# ---------------------------------------------------------------------------
