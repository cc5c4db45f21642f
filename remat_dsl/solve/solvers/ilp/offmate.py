# ruff: noqa: E741 (l is a block index, as in the thesis and rotor)
"""OffMate for activations: recomputation and offloading chosen together by one ILP (O-ILP).

Source: Zhao, PhD thesis "Optimizing Memory Usage when Training Deep Neural Networks"
(2024), chapter 4 (OffMate).  Blocks are Rockmate's (the chain
partition of remat_dsl.solve.solvers.chain.partition, `refine=1`); each block gets the options of
section 4.4 beside Rockmate's RK-Checkmate options (remat_dsl.solve.solvers.ilp.rockmate):

    as PyTorch           store everything the backward reads (option 0);
    forward-and-forget   keep only what the block's boundary needs (its outputs), recompute
                         the rest of the forward at the start of the backward;
    recompute cheap ops  recompute the ops whose time is below the time to offload and
                         prefetch their outputs at the host bandwidth; keep the rest;

and any option's saved activations (alive at the block's forward/backward boundary, read
only by the block's own backward) are OFFLOADABLE, and so are a block's outputs read by
the next block only (NOTE: [Offloaded block outputs]), which the thesis keeps on the
device (A_t of section 4.5.1).  Every option's costs
(forward and backward time, bytes kept at the boundary, peaks) come from the exact
`rockmate.replay` (NOTE: [Option costs] in rockmate.py), never from estimates.

NOTE: [O-ILP for activations]
The O-ILP of section 4.5.2 restricted to activations: no parameter offload, no optimizer
states, no CPU optimizer, so Sto/Ofl/Prf/StoO/OflO/PrfO/Opt of parameters, W_t (4.14),
O_t (4.15), eq. 4.5-4.13, 4.23 and the alpha/H terms are dropped (NOTE: [Joint O-ILP]
adds them back, as an option of the same model).  Steps t = 1..2L run
F_1..F_L then B_L..B_1 (section 4.3.3; one option per block, section 4.3.4).  Variables:

    Comp[i,o] in {0,1}, sum_o Comp[i,o] = 1                                 (4.1)
    Time[t] >= 0 (ms)                                                        (4.2)
    Ofl[i] >= 0 (MiB): activations of block i offloaded, all in step F_i (4.3.4:
        offloaded in the step that produces them), Ofl[i] <= sum_o O_i^o Comp[i,o]
    Prf[i,k] >= 0 (MiB): activations of block i prefetched at the start of B_k, k >= i;
        sum_k Prf[i,k] = Ofl[i]: all of it is back on the device when B_i needs it (4.3, 4.9)

Two departures from section 4.5.2.  Forward steps take no prefetch (a prefetch there
would cross into the backward section while saving nothing the backward steps cannot).
And a block's own backward step B_i may prefetch its activations (Prf[i,i]), its copy
then NOT overlapped: it adds Prf[i,i] / beta to the step's compute time (4.20 below).  The
thesis prefetches strictly before B_i, so B_{i+1} holds all of block i's activations
besides its own; on GPT-2 that kept the O-ILP's smallest budget above Rockmate's (a
recompute-only plan holds nothing of block i during B_{i+1}).

Memory (eq. 4.16-4.17 with W_t = O_t = 0; "memory allocation once per step": a step's
prefetched bytes count from its start, a block's offloaded bytes leave the device at the
end of its forward step), with X_i = sum_o xbar_i^o Comp[i,o] (rotor's abar: the block's
outputs and saved activations) and A_t the interface activations and gradients of rotor's
chain model (remat_dsl.solve.solvers.chain.model, NOTE: [Step semantics]):

    F_l:  A_F + sum_{j<l} (X_j - Ofl_j) + X_l + sum_o o_f^{l,o} Comp[l,o] <= M
    B_l:  sum_{j<l} (X_j - Ofl_j + sum_{k>=l} Prf[j,k]) + X_l + delta^l + delta^{l-1}
          + sum_o o_b^{l,o} Comp[l,o] <= M
    (each step's left side also gets sum_o unseen[t,o] Comp[B(t),o]: NOTE: [A_t from the
    simulation])
    host: sum_i Ofl[i] <= the host budget                                    (4.18)

Time (eq. 4.19-4.22; beta the host link bandwidth):

    F_l:  Time >= u_f^l (4.19),  Time >= Ofl[l] / beta (4.22)
    B_l:  Time >= sum_o u_b^{l,o} Comp[l,o] + Prf[l,l] / beta (4.20),
          Time >= sum_{j<=l} Prf[j,l] / beta (4.21)

and the objective is min sum_t Time[t] (plus `tie` per offloaded MiB and per MiB and step a
prefetch comes early: among plans of equal time, fewer transfers and later prefetches,
which leave room for what no model sees).  Bytes are MiB and times milliseconds inside the
ILP (HiGHS's tolerances suit numbers near 1); the solution goes back to bytes.

NOTE: [Joint O-ILP]
The same model with the whole step's terms (`Oilp.solve(target, whole=WholeStep)`): the
block options and activation transfers above and, per block l, the fractions of eq. 4.3-4.13
as NOTE: [Placement ILP] (remat_dsl.solve.solvers.ilp.placement) names them, s_l (streamed),
o_l (updated on the host), g_l (states paged), w_l, v_l in [0,1], with o + g <= 1 (4.6),
w >= o - s (4.11), v >= s - o (4.7).  Granularity: blocks.  A parameter belongs to the block
whose ops read it first (`parameter_blocks`); per block, P_l: its parameters' bytes
(trainable and frozen), of them P^g_l trainable, G_l their gradients, S_l their optimizer
states, T_l the largest device update's temporaries (`whole_step`).  Memory (4.14-4.17),
with R = sum_l (1 - s_l) P_l + (1 - o_l - g_l) S_l resident in every step:

    F_l:  + R + s_l P_l + s_{l+1} P_{l+1}            (F_L: + g_L S_L, paged for B_L)
    B_l:  + R + s_l P_l + s_{l-1} P_{l-1} + g_l S_l + g_{l-1} S_{l-1} + G_l
    U_l:  the updates at the end of B_l, a row of their own: B_l's row without block l's
          own activations, overheads and output gradient (its backward is done), + R +
          s_l P_l + s_{l-1} P_{l-1} + g_l S_l + g_{l-1} S_{l-1} + G_l + (1 - o_l) T_l
    host: + sum_l s_l P_l + o_l (P^g_l + S_l) + g_l S_l                          (4.18)

Time: B_l's compute + (1 - o_l) P^g_l / alpha_G (4.20); the h2d row (4.21) of each step
carries, beside the activations' prefetches, what the next step reads (F_l: s_{l+1}
P_{l+1}; F_L: s_L P_L + g_L S_L for B_L; B_l: s_{l-1} P_{l-1} + g_{l-1} S_{l-1}; F_1 also
block 1's own); the d2h row (4.22) of B_l: o_l G_l + g_l S_l + v_l P^g_l; Time_end >=
sum_l w_l P^g_l / beta (the copy-back of host updates); (4.23) for each k: sum_{j<k}
Time[B_j] + Time_end >= sum_{j<=k} o_j (P^g_j / alpha_C + H n_j), n_j the block's
updates.  The objective adds Time_end, and `tie` per MiB the placement moves.  MiB and ms
as above.  Departures, beside those of NOTE: [Placement ILP] (host memory, eq. 4.23's
queue, H per update): one set of fractions per block rather than per parameter and step;
a parameter read by several blocks (tied weights) is counted in its first block only, its
gradient in that block's B_l only; a copy occupies its whole step (the lowering's copies
lead by a few ops), so at block granularity the model holds more than the simulation
does; the smallest parameter is never streamed (set when the block fractions become
per-parameter ones, `parameter_fractions`).  The driver rounds, lowers and judges the
answer exactly (NOTE: [Joint candidate] in remat_dsl.solve.driver).

NOTE: [Offloaded block outputs] Beyond the thesis: A_t of eq. 4.17 holds the interface
activations, every block's outputs until the backward of the block that reads them: on
a 12-layer GPT-2 about a sixth of a 30% budget, which Rockmate's chain DP may forget and
recompute instead.  Block j's
outputs that only block j+1 reads, its forward among them and a backward op of block j
or j+1 (so they stay on the device from F_j to B_{j+1} in every option; `interface_tensors`)
get two more continuous variables, as the thesis's Ofl and Prf:

    OflI[j] in [0, bytes of those outputs] (MiB): copied to the host while F_{j+1} runs
        (they are made at the end of F_j) and deleted at the end of F_{j+1}, their last
        forward reader;
    PrfI[j,k] >= 0, k > j: back at the start of B_k; sum_k PrfI[j,k] = OflI[j] (4.9):
        all of them by B_{j+1}, the first backward step that reads them.

Memory: F_l subtracts sum_{j <= l-2} OflI[j]; B_l subtracts sum_{j < l} OflI[j] and adds
back sum_{j < l, k >= l} PrfI[j,k] (so B_{j+1} holds all of them).  Time: F_l's copy
(4.22) is Ofl[l] + OflI[l-1]; B_l's incoming copies (4.21) add sum_j PrfI[j,l], and
PrfI[l-1,l], read first by B_l, adds to its compute as Prf[l,l] does (4.20).  The host
budget (4.18) counts OflI too.  Whole tensors as below, the prefetch steps from B_L down
to B_{j+1}.  At tight budgets this is what lets the O-ILP plan at all (examples/gpt2.py
at 30% of the autograd peak: docs/measured-notes.md).
A tensor only recomputations read again is left out: the lowering deletes it after
F_{j+1} in the store-all plan already, and the O-ILP would count its bytes twice.

NOTE: [Whole tensors] (section 4.6, Algorithm 8 for activations) The ILP offloads bytes; a
plan offloads tensors.  For each block, the smallest-greedy set of its option's
offloadable tensors whose size is at least Ofl[i] is offloaded (`select_at_least`; sorted
by size then name, so deterministic), and its prefetches are spread over the steps so
that the cumulative bytes prefetched by each step stay at most the ILP's, B_i itself
taking the rest (`prefetch_steps`).  Memory in every step is then at most the ILP's (B_i
holds all of block i's activations in the ILP too); time may be a little more.  The driver
lowers the order and the transfers (remat_dsl.solve.lowering,
NOTE: [Solver transfers]), simulates them exactly and corrects the budget as for every
solver (remat_dsl.solve.driver, NOTE: [Budget correction]).

NOTE: [Never worse than recomputation] At each target, the RK-Rotor plan of the same
blocks and options (what `--solver rockmate` plans) is lowered and simulated too; when it
predicts less time with a peak no higher (than the O-ILP plan's, or the target), or the
O-ILP has no solution, it is returned instead, and the first decision of the plan says
which one was kept.  Either plan is first shaved to the target by more offloads where
its exact peak is above it (NOTE: [Shaving the peak]); Rockmate's is kept over the
O-ILP's when it is faster with a peak no higher (or within the target), or when it alone
comes nearer the target.  (RK-Rotor's targets are in rotor's chain model, which misses what
NOTE: [A_t from the simulation] adds, so its plan at a target usually peaks higher.)
"""

from __future__ import annotations

import functools
import math
import time
from collections import defaultdict
from dataclasses import dataclass, replace

import pulp

from remat_dsl.check.replay import transfer_us
from remat_dsl.plan import ir
from remat_dsl.plan.constraints import matching
from remat_dsl.plan.errors import PlanError
from remat_dsl.plan.ir import op_uses, pinned_tensors
from remat_dsl.plan.units import format_duration, human_bytes
from remat_dsl.solve.api import (
    BudgetError,
    Decision,
    FLOOR_SWEEP,
    Problem,
    Solver,
    SolverInfo,
    SolverResult,
    Status,
    StepProblem,
    Transfer,
    say_phase,
    setting,
)
from remat_dsl.solve.solvers.chain.model import Chain
from remat_dsl.solve.solvers.chain.partition import (
    TEXT_WIDTH,
    ChainPartition,
    affordable,
    block_name,
    chain_steps,
    is_small_chain,
    partition,
)
from remat_dsl.solve.solvers.chain.rk_rotor import min_feasible_budget as rk_min_feasible_budget
from remat_dsl.solve.solvers.chain.rk_rotor import try_rk_rotor
from remat_dsl.solve.solvers.ilp import milp
from remat_dsl.solve.solvers.ilp.checkmate import op_hgraph
from remat_dsl.solve.solvers.ilp.hilp import HGraph
from remat_dsl.solve.solvers.ilp.rockmate import (
    RockmateConfig,
    _block_with_options,
    block_intervals,
    per_ilp_limit,
    rockmate_chain,
)
from remat_dsl.solve.lowering import lowered_plan

MIB = 2**20  # bytes per ILP memory unit
MS = 1000  # microseconds per ILP time unit


@dataclass(frozen=True)
class OffmateConfig(RockmateConfig):
    """The O-ILP's tie-break and rounding and the shaving post-pass, on top of Rockmate's
    settings, which its chain (Rockmate's plan, its floor) takes as they are."""

    tie: float = setting(1e-6, "ms per offloaded MiB (and per MiB and step of early prefetch): breaks ties")
    negligible: float = setting(1 / 1024, "MiB: an O-ILP offload below this is rounding noise, not a decision")
    max_shaves: int = setting(64, "transfers the shaving post-pass may add to one plan (NOTE: [Shaving the peak])")


AS_PYTORCH, ROCKMATE, FORGET, CHEAP = "as PyTorch", "Rockmate", "forward-and-forget", "recompute cheap ops"


# ---------------------------------------------------------------------------
# Block options (section 4.4)
# ---------------------------------------------------------------------------


@dataclass(frozen=True)
class BlockPlan:
    """The options of one block.  backward[o]: the op names of B^o (recomputations then
    the block's backward ops); kinds[o]: where option o comes from (AS_PYTORCH, ROCKMATE,
    FORGET, CHEAP); offloadable[o]: (tensor, bytes) of the saved activations option o may
    offload, sorted by size then name."""

    backward: tuple[tuple[str, ...], ...]
    kinds: tuple[str, ...]
    offloadable: tuple[tuple[tuple[str, int], ...], ...]


def saved_values(hg: HGraph, backward: tuple[int, ...]) -> list[int]:
    """Values (indices into hg.values) made by the forward that are alive at the block's
    forward/backward boundary when B runs `backward` (node indices), under the one
    lowering's liveness rule (`rockmate.block_intervals`): kept for outside readers, or
    read by the backward before being made again."""
    tb = hg.boundary
    sequence = list(range(tb)) + list(backward)
    return sorted(
        iv.tensor for iv in block_intervals(hg, sequence) if iv.made < tb and (iv.end is None or iv.end >= tb)
    )


def recompute_schedule(hg: HGraph, recomputable) -> tuple[int, ...]:
    """B that first recomputes, in forward order, the forward ops `recomputable(k)` allows
    among those whose outputs the backward reads (and, through their inputs, further
    recomputable producers), then runs the block's backward ops (node indices)."""
    tb = hg.boundary
    needed = [d for k in range(tb, len(hg.nodes)) for d in hg.nodes[k].reads]
    chosen: set[int] = set()
    stack = list(needed)
    while stack:
        value = hg.values[stack.pop()]
        k = value.producer
        if k >= tb or k in chosen or value.keep_at_boundary or value.keep_at_end or not recomputable(k):
            continue
        chosen.add(k)
        stack.extend(hg.nodes[k].reads)
    return tuple(sorted(chosen)) + tuple(range(tb, len(hg.nodes)))


def cheap_ops(hg: HGraph, bandwidth: int) -> set[int]:
    """Forward nodes whose time is below the time to offload and prefetch their outputs
    at `bandwidth` bytes/s (section 4.4, option 3: Megatron-LM's selective recomputation)."""
    made: defaultdict[int, int] = defaultdict(int)
    for value in hg.values:
        made[value.producer] += value.size
    return {k for k in range(hg.boundary) if hg.nodes[k].options[0].time_us < 2 * transfer_us(made[k], bandwidth)}


def offloadable(hg: HGraph, backward: tuple[int, ...], excluded: set[str]) -> tuple[tuple[str, int], ...]:
    """(tensor, bytes) of the saved activations of option `backward` that may go to the
    host: alive at the boundary, read by no op outside the block (interface activations
    stay), not pinned, not `excluded` (the user's constraints), not empty; sorted by size
    then name."""
    result = []
    for d in saved_values(hg, backward):
        value = hg.values[d]
        if value.keep_at_boundary or value.keep_at_end or value.name in excluded or value.size == 0:
            continue
        result.append((value.name, value.size))
    return tuple(sorted(result, key=lambda item: (item[1], item[0])))


def interface_tensors(
    graph: ir.Graph, part: ChainPartition, excluded: set[str]
) -> tuple[tuple[tuple[str, int], ...], ...]:
    """NOTE: [Offloaded block outputs] For each block l, (tensor, bytes) of its interface
    activations that may go to the host: made by F_l, read outside block l by ops of block
    l+1 only, its forward among them (so the device copy is needed until the end of F_{l+1}),
    and read by a backward op of block l or l+1 (so it stays on the device to B_{l+1}
    whatever the options: a tensor only a recomputation reads again is deleted after F_{l+1}
    in some options, and moving it would save nothing there), not pinned, not `excluded`,
    not empty; sorted by size then name.  The last block's outputs are the model's: none."""
    ops = graph.op_by_name
    names = {t.name for t in graph.tensors}
    block_of = {name: l for l, b in enumerate(part.blocks, 1) for name in (*b.forward, *b.backward)}
    readers: dict[str, set] = defaultdict(set)
    for op in graph.ops:
        for t in op_uses(op, names):
            readers[t].add((block_of.get(op.name), op.phase == ir.FORWARD))
    size = graph.nbytes
    result = []
    for l, block in enumerate(part.blocks, 1):
        found = []
        for name in block.forward:
            for t in ops[name].outputs:
                outside = {r for r in readers[t] if r[0] != l}
                if (
                    l < len(part.blocks)
                    and (l + 1, True) in outside
                    and all(b == l + 1 for b, _ in outside)
                    and ((l, False) in readers[t] or (l + 1, False) in outside)
                    and t not in excluded
                    and size[t] > 0
                ):
                    found.append((t, size[t]))
        result.append(tuple(sorted(found, key=lambda item: (item[1], item[0]))))
    return tuple(result)


def block_plans(graph: ir.Graph, part: ChainPartition, rockmate_options, bandwidth: int, excluded: set[str]):
    """(chain with every block's options costed by `replay`, one BlockPlan per block):
    Rockmate's options (`rockmate_options[l].backward`, option 0 is as PyTorch) plus
    forward-and-forget and recompute-cheap-ops (section 4.4) when they differ."""
    blocks, plans = [], []
    for l, ops in enumerate(part.blocks):
        hg = op_hgraph(graph, ops.forward, ops.backward)
        names = ops.forward + ops.backward
        index = {name: k for k, name in enumerate(names)}
        schedules = [tuple(index[n] for n in b) for b in rockmate_options[l].backward]
        kinds = [AS_PYTORCH] + [ROCKMATE] * (len(schedules) - 1)
        if 0 < hg.boundary < len(hg.nodes):
            cheap = cheap_ops(hg, bandwidth)
            for kind, schedule in (
                (FORGET, recompute_schedule(hg, lambda k: True)),
                (CHEAP, recompute_schedule(hg, cheap.__contains__)),
            ):
                if schedule not in schedules:
                    schedules.append(schedule)
                    kinds.append(kind)
        blocks.append(_block_with_options(part.chain.blocks[l], part.chain.delta_bytes(l), hg, schedules))
        plans.append(
            BlockPlan(
                tuple(tuple(names[k] for k in s) for s in schedules),
                tuple(kinds),
                tuple(offloadable(hg, s, excluded) for s in schedules),
            )
        )
    return replace(part.chain, blocks=tuple(blocks)), tuple(plans)


# ---------------------------------------------------------------------------
# The O-ILP (section 4.5.2)
# ---------------------------------------------------------------------------


@dataclass(frozen=True)
class OilpSolution:
    """options[l-1]: the option of block l; offloaded[l-1]: its offloaded bytes (Ofl, float);
    prefetched[l-1]: {k: bytes prefetched at the start of B_k}; time_us: the objective."""

    options: tuple[int, ...]
    offloaded: tuple[float, ...]
    prefetched: tuple[dict[int, float], ...]
    time_us: float
    result: milp.MilpResult
    # NOTE: [Offloaded block outputs]: OflI[l-1], bytes of block l's outputs offloaded, and PrfI[l-1],
    # {k: bytes of them prefetched at the start of B_k}, k > l
    outputs_offloaded: tuple[float, ...] = ()
    outputs_prefetched: tuple[dict[int, float], ...] = ()
    # NOTE: [Joint O-ILP]: the block fractions when the model had the whole step's terms
    placement: BlockPlacement | None = None


@dataclass(frozen=True)
class WholeStep:
    """The whole step's terms of NOTE: [Joint O-ILP], per block (index l-1), in bytes.

    parameters: bytes of the parameters block l reads first in the forward, trainable and
    frozen (|w| of eq. 4.14); trainable: of them, those with a gradient; states: their
    optimizer states (k |w|_g of eq. 4.15); gradients: their gradients, held from B_l to
    their update at its end; temps: the largest device update's temporaries among them;
    updates: how many parameters the block updates (H is per update, eq. 4.23); speeds:
    the device's and the host's update speeds (bytes of parameter per second, 0: not
    timed) and the host's overhead per update (microseconds), alpha_G, alpha_C and H of
    eq. 4.20 and 4.23."""

    parameters: tuple[int, ...]
    trainable: tuple[int, ...]
    states: tuple[int, ...]
    gradients: tuple[int, ...]
    temps: tuple[int, ...]
    updates: tuple[int, ...]
    speeds: tuple[int, int, int]

    def held(self) -> int:
        """Bytes the step holds with every parameter and state on the device (s = o = g =
        0): the parameters and states throughout, and the largest backward step's
        gradients and update temporaries."""
        most = max((g + t for g, t in zip(self.gradients, self.temps)), default=0)
        return sum(self.parameters) + sum(self.states) + most


@dataclass(frozen=True)
class BlockPlacement:
    """The joint O-ILP's placement fractions per block (index l-1), each in [0, 1]:
    streamed (s), updated on the host (o), states paged (g), copied back after a host
    update (w), written back after a device update (v); NOTE: [Placement ILP] in
    remat_dsl.solve.solvers.ilp.placement names them."""

    streamed: tuple[float, ...]
    on_host: tuple[float, ...]
    paged: tuple[float, ...]
    copied_back: tuple[float, ...]
    written_back: tuple[float, ...]


def parameter_blocks(graph: ir.Graph, part: ChainPartition) -> dict[str, int]:
    """parameter -> the block l (1-based) whose ops read it first in the graph's order
    (the forward before the backward); one only the prelude or no block reads goes to the
    last block."""
    block_of = {name: l for l, b in enumerate(part.blocks, 1) for name in (*b.forward, *b.backward)}
    parameters = {p.name for p in graph.parameters}
    result: dict[str, int] = {}
    for op in graph.ops:
        l = block_of.get(op.name)
        if l is None:
            continue
        for name in sorted({r.name for r in ir.op_refs(op)} & parameters):
            result.setdefault(name, l)
    return {p: result.get(p, len(part.blocks)) for p in sorted(parameters)}


def whole_step(
    block_of: dict[str, int], L: int, *, sizes: dict[str, int], trainable: set[str], state_bytes, temp_bytes,
    speeds: tuple[int, int, int],
) -> WholeStep:  # fmt: skip
    """The WholeStep of L blocks whose parameters are `block_of` (parameter_blocks), sizes
    in bytes per parameter; trainable: the parameters with a gradient (gradient bytes =
    parameter bytes); state_bytes / temp_bytes: bytes of optimizer state and of one device
    update's temporaries for a parameter of n bytes; speeds as WholeStep.speeds."""
    parameters, grads, states, temps, updates = ([0] * L for _ in range(5))
    for name, l in sorted(block_of.items()):
        parameters[l - 1] += sizes[name]
        if name in trainable:
            grads[l - 1] += sizes[name]
            states[l - 1] += state_bytes(sizes[name])
            temps[l - 1] = max(temps[l - 1], temp_bytes(sizes[name]))
            updates[l - 1] += 1
    return WholeStep(
        parameters=tuple(parameters), trainable=tuple(grads), states=tuple(states), gradients=tuple(grads),
        temps=tuple(temps), updates=tuple(updates), speeds=speeds,
    )  # fmt: skip


def parameter_fractions(
    placement: BlockPlacement, block_of: dict[str, int], sizes: dict[str, int], trainable: set[str],
    predicted_us: float,
):  # fmt: skip
    """The per-parameter Fractions (remat_dsl.solve.solvers.ilp.placement) of the block
    fractions: each parameter takes its block's; the smallest parameter (bytes, then
    name) is never streamed: the generated module finds its device by it, as in the
    placement LP."""
    from remat_dsl.solve.solvers.ilp.placement import Fractions

    smallest = min(block_of, key=lambda p: (sizes[p], p))
    streamed = {p: 0.0 if p == smallest else placement.streamed[l - 1] for p, l in block_of.items()}
    on_host = {p: placement.on_host[l - 1] for p, l in block_of.items() if p in trainable}
    paged = {p: placement.paged[l - 1] for p, l in block_of.items() if p in trainable}
    return Fractions(streamed, on_host, paged, predicted_us)


class _WholeTerms:
    """NOTE: [Joint O-ILP]: the placement variables of `whole` in `problem`, their
    constraints (4.6, 4.7, 4.11) and their terms of the memory, host, time and host queue
    rows (MiB, ms), for blocks 1..L; per_ms: ms to move one MiB over the link."""

    def __init__(self, problem: pulp.LpProblem, whole: WholeStep, L: int, per_ms: float):
        self.problem, self.L, self.per_ms = problem, L, per_ms
        mib = [tuple(x / MIB for x in values) for values in (whole.parameters, whole.trainable, whole.states)]
        self.P, self.Pg, self.S = ({l: values[l - 1] for l in range(1, L + 1)} for values in mib)
        self.G = {l: whole.gradients[l - 1] / MIB for l in range(1, L + 1)}
        self.T = {l: whole.temps[l - 1] / MIB for l in range(1, L + 1)}
        self.updates = {l: whole.updates[l - 1] for l in range(1, L + 1)}
        device_speed, host_speed, overhead = whole.speeds
        self.device_ms = MIB / device_speed * 1000 if device_speed else 0.0  # ms per MiB updated (1/alpha_G)
        self.host_ms = MIB / host_speed * 1000 if host_speed else 0.0  # (1/alpha_C)
        self.overhead_ms = overhead / MS if host_speed else 0.0  # H, per update
        blocks = range(1, L + 1)
        self.s = {l: problem.add_variable(f"s_{l}", 0, 1) for l in blocks}
        self.o = {l: problem.add_variable(f"o_{l}", 0, 1 if self.Pg[l] else 0) for l in blocks}
        self.g = {l: problem.add_variable(f"g_{l}", 0, 1 if self.Pg[l] else 0) for l in blocks}
        self.w = {l: problem.add_variable(f"w_{l}", 0, 1) for l in blocks}
        self.v = {l: problem.add_variable(f"v_{l}", 0, 1) for l in blocks}
        self.time_end = problem.add_variable("Time_end", 0)
        self.variables = {"s": self.s, "o": self.o, "g": self.g, "w": self.w, "v": self.v, "end": {0: self.time_end}}
        for l in blocks:
            problem += self.o[l] + self.g[l] <= 1, f"update_states_{l}"  # (4.6)
            problem += self.w[l] >= self.o[l] - self.s[l], f"copied_back_{l}"  # (4.11)
            problem += self.v[l] >= self.s[l] - self.o[l], f"written_back_{l}"  # (4.7)
        problem += self.time_end >= per_ms * pulp.lpSum(self.w[l] * self.Pg[l] for l in blocks), "copy_back_end"
        # what every step holds: (1-s)P of every block (4.14) and (1-o-g)S (4.15)
        self.resident = pulp.lpSum(
            (1 - self.s[l]) * self.P[l] + (1 - self.o[l] - self.g[l]) * self.S[l] for l in blocks
        )

    def memory(self, kind: str, l: int):
        """The parameters and states step (kind, l) holds, MiB (4.14-4.15), kind "F", "B"
        or "U" (the updates at the end of B_l): the resident ones, sP of the blocks it and
        the next step read, gS of the updates in it and the next step (paged states
        prefetched a step ahead), and in B_l the block's gradients and, while its device
        updates run, their temporaries."""
        s, g, P, S = self.s, self.g, self.P, self.S
        if kind == "F":  # the next step: F_{l+1}, or B_L after F_L
            ahead = s[l + 1] * P[l + 1] if l < self.L else g[l] * S[l]
            return self.resident + s[l] * P[l] + ahead
        ahead = s[l - 1] * P[l - 1] + g[l - 1] * S[l - 1] if l > 1 else 0
        held = self.resident + s[l] * P[l] + g[l] * S[l] + ahead + self.G[l]
        return held + (1 - self.o[l]) * self.T[l] if kind == "U" else held

    def host(self):
        """Host memory, MiB (4.18 as placement.py counts it): streamed parameters, the
        host updates' parameters and states, paged states."""
        return pulp.lpSum(
            self.s[l] * self.P[l] + self.o[l] * (self.Pg[l] + self.S[l]) + self.g[l] * self.S[l]
            for l in range(1, self.L + 1)
        )

    def device_update(self, l: int):
        """ms of B_l's device updates (4.20): (1 - o_l) P_l / alpha_G."""
        return (1 - self.o[l]) * self.Pg[l] * self.device_ms

    def prefetched(self, kind: str, l: int):
        """MiB the h2d stream carries in step (kind, l) for the next one (4.21): streamed
        parameters of the block read next, paged states of the update next; F_1 also
        fetches block 1's own."""
        s, g, P, S = self.s, self.g, self.P, self.S
        if kind == "F":
            ahead = s[l + 1] * P[l + 1] if l < self.L else s[l] * P[l] + g[l] * S[l]
            return ahead + (s[1] * P[1] if l == 1 else 0)
        return s[l - 1] * P[l - 1] + g[l - 1] * S[l - 1] if l > 1 else 0

    def offloaded(self, l: int):
        """MiB the d2h stream carries in B_l (4.22): gradients to host updates, paged
        states back, streamed parameters updated on the device written back."""
        return self.o[l] * self.G[l] + self.g[l] * self.S[l] + self.v[l] * self.Pg[l]

    def moved(self):
        """MiB the placement moves over the link in a step, both ways (the tie-break)."""
        return pulp.lpSum(
            2 * self.s[l] * self.P[l] + 2 * self.g[l] * self.S[l] + self.o[l] * self.G[l]
            + (self.w[l] + self.v[l]) * self.Pg[l]
            for l in range(1, self.L + 1)
        )  # fmt: skip

    def host_queue(self, times) -> None:
        """(4.23) one host queue fed as B_L..B_1 complete the gradients: the steps after
        B_k and the copy-back at the end last at least the host's updates of blocks k..1."""
        if not self.host_ms:
            return
        for k in range(1, self.L + 1):
            work = pulp.lpSum(
                self.o[j] * (self.Pg[j] * self.host_ms + self.updates[j] * self.overhead_ms) for j in range(1, k + 1)
            )
            self.problem += pulp.lpSum(times["B", j] for j in range(1, k)) + self.time_end >= work, f"host_queue_{k}"


class Oilp:
    """The O-ILP of NOTE: [O-ILP for activations] for `chain` and `plans`; `solve(target)`
    at a device budget (bytes), `floor()` the least budget it accepts (bytes)."""

    def __init__(
        self, chain: Chain, plans, bandwidth: int, host_budget: int | None, unseen: dict | None = None, outputs=None,
        tie: float = OffmateConfig.tie,
    ):  # fmt: skip
        self.chain, self.plans, self.bandwidth, self.host_budget = chain, plans, bandwidth, host_budget
        self.tie = tie  # OffmateConfig.tie
        self.L = chain.length
        # outputs[l-1]: bytes of block l's offloadable outputs (NOTE: [Offloaded block outputs]); none by default
        self.outputs = tuple(outputs) if outputs is not None else (0,) * self.L
        # ("F" | "B", l, o) -> bytes the chain model misses in that step when block l runs option o
        # (NOTE: [A_t from the simulation])
        self.unseen = unseen or {}
        self.results: list[milp.MilpResult] = []

    def memory(self, options) -> dict[tuple[str, int], int]:
        """("F" | "B", l) -> the memory constraint's left side (bytes) with block l running
        options[l-1] and nothing offloaded, without `unseen`."""
        chain, L = self.chain, self.L
        xbar = [b.variant(o)[0] for b, o in zip(chain.blocks, options)]
        result = {}
        for l in range(1, L + 1):
            earlier = sum(xbar[: l - 1])
            _, fwd_overhead, _, bwd_overhead = chain.blocks[l - 1].variant(options[l - 1])
            result["F", l] = chain.input_bytes + chain.delta_bytes(L) + earlier + xbar[l - 1] + fwd_overhead
            result["B", l] = earlier + xbar[l - 1] + chain.delta_bytes(l) + chain.delta_bytes(l - 1) + bwd_overhead
        return result

    def _model(self, target: int | None, whole: WholeStep | None = None, fixed: OilpSolution | None = None):
        """(problem, Comp, Ofl, Prf, M, Time, OflI, PrfI, placement): minimize sum Time at M
        = target MiB, or, when target is None, minimize M itself (the floor).  whole: the
        whole step's terms (NOTE: [Joint O-ILP]), placement then {"s" | "o" | "g" | "w" |
        "v": {l: variable}}, else None; fixed: a solution whose options and offloaded bytes
        the model keeps (the sequential plan: only the placement free)."""
        chain, L = self.chain, self.L
        problem = pulp.LpProblem("oilp", pulp.LpMinimize)
        n = [1 + len(b.options) for b in chain.blocks]
        comp = {
            (l, o): pulp.LpVariable(f"Comp_{l}_{o}", cat="Binary") for l in range(1, L + 1) for o in range(n[l - 1])
        }
        ofl = {l: pulp.LpVariable(f"Ofl_{l}", lowBound=0) for l in range(1, L + 1)}
        prf = {(j, k): pulp.LpVariable(f"Prf_{j}_{k}", lowBound=0) for j in range(1, L + 1) for k in range(j, L + 1)}
        # NOTE: [Offloaded block outputs]: OflI[j] MiB of block j's outputs, PrfI[j, k] of them back at B_k, k > j
        movable = [j for j in range(1, L) if self.outputs[j - 1] > 0]
        ofl_i = {j: pulp.LpVariable(f"OflI_{j}", lowBound=0, upBound=self.outputs[j - 1] / MIB) for j in movable}
        prf_i = {(j, k): pulp.LpVariable(f"PrfI_{j}_{k}", lowBound=0) for j in movable for k in range(j + 1, L + 1)}
        steps = [("F", l) for l in range(1, L + 1)] + [("B", l) for l in range(L, 0, -1)]
        times = {s: pulp.LpVariable(f"Time_{s[0]}_{s[1]}", lowBound=0) for s in steps}
        memory = pulp.LpVariable("M", lowBound=0) if target is None else target / MIB

        def cost(l, field):  # sum_o cost^{l,o} Comp[l,o], `field` of Block.variant
            return pulp.lpSum(chain.blocks[l - 1].variant(o)[field] * comp[l, o] for o in range(n[l - 1]))

        def x(l):
            return (1 / MIB) * cost(l, 0)

        def unseen(kind, l):  # A_t beyond rotor's chain (NOTE: [A_t from the simulation]), MiB
            return pulp.lpSum(self.unseen.get((kind, l, o), 0) / MIB * comp[l, o] for o in range(n[l - 1]))

        per_ms = MIB / self.bandwidth * 1000  # ms to move one MiB
        joint = _WholeTerms(problem, whole, L, per_ms) if whole is not None else None
        if fixed is not None:  # the sequential plan: the activation decisions of `fixed`
            for l in range(1, L + 1):
                problem += comp[l, fixed.options[l - 1]] == 1, f"fixed_option_{l}"
                problem += ofl[l] == fixed.offloaded[l - 1] / MIB, f"fixed_offload_{l}"
                if l in ofl_i:
                    problem += ofl_i[l] == fixed.outputs_offloaded[l - 1] / MIB, f"fixed_output_offload_{l}"

        for l in range(1, L + 1):
            problem += pulp.lpSum(comp[l, o] for o in range(n[l - 1])) == 1, f"one_option_{l}"  # (4.1)
            capacity = pulp.lpSum(
                sum(b for _, b in self.plans[l - 1].offloadable[o]) / MIB * comp[l, o] for o in range(n[l - 1])
            )
            problem += ofl[l] <= capacity, f"offloadable_{l}"
            problem += pulp.lpSum(prf[l, k] for k in range(l, L + 1)) == ofl[l], f"back_by_B_{l}"  # (4.9)
            if l in ofl_i:
                problem += pulp.lpSum(prf_i[l, k] for k in range(l + 1, L + 1)) == ofl_i[l], f"output_back_by_B_{l + 1}"
        base = (chain.input_bytes + chain.delta_bytes(L)) / MIB
        for l in range(1, L + 1):  # (4.16, 4.17)
            earlier = pulp.lpSum(x(j) - ofl[j] for j in range(1, l))
            unseen_f, unseen_b = unseen("F", l), unseen("B", l)
            gone_f = pulp.lpSum(ofl_i[j] for j in range(1, l - 1) if j in ofl_i)  # block l reads block l-1's outputs
            held_f = joint.memory("F", l) if joint else 0
            problem += (
                base + unseen_f + earlier - gone_f + x(l) + (1 / MIB) * cost(l, 1) + held_f <= memory
            ), f"memory_F_{l}"
            back = pulp.lpSum(prf[j, k] for j in range(1, l) for k in range(l, L + 1))
            back += pulp.lpSum(
                prf_i[j, k] - (ofl_i[j] if k == l else 0) for j in range(1, l) if j in ofl_i for k in range(l, L + 1)
            )
            deltas = (chain.delta_bytes(l) + chain.delta_bytes(l - 1)) / MIB + unseen_b
            held_b = joint.memory("B", l) if joint else 0
            problem += earlier + back + x(l) + deltas + (1 / MIB) * cost(l, 3) + held_b <= memory, f"memory_B_{l}"
            if joint:  # block l's updates at the end of B_l: its activations and backward freed, its gradients made
                outputs = chain.delta_bytes(l - 1) / MIB
                problem += earlier + back + outputs + unseen_b + joint.memory("U", l) <= memory, f"memory_update_{l}"
        if self.host_budget is not None:  # (4.18)
            host = pulp.lpSum([*ofl.values(), *ofl_i.values()]) + (joint.host() if joint else 0)
            problem += host <= self.host_budget / MIB, "host_memory"
        for l in range(1, L + 1):
            problem += times["F", l] >= chain.blocks[l - 1].fwd_us / MS, f"compute_F_{l}"  # (4.19)
            # block l-1's outputs are copied while F_l runs and deleted at its end
            copied = ofl[l] + (ofl_i[l - 1] if l - 1 in ofl_i else 0)
            problem += times["F", l] >= per_ms * copied, f"offload_F_{l}"  # (4.22)
            own = prf[l, l] + (prf_i[l - 1, l] if l - 1 in ofl_i else 0)  # what B_l reads first: not overlapped
            update = joint.device_update(l) if joint else 0
            problem += times["B", l] >= (1 / MS) * cost(l, 2) + per_ms * own + update, f"compute_B_{l}"  # (4.20)
            incoming = [prf[j, l] for j in range(1, l + 1)] + [prf_i[j, l] for j in range(1, l) if j in ofl_i]
            fetched = joint.prefetched("B", l) if joint else 0
            problem += times["B", l] >= per_ms * (pulp.lpSum(incoming) + fetched), f"prefetch_B_{l}"  # (4.21)
            if joint:
                problem += times["F", l] >= per_ms * joint.prefetched("F", l), f"prefetch_F_{l}"  # (4.21)
                problem += times["B", l] >= per_ms * joint.offloaded(l), f"offload_B_{l}"  # (4.22)
        if joint:
            joint.host_queue(times)  # (4.23)
        # Ties (time equal) go to fewer offloaded bytes and later prefetches: less memory the ILP does not see
        # (parameter gradients) and fewer transfers; `tie` is far below one microsecond per MiB.
        late = pulp.lpSum((k - j) * var for (j, k), var in [*prf.items(), *prf_i.items()])
        moved = pulp.lpSum([*ofl.values(), *ofl_i.values()])
        if joint:  # the same tie for the parameters' and states' transfers
            moved += joint.moved()
        total = pulp.lpSum(times.values()) + (joint.time_end if joint else 0)
        problem += memory if target is None else total + self.tie * (moved + late)
        return problem, comp, ofl, prf, memory, times, ofl_i, prf_i, joint.variables if joint else None

    @functools.cached_property
    def floor(self) -> int:
        """The least budget (bytes) with a solution: every offloadable byte offloaded where it pays."""
        problem, _, _, _, memory, *_ = self._model(None)
        result = milp.solve(problem, rel_gap=milp.OPTIMAL_GAP)
        self.results.append(result)
        if not result.has_solution:
            raise RuntimeError(f"the O-ILP's floor problem has no solution ({result.status})")
        return math.ceil(memory.value() * MIB) + 1

    def solve(
        self, target: int, time_limit: float | None = None, whole: WholeStep | None = None,
        fixed: OilpSolution | None = None,
    ) -> OilpSolution | None:  # fmt: skip
        """The O-ILP at budget `target` (bytes), with the whole step's terms `whole` when
        given (NOTE: [Joint O-ILP]), keeping the options and offloads of `fixed` when given;
        None when it has no solution."""
        problem, comp, ofl, prf, _, times, ofl_i, prf_i, placement = self._model(target, whole, fixed)
        result = milp.solve(problem, time_limit)
        self.results.append(result)
        if not result.has_solution:
            return None
        L = self.L
        options = tuple(
            max((o for (l2, o) in comp if l2 == l), key=lambda o: comp[l, o].value()) for l in range(1, L + 1)
        )
        offloaded = tuple(max(0.0, ofl[l].value() or 0.0) * MIB for l in range(1, L + 1))
        prefetched = tuple(
            {k: max(0.0, prf[l, k].value() or 0.0) * MIB for k in range(l, L + 1)} for l in range(1, L + 1)
        )
        ends = [placement["end"][0]] if placement is not None else []
        total = sum(t.value() or 0.0 for t in [*times.values(), *ends]) * MS
        outputs_offloaded = tuple(
            max(0.0, ofl_i[l].value() or 0.0) * MIB if l in ofl_i else 0.0 for l in range(1, L + 1)
        )
        outputs_prefetched = tuple(
            {k: max(0.0, prf_i[l, k].value() or 0.0) * MIB for k in range(l + 1, L + 1)} if l in ofl_i else {}
            for l in range(1, L + 1)
        )
        fractions = None
        if placement is not None:

            def values(kind: str) -> tuple[float, ...]:
                return tuple(min(1.0, max(0.0, round(placement[kind][l].value() or 0.0, 6))) for l in range(1, L + 1))

            fractions = BlockPlacement(values("s"), values("o"), values("g"), values("w"), values("v"))
        return OilpSolution(
            options, offloaded, prefetched, total, result, outputs_offloaded, outputs_prefetched, fractions
        )


# ---------------------------------------------------------------------------
# Whole tensors (section 4.6)
# ---------------------------------------------------------------------------


def select_at_least(tensors, target: float) -> list[tuple[str, int]]:
    """A subset of `tensors` ((name, bytes)) of at least `target` bytes, close to it:
    greedy, largest first, each tensor taken while the sum stays within `target`, then
    the smallest remaining one that reaches it, then the taken ones it made useless
    dropped, smallest first (section 4.6, SELECT).  All of them when
    their sum is below `target`.  Deterministic: ties by name."""
    ordered = sorted(tensors, key=lambda item: (-item[1], item[0]))
    chosen, total = [], 0
    for item in ordered:
        if total + item[1] <= target:
            chosen.append(item)
            total += item[1]
    if total < target:
        rest = [item for item in ordered if item not in chosen and total + item[1] >= target]
        if not rest:
            return ordered
        chosen.append(rest[-1])
        total += rest[-1][1]
        for item in sorted(chosen, key=lambda item: (item[1], item[0])):  # drop what the last one made useless
            if total - item[1] >= target:
                chosen.remove(item)
                total -= item[1]
    return sorted(chosen, key=lambda item: (item[1], item[0]))


def prefetch_steps(tensors, prefetched: dict[int, float], last: int) -> dict[str, int]:
    """tensor -> block k whose backward step starts with its prefetch: the steps B_L..B_{last}
    in the order they run, each taking tensors (largest first) while the bytes prefetched
    so far stay at most the ILP's cumulative `prefetched`; B_{last}, the block's own
    backward step, takes the rest (NOTE: [Whole tensors])."""
    remaining = sorted(tensors, key=lambda item: (-item[1], item[0]))
    steps: dict[str, int] = {}
    cumulative, assigned = 0.0, 0
    for k in sorted(prefetched, reverse=True):
        cumulative += prefetched[k]
        if k == last:
            break
        for item in list(remaining):
            if assigned + item[1] <= cumulative + 0.5:
                steps[item[0]] = k
                assigned += item[1]
                remaining.remove(item)
    for name, _ in remaining:
        steps[name] = last
    return steps


# ---------------------------------------------------------------------------
# Shaving the peak (a post-pass on the exact simulation)
# ---------------------------------------------------------------------------

def shaved(
    graph: ir.Graph, order, transfers, target: int, simulated, excluded: set[str], bandwidth: int, host_budget=None,
    max_shaves: int = OffmateConfig.max_shaves,
):  # fmt: skip
    """NOTE: [Shaving the peak] (transfers, plan): `transfers` and more, one saved tensor at
    a time, while the exact simulation of (`order`, transfers) peaks above `target` bytes.

    The O-ILP sees a step as a whole (a prefetch counts from its step's start, a block's
    saved activations from the start of its backward step), and Rockmate's plans move
    nothing; inside a step, a tensor that waits on the device for a later use is what the
    exact peak often holds besides the running op's working set (on examples/gpt2.py at
    its smallest budget: the attention block's input and layer norm output, waiting for
    the block's last backward ops).  Each round takes the peak instruction of the plan
    simulated so far (`simulated(order, transfers)`, the one lowering and checker) and,
    among the tensors live there that were made in the forward, stay resident to the
    peak without any use in the backward before it, are not read or made by it, and are
    neither pinned nor `excluded` nor moved already, offloads the one whose copy back can
    hide behind the compute before its use, then the largest (ties by name): right after
    it is made, its device copy deleted once its last forward read and its copy are done
    (before a forward peak), prefetched after the peak as late as the compute before its
    next use still hides the copy (NOTE: [Solver transfers] in remat_dsl.solve.lowering
    places the waits).  A tensor already moved whose prefetch comes before a backward peak
    and its first use after it (the O-ILP prefetches at the start of a step) competes too:
    its prefetch goes after the peak, placed the same way.  A tensor absent over an
    interval where it was resident lowers memory there and nowhere raises it, so the peak
    never rises; the round is kept when the peak fell (or moved), and the pass stops at
    `target`, after `max_shaves` rounds, or when no tensor qualifies; it returns the plan
    given when its peak did not fall at all.  The bytes offloaded stay within
    `host_budget` (eq. 4.18; None: unlimited).  The time may grow by the copies the
    compute does not hide: callers
    compare plans by time among those that fit.  Deterministic: no clock, ties by name."""
    from remat_dsl.check.replay import simulate

    transfers = tuple(transfers)
    plan = simulated(order, transfers)
    if plan.header.peak_bytes <= target:
        return transfers, plan
    given = transfers, plan
    ops = graph.op_by_name
    names = {t.name for t in graph.tensors}
    producers = graph.producer
    nbytes = graph.nbytes
    first_run = {name: i for i, name in reversed(list(enumerate(order)))}
    n_forward = next((i for i, name in enumerate(order) if ops[name].phase == ir.BACKWARD), len(order))
    reads = [set(op_uses(ops[name], names)) for name in order]
    room = None if host_budget is None else host_budget - sum(nbytes[t.tensor] for t in transfers)
    makes = [set(ops[name].outputs) for name in order]
    for _ in range(max_shaves):
        sim = simulate(plan)
        instructions = (*plan.forward, *plan.backward)
        peak = next(k for k, step in enumerate(sim.timeline) if step.mem_peak == sim.peak_bytes)
        at = _order_positions(instructions, order)
        if at is None:
            break
        before = max((a for a in at[: peak + 1] if a is not None), default=-1)  # the op at or before the peak
        running = at[peak]  # the op the peak instruction runs, or None
        in_backward = peak >= len(plan.forward)
        moved = {t.tensor: k for k, t in enumerate(transfers)}
        best: tuple[tuple[bool, int, str], Transfer, int | None] | None = None
        for name, _ in sim.timeline[peak].live:
            if name in moved and in_backward and name not in excluded:  # a prefetch before the peak: later
                old = transfers[moved[name]]
                uses = [i for i in range(old.prefetch_before, len(order)) if name in reads[i] or name in makes[i]]
                if old.prefetch_before > before or not uses or uses[0] <= before or name in makes[uses[0]]:
                    continue
                fetch, hidden = _latest_fetch(order, ops, before + 1, uses[0], transfer_us(nbytes[name], bandwidth))
                key = (hidden < transfer_us(nbytes[name], bandwidth), -nbytes[name], name)
                if best is None or key < best[0]:
                    best = (key, replace(old, prefetch_before=fetch), moved[name])
                continue
            if name not in names or name in moved or name in excluded or name not in sim.crossing.resident:
                continue
            if room is not None and nbytes[name] > room:
                continue
            made = first_run.get(producers[name])
            if made is None or made >= n_forward or sum(name in makes[i] for i in range(n_forward)) != 1:
                continue  # made once in the forward, the copy the peak holds
            if running is not None and (name in reads[running] or name in makes[running]):
                continue
            later = [i for i in range(n_forward, len(order)) if name in reads[i] or name in makes[i]]
            if not later or name in makes[later[0]]:
                continue
            last_forward = max([i for i in range(made, n_forward) if name in reads[i]], default=made)
            if in_backward:
                if later[0] <= before:  # read in the backward before the peak: its device copy is needed there
                    continue
                start, limit = max(before + 1, n_forward), later[0]
                wait_limit = n_forward - 1
            else:
                if last_forward >= before:
                    continue
                start, limit = n_forward, later[0]
                wait_limit = before - 1
            copy = transfer_us(nbytes[name], bandwidth)
            wait = last_forward
            while wait < wait_limit and sum(ops[order[i]].time_us for i in range(made + 1, wait + 1)) < copy:
                wait += 1
            fetch, hidden = _latest_fetch(order, ops, start, limit, copy)
            key = (hidden < copy, -nbytes[name], name)
            if best is None or key < best[0]:
                best = (key, Transfer(name, made, wait, fetch), None)
        if best is None:
            break
        _, transfer, index = best
        edited = (*transfers, transfer) if index is None else (*transfers[:index], transfer, *transfers[index + 1 :])
        try:
            candidate = simulated(order, edited)
        except (PlanError, ValueError):  # a rule of the checker, or a transfer out of order: not this tensor
            excluded = excluded | {transfer.tensor}
            continue
        if candidate.header.peak_bytes > plan.header.peak_bytes:
            break
        transfers, plan = edited, candidate
        room = None if room is None or index is not None else room - nbytes[transfer.tensor]
        if plan.header.peak_bytes <= target:
            break
    return (transfers, plan) if plan.header.peak_bytes < given[1].header.peak_bytes else given


def _latest_fetch(order, ops, start: int, limit: int, copy: int) -> tuple[int, int]:
    """(position, microseconds): the latest op position in [start, limit] to prefetch before
    so that the ops from it up to the use at `limit` take `copy` microseconds (`start` when
    none does), and how long they take."""
    fetch, hidden = limit, 0
    while fetch > start and hidden < copy:
        fetch -= 1
        hidden += ops[order[fetch]].time_us
    return fetch, hidden


def _order_positions(instructions, order) -> list[int | None] | None:
    """For each instruction, the position in `order` of the op it runs (None for other
    verbs); None when a run is not in `order` (the constraints edited it)."""
    position: dict[tuple[str, int], int] = {}
    count: dict[str, int] = defaultdict(int)
    for i, name in enumerate(order):
        position[name, count[name]] = i
        count[name] += 1
    seen: dict[str, int] = defaultdict(int)
    result: list[int | None] = []
    for ins in instructions:
        if ins.runs_op:
            at = position.get((ins.target, seen[ins.target]))
            if at is None:
                return None
            seen[ins.target] += 1
            result.append(at)
        else:
            result.append(None)
    return result


# ---------------------------------------------------------------------------
# The solver
# ---------------------------------------------------------------------------


class Offmate(Solver):
    """`--solver offmate`: the O-ILP of thesis chapter 4 for activations (NOTE: [O-ILP for
    activations]) over Rockmate's blocks, each with Rockmate's options and those of
    section 4.4; whole tensors chosen as in section 4.6 (NOTE: [Whole tensors]); never
    worse than Rockmate's plan at the same target (NOTE: [Never worse than recomputation]).

    Offloads travel at `problem.bandwidth` (bytes/s); `problem.host_budget` (bytes, None
    for unlimited) bounds the offloaded bytes (eq. 4.18).  Raises BudgetError below the
    O-ILP's floor (with every offloadable byte offloaded) and RK-Rotor's.  `part`: the
    blocks (default Rockmate's; `fallbacks` gives the same solver over rotor's finer
    blocks, as rockmate does)."""

    name = "offmate"
    auto_rank = 0
    optimizes = True
    Config = OffmateConfig

    def __init__(self, problem: Problem, part: ChainPartition | None = None, config: OffmateConfig | None = None):
        self.config = config or OffmateConfig()
        start = time.perf_counter()
        self.problem, self.finer = problem, part is not None
        graph = problem.graph
        c = self.config
        if part is None:
            say_phase(problem.report, "partitioning the graph into blocks")
        self.part = part or partition(graph, c.max_blocks, 1, is_small_chain(graph), c.min_block_ops)
        points = self.config.peak_steps * self.config.save_steps
        limit = per_ilp_limit(problem.time_limit, len(self.part.blocks), points)
        self.rc = rockmate_chain(graph, self.part, limit, problem.report, jobs=problem.jobs, config=self.config)
        excluded = pinned_tensors(graph)
        for kind in ("offload", "no-offload", "recompute"):
            excluded |= set(matching(graph, problem.constraints, kind))
        self.chain, self.plans = block_plans(graph, self.part, self.rc.options, problem.bandwidth, excluded)
        self.outputs = interface_tensors(graph, self.part, excluded)
        self.excluded = excluded
        self.oilp = Oilp(
            self.chain,
            self.plans,
            problem.bandwidth,
            problem.host_budget,
            outputs=[sum(b for _, b in o) for o in self.outputs],
            tie=self.config.tie,
        )
        self.oilp.unseen = self._unseen()
        self.seconds = time.perf_counter() - start

    @classmethod
    def fits(cls, problem: Problem) -> bool:
        """`auto` runs offmate when the plan has a host link and Rockmate's chain fits the graph."""
        return problem.host_link and is_small_chain(problem.graph)

    def describe(self) -> str:
        options = sum(len(p.kinds) for p in self.plans)
        host = (
            "unlimited" if self.problem.host_budget is None else human_bytes(self.problem.host_budget).replace(" ", "")
        )
        finer = "rotor-blocks " if self.finer else ""
        return f"{finer}blocks={len(self.part.blocks)} options={options} host-budget={host}"

    @property
    def info(self) -> SolverInfo:  # type: ignore[override]  # read-only: the driver only reads it
        status, gap = milp.status_of(list(self.rc.results) + self.oilp.results)
        return SolverInfo(Status(status), gap, self.seconds + sum(r.seconds for r in self.oilp.results))

    def floor(self) -> int:
        """The least target (bytes) solve() accepts: the O-ILP's floor, or RK-Rotor's below it."""
        return min(self.oilp.floor, self._rk_floor)

    def floor_targets(self) -> list[int]:
        """Targets near the O-ILP's floor and near RK-Rotor's (api.floor_targets): the
        driver's smallest budget is the least exact peak of their plans."""
        return sorted({math.ceil(f * x) for f in (self.oilp.floor, self._rk_floor) for x in FLOOR_SWEEP})

    @functools.cached_property
    def _rk_floor(self) -> int:
        return rk_min_feasible_budget(self.rc.chain, self.config.slots)

    def fallbacks(self):
        """NOTE: [Two partitions] of rockmate.py: a budget these blocks cannot meet is tried
        again by the O-ILP over rotor's finer blocks (their bottleneck step holds less),
        where their ILPs are `affordable`."""
        if not self.finer:
            rotors = partition(self.problem.graph, self.config.max_blocks)
            if affordable(rotors, self.part):
                yield Offmate(self.problem, rotors, self.config)

    def solve(self, target: int) -> SolverResult:
        """The O-ILP's plan at `target` bytes, or Rockmate's when it predicts less time or
        the O-ILP has none (NOTE: [Never worse than recomputation]), each shaved to the
        target by more offloads where its exact peak is above it (NOTE: [Shaving the
        peak]); at or below the O-ILP's floor, where no plan of the O-ILP is cheaper, as
        far as the shaving goes (the driver's smallest budget is the least peak of the
        plans at the floor targets).  Raises BudgetError when neither has a plan."""
        solution = self.oilp.solve(target, self.problem.time_limit)
        theirs = self._rockmate(target)
        goal = 0 if target <= self.oilp.floor else target  # at the floor: as low as the shaving goes
        if solution is None and theirs is None:
            raise BudgetError(target, self.floor(), self.name)
        if theirs is not None:
            their_transfers, plan = self._shaved(theirs[0], (), goal)
        if solution is None:
            note = "offmate: kept Rockmate's plan (the O-ILP has none at this target)" + _moved(their_transfers)
            return self._result(theirs[0], note, theirs[1], their_transfers)
        order, decisions, transfers = self._lowerable(solution)
        planned = len(transfers)
        transfers, ours = self._shaved(order, transfers, goal)
        if theirs is not None and _better(plan.header, ours.header, target):
            note = (
                f"offmate: kept Rockmate's plan ({format_duration(plan.header.time_us)}) over the O-ILP's "
                f"({format_duration(ours.header.time_us)}) at this target{_moved(their_transfers)}"
            )
            return self._result(theirs[0], note, theirs[1], their_transfers)
        other = f", Rockmate's {format_duration(plan.header.time_us)}" if theirs is not None else ""
        note = f"offmate: O-ILP plan kept (predicted {format_duration(ours.header.time_us)}{other})"
        return self._result(order, note, decisions, transfers, len(transfers) - planned)

    def solve_step(self, target: int, step: StepProblem):
        """NOTE: [Joint O-ILP]: the Solver contract's joint plan of the whole step: the
        O-ILP with `step`'s terms (`whole_step` over `parameter_blocks`) at `target` bytes,
        the whole step's budget; (its activation part lowered as `solve` lowers the O-ILP's,
        NOTE: [Whole tensors], without the shaving and Rockmate's plan, since the exact
        simulation of the whole step judges it; the block fractions as each parameter's,
        placement.Fractions), or None when the model has no solution or no block reads a
        parameter."""
        graph = step.graph
        sizes = {p.name: math.prod(p.shape) * ir.DTYPE_ITEMSIZE[p.dtype] for p in graph.parameters}
        trainable = {g.parameter for g in graph.gradients if g.value is not None} & set(sizes)
        block_of = parameter_blocks(graph, self.part)
        if not block_of:
            return None
        whole = whole_step(
            block_of, len(self.part.blocks), sizes=sizes, trainable=trainable, state_bytes=step.state_bytes,
            temp_bytes=step.temp_bytes, speeds=step.speeds,
        )  # fmt: skip
        say_phase(self.problem.report, "solving the joint O-ILP")
        solution = self.oilp.solve(target, self.problem.time_limit, whole=whole)
        if solution is None:
            return None
        assert solution.placement is not None
        order, decisions, transfers = self._lowerable(solution)
        note = f"offmate: joint O-ILP, parameters placed (predicted {format_duration(round(solution.time_us))})"
        result = SolverResult(order, self.info, (Decision(0, note), *decisions), transfers)
        return result, parameter_fractions(solution.placement, block_of, sizes, trainable, solution.time_us)

    def _result(self, order, note: str, decisions, transfers, shaved: int | None = None) -> SolverResult:
        """The SolverResult, with a comment above the compute of each tensor the shaving
        added (the last `shaved` transfers, all of them when None)."""
        transfers = tuple(transfers)
        added = transfers[len(transfers) - (len(transfers) if shaved is None else shaved) :]
        words = [Decision(t.offload_after, self._shave_words(order, t)) for t in added]
        return SolverResult(order, self.info, (Decision(0, note), *decisions, *words), transfers)

    def _shave_words(self, order, transfer: Transfer) -> str:
        """`offload 1 tensors, 256.00 KiB, prefetched during transformer.h.0.attn's
        backward`, above the compute that makes a tensor the shaving moved, within
        TEXT_WIDTH characters."""
        size = human_bytes(next(t.nbytes for t in self.problem.graph.tensors if t.name == transfer.tensor))
        op = order[transfer.prefetch_before]
        l = next((l for l, b in enumerate(self.part.blocks, 1) if op in b.backward), None)
        for children in (3, 2, 1, 0):
            name = "the" if l is None else block_name(self.part, l, children) + "'s" if children else f"block {l}'s"
            text = f"offload 1 tensors, {size}, prefetched during {name} backward"
            if len(text) <= TEXT_WIDTH:
                break
        return text

    def _shaved(self, order, transfers, target: int):
        """(transfers, plan): NOTE: [Shaving the peak], none where keep or recompute
        constraints edit the order (the instructions' runs would not be the order's)."""
        if any(c.kind in ("keep", "recompute") for c in self.problem.constraints):
            return tuple(transfers), self._simulated(order, transfers)
        p = self.problem
        return shaved(
            p.graph, order, transfers, target, self._simulated, self.excluded, p.bandwidth, p.host_budget,
            self.config.max_shaves,
        )  # fmt: skip

    def _unseen(self) -> dict[tuple[str, int, int], int]:
        """NOTE: [A_t from the simulation] ("F" | "B", l, o) -> bytes: the exact peak of
        step (F|B, l) minus the O-ILP's memory for it, in the plan where block l runs
        option o and the others run as PyTorch.

        A_t of eq. 4.17 is what a step holds besides the blocks' saved activations.
        Rotor's chain model sees only the interface activations and gradients; the exact
        simulation also sees the prelude, the model outputs kept to the end of the step,
        and the parameter gradients piling up during the backward (GPT-2's logits: 2 MiB
        where a block saves 5 MiB), and the block
        replays' peaks are not where the plan's are.  The store-all plan, then one plan
        per option of the first block of each class of identical blocks (that block on
        that option, the others as PyTorch; no solve) measure the difference for each
        step and option; the other blocks of a class take their class's change from
        option 0 at their own steps (26 plans for examples/gpt2.py, whatever its depth).  The
        O-ILP adds sum_o unseen[t, o] Comp[B(t), o] to A_t: a plan that changes the first
        block of a class from store-all is then predicted exactly, step by step."""
        from remat_dsl.check.replay import simulate

        options = [p.backward for p in self.plans]
        result: dict[tuple[str, int, int], int] = {}
        store_all = (0,) * self.chain.length
        first = [l for l in range(1, self.chain.length + 1) if self.rc.keys[l - 1] == l - 1]  # one block per class
        for block, o in [(0, 0)] + [(l, o) for l in first for o in range(1, len(self.plans[l - 1].kinds))]:
            column = store_all[: block - 1] + (o,) + store_all[block:] if block else store_all
            ops = self._chain_ops(column)
            order, _ = chain_steps(self.part, ops, options, self.chain)
            step_of = _step_of_positions(self.part, ops, options, len(order))
            runs: dict[tuple[str, int], int] = {}
            count: dict[str, int] = defaultdict(int)
            for at, name in enumerate(order):
                runs[name, count[name]] = at
                count[name] += 1
            exact: dict[tuple[str, int], int] = {}
            seen: dict[str, int] = defaultdict(int)
            step = ("F", 1)
            for entry in simulate(self._simulated(order, ())).timeline:
                ins = entry.instruction
                if ins.runs_op:
                    run = runs.get((ins.target, seen[ins.target]))
                    seen[ins.target] += 1
                    step = step_of[run] if run is not None else step
                exact[step] = max(exact.get(step, 0), entry.mem_peak)
            model = self.oilp.memory(column)
            for (kind, l), nbytes in model.items():
                if (l == block or not block) and (kind, l) in exact:
                    result[kind, l, o] = exact[kind, l] - nbytes
        for l in range(
            1, self.chain.length + 1
        ):  # an identical block: its class's change from option 0, at its own steps
            same = self.rc.keys[l - 1] + 1
            for o in range(1, len(self.plans[l - 1].kinds) if same != l else 0):
                for kind in ("F", "B"):
                    if (kind, l, 0) in result and (kind, same, o) in result and (kind, same, 0) in result:
                        result[kind, l, o] = result[kind, l, 0] + result[kind, same, o] - result[kind, same, 0]
        return result

    def _chain_ops(self, options) -> list[tuple]:
        """The O-ILP's step sequence: F_all 1..L, then B L..1, each with its option."""
        L = self.chain.length
        return [("F_all", l, options[l - 1]) for l in range(1, L + 1)] + [
            ("B", l, options[l - 1]) for l in range(L, 0, -1)
        ]

    def _simulated(self, order, transfers) -> ir.Plan:
        p = self.problem
        return lowered_plan(
            p.graph, order, constraints=p.constraints, device=p.device, bandwidth=p.bandwidth, transfers=transfers
        )

    def _rockmate(self, target: int):
        """(order, decisions) of RK-Rotor on Rockmate's chain at `target`, or None."""
        schedule = try_rk_rotor(self.rc.chain, target, self.config.slots)
        if schedule is None:
            return None
        return chain_steps(self.part, schedule.ops, [b.backward for b in self.rc.options], self.rc.chain)

    def _lowerable(self, solution: OilpSolution):
        """(order, decisions, transfers) of an O-ILP solution (NOTE: [Whole tensors])."""
        L = self.chain.length
        ops = self._chain_ops(solution.options)
        options = [p.backward for p in self.plans]
        order, decisions = chain_steps(self.part, ops, options, self.chain)
        starts = _step_starts(self.part, ops, options)
        position = {name: i for i, name in reversed(list(enumerate(order)))}  # first run: the forward compute
        producers = self.problem.graph.producer
        transfers, words = [], {}
        for l in range(1, L + 1):
            o = solution.options[l - 1]
            moved, steps = [], {}
            if solution.offloaded[l - 1] >= self.config.negligible * MIB:
                chosen = select_at_least(self.plans[l - 1].offloadable[o], solution.offloaded[l - 1])
                steps = prefetch_steps(chosen, solution.prefetched[l - 1], l)
                end = position[self.part.blocks[l - 1].forward[-1]]
                for name, _ in chosen:
                    transfers.append(Transfer(name, position[producers[name]], end, starts["B", steps[name]]))
                moved += chosen
            if solution.outputs_offloaded and solution.outputs_offloaded[l - 1] >= self.config.negligible * MIB:
                # NOTE: [Offloaded block outputs]: deleted at the end of F_{l+1}, back by B_{l+1}
                chosen = select_at_least(self.outputs[l - 1], solution.outputs_offloaded[l - 1])
                out_steps = prefetch_steps(chosen, solution.outputs_prefetched[l - 1], l + 1)
                end = position[self.part.blocks[l].forward[-1]]
                for name, _ in chosen:
                    transfers.append(Transfer(name, position[producers[name]], end, starts["B", out_steps[name]]))
                moved += chosen
                steps = {**steps, **out_steps}
            if moved:
                words[l] = self._offload_words(l, o, moved, steps)
        steps_run = [step for step in ops if _nonempty(self.part, step, options)]
        worded: list[Decision] = []
        for decision, (kind, l, _) in zip(decisions, steps_run):
            worded.append(decision)
            if kind != "B" and l in words:  # a second comment line under the option's own words
                worded.append(Decision(decision.at, words[l]))
        return order, tuple(worded), tuple(transfers)

    def _offload_words(self, l: int, o: int, chosen, steps: dict[str, int]) -> str:
        """`offload 4 tensors, 12.00 MiB (recompute cheap ops option), prefetched during
        transformer.h.4.attn's and its own backward`: what block l offloads, within
        TEXT_WIDTH characters (fewer children of the module paths, else `block k`; the
        option's kind left out last).  The line above it, chain_steps' words, names the
        block and its option."""
        size = human_bytes(sum(b for _, b in chosen))
        for kind, children in ((True, 3), (True, 2), (True, 1), (False, 1), (False, 0)):
            during = [
                "its own" if k == l else (block_name(self.part, k, children) if children else f"block {k}") + "'s"
                for k in sorted(set(steps.values()), reverse=True)
            ]
            option = f" ({self.plans[l - 1].kinds[o]} option)" if kind else ""
            text = f"offload {len(chosen)} tensors, {size}{option}, prefetched during {' and '.join(during)} backward"
            if len(text) <= TEXT_WIDTH:
                break
        return text


def _moved(transfers) -> str:
    """What the first comment adds when the shaving moved tensors of Rockmate's plan."""
    return f", {len(transfers)} tensors offloaded at its exact peaks" if transfers else ""


def _better(theirs, ours, target: int) -> bool:
    """Whether the plan of header `theirs` (Rockmate's) is kept over `ours` (the O-ILP's):
    faster with a peak within `target` bytes or no higher; or a lower peak when ours is
    above `target`."""
    fits = theirs.peak_bytes <= max(ours.peak_bytes, target)
    if theirs.time_us < ours.time_us and fits:
        return True
    return ours.peak_bytes > target and theirs.peak_bytes < ours.peak_bytes


def _nonempty(part: ChainPartition, step, options) -> bool:
    """chain_steps words only the steps that run ops."""
    kind, l, o = step
    return bool(part.blocks[l - 1].forward if kind != "B" else options[l - 1][o])


def _step_starts(part: ChainPartition, ops, options) -> dict[tuple[str, int], int]:
    """(kind, l) -> the position in chain_steps' order where that step starts (the next
    step's start when it runs no op)."""
    at, starts = len(part.prelude), {}
    for kind, l, o in ops:
        starts["B" if kind == "B" else "F", l] = at
        at += len(part.blocks[l - 1].forward if kind != "B" else options[l - 1][o])
    return starts


def _step_of_positions(part: ChainPartition, ops, options, length: int) -> list[tuple[str, int]]:
    """For each position of chain_steps' order: the step ("F" | "B", l) running it (the
    prelude counts as F_1)."""
    result = [("F", 1)] * len(part.prelude)
    for kind, l, o in ops:
        result += [("B" if kind == "B" else "F", l)] * len(
            part.blocks[l - 1].forward if kind != "B" else options[l - 1][o]
        )
    assert len(result) == length
    return result
