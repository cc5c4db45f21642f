"""Terminal summaries of a plan's simulation (rich tables rendered to text)."""

from __future__ import annotations

import io

from rich.console import Console
from rich.table import Table

from remat_dsl.plan import ir
from remat_dsl.plan.errors import PlanError
from remat_dsl.plan.ir import iter_refs, op_refs
from remat_dsl.plan.units import format_bytes, human_bytes

LARGEST_LISTED = 5  # live tensors named when the peak is above the budget


def instruction_line(plan: ir.Plan, at: str) -> str:
    """`forward:12` -> `line 57` when the instruction has a source span."""
    section, _, index = at.partition(":")
    instructions = plan.forward if section == ir.FORWARD else plan.backward
    ins = instructions[int(index) - 1] if index.isdigit() and 0 < int(index) <= len(instructions) else None
    if ins is None or ins.span is None:
        return at
    return f"{at}, line {ins.span.line}: {ins.verb} {ins.target}"


def check_budget(plan: ir.Plan, sim) -> None:
    """Raise PlanError at the peak instruction when the simulated peak is above the header's budget.

    The message lists the largest tensors live at the peak (from the peak Step's `live`).
    """
    budget = plan.header.budget
    if sim.peak_bytes <= budget:
        return
    section, _, index = sim.peak_at.partition(":")
    instructions = plan.forward if section == ir.FORWARD else plan.backward
    instr = instructions[int(index) - 1] if index.isdigit() and 0 < int(index) <= len(instructions) else None
    step = next((s for s in sim.timeline if s.live), None)
    live = step.live if step else ()
    listed = ", ".join(f"{name} {human_bytes(nbytes)}" for name, nbytes in live[:LARGEST_LISTED])
    more = f" and {len(live) - LARGEST_LISTED} more" if len(live) > LARGEST_LISTED else ""
    over = sim.peak_bytes - budget
    message = (
        f"the predicted peak {format_bytes(sim.peak_bytes)} at {sim.peak_at} is "
        f"{over} B above the budget {format_bytes(budget)}"
        + (f"; largest live here: {listed}{more}" if listed else "")
    )
    held = {ref.name for ref in iter_refs(plan.graph.outputs)}
    held |= {ref.name for grad in plan.graph.gradients for ref in iter_refs(grad.value)}
    # what the peak instruction itself allocates or reads cannot be freed before it
    op = next((op for op in plan.graph.ops if instr is not None and op.name == instr.target), None)
    if op is not None:
        held |= set(op.outputs) | {ref.name for ref in op_refs(op)}
    tensors = {t.name for t in plan.graph.tensors}
    movable = [name for name, _ in live if name in tensors and name not in held]
    if movable:
        hint = (
            f"free {over} B here: delete, recompute or offload '{movable[0]}' (or another saved tensor) "
            f"before this line, or raise the budget to at least {sim.peak_bytes} B"
        )
    else:
        hint = (
            "every tensor live here is an output, a gradient or an operand of this line: raise the budget "
            f"to at least {sim.peak_bytes} B, or plan again (`remat plan --budget`) with another solver"
        )
    raise PlanError(message, span=instr.span if instr else None, hint=hint, word=instr.target if instr else None)


def check_report(path: str, verified) -> str:
    """What `remat check` prints for a VerifiedPlan."""
    plan, sim = verified.plan, verified.simulation
    table = Table(title=f"{path}: valid plan ({plan.header.solver}, {plan.header.status})", show_header=False)
    table.add_column("what")
    table.add_column("value", justify="right")
    budget = plan.header.budget
    if plan.graph.autocast is not None:
        table.add_row("autocast", f"{plan.graph.autocast.dtype} (captured, and to be run, under torch.autocast)")
    table.add_row("budget", f"{format_bytes(budget)}")
    table.add_row(
        "predicted peak",
        (
            f"{format_bytes(sim.peak_bytes)}, {100 * sim.peak_bytes / budget:.1f}% of budget"
            if budget
            else f"{sim.peak_bytes} B"
        ),
    )
    table.add_row("peak at", instruction_line(plan, sim.peak_at))
    table.add_row("predicted time", f"{sim.time_us / 1000:.3f} ms")
    table.add_row("compute / recompute", f"{sim.compute_us / 1000:.3f} ms / {sim.recompute_us / 1000:.3f} ms")
    table.add_row("transfers", f"{sim.transfer_us / 1000:.3f} ms, host peak {format_bytes(sim.host_peak_bytes)}")
    table.add_row("instructions", f"{len(plan.forward)} forward, {len(plan.backward)} backward")
    peak_step = next((s for s in sim.timeline if s.live), None)
    lines = [_render(table)]
    if peak_step:
        largest = Table(title="largest live tensors at the peak")
        largest.add_column("tensor")
        largest.add_column("size", justify="right")
        for name, nbytes in peak_step.live[:8]:
            largest.add_row(name, human_bytes(nbytes))
        lines.append(_render(largest))
    stale = _stale(plan, sim)
    if stale:
        lines.append(f"note: the header's predictions are out of date ({stale}); the figures above are recomputed")
    return "\n".join(lines)


def _stale(plan: ir.Plan, sim) -> str:
    h = plan.header
    diffs = []
    if h.peak_bytes != sim.peak_bytes:
        diffs.append(f"peak {h.peak_bytes} vs {sim.peak_bytes}")
    if h.time_us != sim.time_us:
        diffs.append(f"time {h.time_us} vs {sim.time_us} us")
    return ", ".join(diffs)


def _render(table: Table) -> str:
    buffer = io.StringIO()
    Console(file=buffer, width=100, color_system=None).print(table)
    return buffer.getvalue().rstrip()
