"""`remat show`: see a plan's device memory over its instructions.

`remat show PLAN --png timeline.png` draws the memory timeline (`draw_png`); without
`--png` it prints a compact terminal chart and the largest live tensors at the peak
(`terminal_view`).  Both take a VerifiedPlan (`remat_dsl.check.verify`).

NOTE: [Categories must agree with the simulator]
`simulate()` records, per instruction, what it holds at its peak, adds and removes
(NOTE: [Step events] in remat_dsl.check.replay); `category_timeline` only sorts those
events by kind of tensor.  Its per-category sums must equal the Simulation's
`mem_before`/`mem_peak`/`mem_after` byte for byte: it raises otherwise, and
`tests/test_show.py` asserts it on every example.
"""

from __future__ import annotations

import io
from dataclasses import dataclass

from remat_dsl.plan import ir

SAVED = "saved for backward"
OUTPUTS = "model outputs"
FORWARD_TEMPS = "forward temporaries"
GRADIENTS = "gradients"
OP_TEMPS = "op temporaries & RNG states"
# a whole-step plan's parameters on the device and optimizer states (NOTE: [Optimizer in
# the step] in remat_dsl/plan/optimizer.py): held before its first instruction
PARAMETERS = "parameters & optimizer states"
CATEGORIES = (SAVED, OUTPUTS, FORWARD_TEMPS, GRADIENTS, OP_TEMPS, PARAMETERS)
COLORS = {
    PARAMETERS: "#937860",
    SAVED: "#4C72B0",
    OUTPUTS: "#8172B3",
    FORWARD_TEMPS: "#8EBAD9",
    GRADIENTS: "#55A868",
    OP_TEMPS: "#DD8452",
}
# The PNG's rug below the timeline: a row of ticks, in this colour, at each instruction of
# a verb of ir.INSTRUCTIONS (None: no row); tests/test_instructions.py checks the keys.
RUG = {
    "compute": None,
    "recompute": "#DD8452",
    "delete": None,
    "offload": "#8172B3",
    "prefetch": "#2E8B57",
    "wait": None,
    "update": "#55A868",
    "host_update": "#C44E52",
    "prefetch_states": "#2E8B57",
    "offload_states": "#8172B3",
    "wait_states": None,
}
MIB = 1024 * 1024
PNG_SOFTWARE = "remat-dsl (remat show --png)"  # its PNGs' Software (NOTE: [Safe outputs] in remat_dsl/cli/console.py)
BLOCKS = " ▁▂▃▄▅▆▇█"


# ---------------------------------------------------------------------------
# Memory by category
# ---------------------------------------------------------------------------


@dataclass(frozen=True)
class StepUsage:
    """Device bytes by category (in CATEGORIES order) before, at the peak of, and after one instruction."""

    section: str
    index: int
    instruction: ir.Instruction
    before: tuple[int, ...]
    peak: tuple[int, ...]
    after: tuple[int, ...]


@dataclass(frozen=True)
class CategoryTimeline:
    """Per-instruction usage by category, and what is live at the plan's peak.

    peak_live: (name, nbytes, category) at the Simulation's peak step, largest first; the
    names are those of `Step.live` ("rng state of OP", "temporaries of OP", "T (new copy)").
    """

    steps: tuple[StepUsage, ...]
    peak_live: tuple[tuple[str, int, str], ...]


def tensor_categories(graph: ir.Graph) -> dict[str, str]:
    """Category of every tensor of the graph (see CATEGORIES)."""
    from remat_dsl.plan.ir import iter_refs, op_refs

    producer_phase = {op.name: op.phase for op in graph.ops}
    read_by_backward = {ref.name for op in graph.ops if op.phase == ir.BACKWARD for ref in op_refs(op)}
    outputs = {ref.name for ref in iter_refs(graph.outputs)}
    categories = {}
    for tensor in graph.tensors:
        if producer_phase.get(tensor.producer) == ir.BACKWARD:
            categories[tensor.name] = GRADIENTS
        elif tensor.name in outputs:
            categories[tensor.name] = OUTPUTS
        elif tensor.name in read_by_backward:
            categories[tensor.name] = SAVED
        else:
            categories[tensor.name] = FORWARD_TEMPS
    return categories


def category_timeline(verified) -> CategoryTimeline:
    """The simulation's memory timeline split by category (CATEGORIES).

    Reads each step's events (NOTE: [Step events] in remat_dsl.check.replay): nothing is
    replayed here.  Tensors count in their category (`tensor_categories`), temporaries
    (the zeros of an absent tangent among them) and RNG states in OP_TEMPS.
    Raises AssertionError when the categories do not add up to the simulation's totals
    (NOTE: [Categories must agree with the simulator]).
    """
    plan, sim = verified.plan, verified.simulation
    category = tensor_categories(plan.graph)
    slot = {name: i for i, name in enumerate(CATEGORIES)}

    parameters = {p.name for p in plan.graph.parameters}

    def kind(key: str) -> int:
        if key in parameters or key.startswith(("optimizer states", "parameters on the device")):
            return slot[PARAMETERS]
        return slot[category.get(key.removesuffix(" (new copy)"), OP_TEMPS)]

    def plus(usage: tuple[int, ...], items, sign: int = 1) -> tuple[int, ...]:
        result = list(usage)
        for key, nbytes in items:
            result[kind(key)] += sign * nbytes
        return tuple(result)

    usage = tuple([0] * len(CATEGORIES))
    if sim.timeline:  # what the step holds before its first instruction
        usage = plus(usage, [("optimizer states", sim.timeline[0].mem_before)])
    steps: list[StepUsage] = []
    peak_live: tuple = ()
    for step in sim.timeline:
        before = usage
        peak = plus(before, step.at_peak)
        usage = plus(plus(before, step.added), step.removed, -1)
        steps.append(StepUsage(step.section, step.index, step.instruction, before, peak, usage))
        if step.live:
            peak_live = tuple((name, nbytes, CATEGORIES[kind(name)]) for name, nbytes in step.live)
    _check_agreement(steps, sim)
    return CategoryTimeline(tuple(steps), peak_live)


def _check_agreement(steps: list[StepUsage], sim) -> None:
    if len(steps) != len(sim.timeline):
        raise AssertionError(f"show replayed {len(steps)} instructions, simulate {len(sim.timeline)}")
    for mine, theirs in zip(steps, sim.timeline):
        got = (sum(mine.before), sum(mine.peak), sum(mine.after))
        want = (theirs.mem_before, theirs.mem_peak, theirs.mem_after)
        if got != want:
            raise AssertionError(
                f"memory by category disagrees with simulate() at {mine.section}:{mine.index} "
                f"({mine.instruction.verb} {mine.instruction.target}): {got} != {want}; "
                "see NOTE: [Categories must agree with the simulator] in remat_dsl/review/show.py"
            )


# ---------------------------------------------------------------------------
# The PNG
# ---------------------------------------------------------------------------


def _title(plan: ir.Plan, sim) -> str:
    from remat_dsl.plan.units import format_bytes

    h = plan.header
    model = h.model or "plan"
    return (
        f"{model} — solver {h.solver} ({h.status})\n"
        f"budget {format_bytes(h.budget)}, predicted peak {format_bytes(sim.peak_bytes)} at {sim.peak_at}"
    )


def draw_png(verified) -> bytes:
    """The memory timeline of a VerifiedPlan as a PNG image (bytes).

    Stacked areas: device memory at the peak of each instruction, by category; dashed
    line: the budget; dotted vertical line: forward/backward boundary; the strip below
    marks recompute, offload and prefetch instructions.  Written atomically (a temporary
    file in the same directory, then os.replace), with matplotlib's Agg canvas.
    """
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    from remat_dsl.plan.units import format_bytes

    plan, sim = verified.plan, verified.simulation
    timeline = category_timeline(verified)
    steps = timeline.steps
    n = len(steps)
    n_forward = len(plan.forward)
    fig = Figure(figsize=(13, 6), dpi=110, layout="constrained")
    FigureCanvasAgg(fig)
    grid = fig.add_gridspec(2, 1, height_ratios=(9, 1.3))
    ax = fig.add_subplot(grid[0])
    rug = fig.add_subplot(grid[1], sharex=ax)

    unit_bytes, unit = (MIB, "MiB") if max(sim.peak_bytes, plan.header.budget) >= MIB else (1024, "KiB")
    edges = [i + 0.5 for i in range(n + 1)]  # instruction i (1-based) spans [i - 0.5, i + 0.5]
    bottom = [0.0] * (n + 1)
    for c, name in enumerate(CATEGORIES):
        values = [s.peak[c] / unit_bytes for s in steps]
        if not any(values):
            continue
        values.append(values[-1] if values else 0.0)
        top = [b + v for b, v in zip(bottom, values)]
        ax.fill_between(edges, bottom, top, step="post", color=COLORS[name], linewidth=0, label=name)
        bottom = top
    budget = plan.header.budget
    if budget:
        ax.axhline(
            budget / unit_bytes,
            color="#C44E52",
            linestyle="--",
            linewidth=1.4,
            zorder=4,
            label=f"budget {format_bytes(budget)}",
        )
    y_top = max(sim.peak_bytes, budget) / unit_bytes * 1.2 or 1.0
    ax.set_ylim(0, y_top)
    ax.set_xlim(0.5, n + 0.5 if n else 1.5)
    for a in (ax, rug):
        a.axvline(n_forward + 0.5, color="black", linestyle=":", linewidth=1.2)
    above = ax.get_xaxis_transform()  # x in data, y in axes coordinates
    if n_forward:
        ax.text(n_forward + 0.5 - 0.005 * n, 1.01, "← forward", transform=above, ha="right", va="bottom", fontsize=10)
    if n > n_forward:
        ax.text(n_forward + 0.5 + 0.005 * n, 1.01, "backward →", transform=above, ha="left", va="bottom", fontsize=10)

    peak_pos = next((i for i, s in enumerate(sim.timeline) if s.live), None)
    if peak_pos is not None:
        ins = steps[peak_pos].instruction
        x_peak, y_peak = peak_pos + 1, sim.peak_bytes / unit_bytes
        ax.plot([x_peak], [y_peak], marker="v", color="black", markersize=7, zorder=5)
        right = x_peak < n * 0.6
        ax.annotate(
            f"peak {format_bytes(sim.peak_bytes)} at {sim.peak_at}\n{ins.verb} {_shorten(ins.target, 48)}",
            xy=(x_peak, y_peak),
            xytext=(x_peak + (0.05 if right else -0.05) * n, min(y_peak + 0.04 * y_top, y_top * 0.9)),
            ha="left" if right else "right",
            multialignment="left",
            va="bottom",
            fontsize=9,
            bbox={"boxstyle": "round,pad=0.3", "facecolor": "white", "edgecolor": "#999999", "alpha": 0.9},
            arrowprops={"arrowstyle": "->", "color": "black", "linewidth": 0.8},
            zorder=6,
        )

    ax.set_ylabel(f"device memory ({unit})")
    ax.set_title(_title(plan, sim), fontsize=11, pad=18)
    ax.grid(axis="y", color="#dddddd", linewidth=0.6)
    ax.set_axisbelow(True)
    ax.tick_params(labelbottom=False)
    ax.legend(
        loc="upper left",
        bbox_to_anchor=(1.01, 1.0),
        fontsize=9,
        frameon=False,
        title="at each instruction's peak",
        title_fontsize=9,
    )

    rows = [(verb, color) for verb, color in RUG.items() if color is not None]
    for y, (verb, color) in enumerate(reversed(rows)):
        xs = [i + 1 for i, s in enumerate(steps) if s.instruction.verb == verb]
        rug.plot(xs, [y] * len(xs), linestyle="none", marker="|", markersize=11, markeredgewidth=1.5, color=color)
    rug.set_yticks(range(len(rows)), [verb for verb, _ in reversed(rows)], fontsize=8)
    rug.set_ylim(-0.7, len(rows) - 0.3)
    rug.set_xlabel(f"instruction ({n_forward} forward, then {n - n_forward} backward)")
    rug.tick_params(axis="y", length=0)
    for side in ("top", "right"):
        rug.spines[side].set_visible(False)
        ax.spines[side].set_visible(False)

    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", metadata={"Software": PNG_SOFTWARE})
    return buffer.getvalue()


def _shorten(text: str, width: int) -> str:
    return text if len(text) <= width else "…" + text[-(width - 1) :]


# ---------------------------------------------------------------------------
# The terminal view
# ---------------------------------------------------------------------------


def terminal_view(verified, *, buckets: int = 60, height: int = 8) -> str:
    """A compact chart of memory over the instructions and the largest live tensors at the peak.

    Each column is a bucket of consecutive instructions, as tall as the most memory in use
    during them (eighth blocks); `┈` is the budget; below, `│` is the forward/backward
    boundary, `r` a bucket with a recompute, `t` one with an offload or prefetch (`*` both).
    """
    from remat_dsl.check.report import instruction_line
    from remat_dsl.plan.units import format_bytes, human_bytes

    plan, sim = verified.plan, verified.simulation
    timeline = category_timeline(verified)
    steps = sim.timeline
    n, n_forward = len(steps), len(plan.forward)
    budget = plan.header.budget
    lines = [_title(plan, sim).replace("\n", "; ")]
    if n == 0:
        return "\n".join([*lines, "(no instructions)"])
    width = min(buckets, n)
    bounds = [(b * n // width, (b + 1) * n // width) for b in range(width)]
    highs = [max(s.mem_peak for s in steps[lo:hi]) for lo, hi in bounds]
    scale = max(sim.peak_bytes, budget) or 1
    cells = height * 8
    levels = [round(h / scale * cells) for h in highs]
    budget_row = min(height - 1, int(budget / scale * height)) if budget else None
    peak_bucket = next(b for b, (lo, hi) in enumerate(bounds) if lo <= _peak_pos(sim) < hi)
    label_width = max(len(human_bytes(scale)), len("0 B")) + 1

    lines.append(" " * label_width + " " + "".join("▼" if b == peak_bucket else " " for b in range(width)) + "  ▼ peak")
    for row in range(height - 1, -1, -1):
        chars = []
        for level in levels:
            fill = min(8, max(0, level - row * 8))
            if fill == 0 and row == budget_row:
                chars.append("┈")
            else:
                chars.append(BLOCKS[fill])
        label = human_bytes(scale) if row == height - 1 else ""
        note = f"  ┈ budget {format_bytes(budget)}" if row == budget_row else ""
        lines.append(f"{label:>{label_width}}│{''.join(chars)}{note}")
    boundary = next((b for b, (lo, hi) in enumerate(bounds) if lo <= n_forward < hi), width)
    axis = "".join("┴" if b == boundary and 0 < n_forward < n else "─" for b in range(width))
    lines.append(f"{'0 B':>{label_width}}└{axis}")
    marks = []
    for lo, hi in bounds:
        verbs = {s.instruction.verb for s in steps[lo:hi]}
        recompute, transfer = "recompute" in verbs, any(ir.INSTRUCTIONS[v].stream != ir.COMPUTE_STREAM for v in verbs)
        marks.append("*" if recompute and transfer else "r" if recompute else "t" if transfer else " ")
    lines.append(" " * label_width + " " + "".join(marks) + "  r recompute, t offload/prefetch")
    per = n / width
    fwd = f"forward 1-{n_forward}" if n_forward else ""
    bwd = f"backward 1-{n - n_forward}" if n > n_forward else ""
    lines.append(
        " " * label_width + f" {fwd}{' | ' if fwd and bwd else ''}{bwd}  ({n} instructions, {per:.1f} per column)"
    )
    ratio = f", {100 * sim.peak_bytes / budget:.1f}% of budget" if budget else ""
    lines.append(f"peak {format_bytes(sim.peak_bytes)} at {instruction_line(plan, sim.peak_at)}{ratio}")
    lines.append(f"budget {format_bytes(budget)}")
    lines.append(_live_table(timeline, sim))
    return "\n".join(lines)


def _peak_pos(sim) -> int:
    return next((i for i, s in enumerate(sim.timeline) if s.live), 0)


def _live_table(timeline: CategoryTimeline, sim, limit: int = 10) -> str:
    from rich.console import Console
    from rich.table import Table

    from remat_dsl.plan.units import human_bytes

    peak = timeline.steps[_peak_pos(sim)]
    table = Table(title=f"largest live tensors at the peak ({sim.peak_at})")
    table.add_column("tensor", no_wrap=True, overflow="ellipsis")
    table.add_column("category", no_wrap=True)
    table.add_column("size", justify="right")
    table.add_column("share", justify="right")
    total = sim.peak_bytes or 1
    for name, nbytes, category in timeline.peak_live[:limit]:
        table.add_row(name, category, human_bytes(nbytes), f"{100 * nbytes / total:.1f}%")
    rest = timeline.peak_live[limit:]
    if rest:
        table.add_row(
            f"… {len(rest)} more",
            "",
            human_bytes(sum(n for _, n, _ in rest)),
            f"{100 * sum(n for _, n, _ in rest) / total:.1f}%",
        )
    by_category = ", ".join(f"{name} {human_bytes(peak.peak[c])}" for c, name in enumerate(CATEGORIES) if peak.peak[c])
    buffer = io.StringIO()
    Console(file=buffer, width=120, color_system=None).print(table)
    return f"at the peak: {by_category}\n" + buffer.getvalue().rstrip()
