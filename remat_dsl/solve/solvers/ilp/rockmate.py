"""Rockmate: RK-Checkmate options per block, identical blocks solved once, RK-Rotor on top.

Zhao, PhD thesis "Optimizing Memory Usage when Training Deep Neural Networks" (2024),
chapter 2, Algorithm 3: for each block, RK-Checkmate (section 2.4, here
remat_dsl.solve.solvers.ilp.hilp on the block's ops) is solved on a grid of (M_peak, M_save)
budgets (section 2.6.0.0.1: M_peak evenly spaced between the largest temporary memory of
an op and the block's autograd peak, M_save evenly spaced between the block's output size
and M_peak); identical blocks (Zhao et al., "Rockmate", ICML 2023, appendix A.5: same
ops, same arguments up to renaming, same shapes) are solved once; the distinct schedules
become the blocks' options for RK-Rotor (section 2.5, remat_dsl.solve.solvers.chain.rk_rotor).

NOTE: [Option costs]
An option is the block's backward sequence (recomputations interleaved with backward
ops); its forward is the block's forward ops.  Its costs for the chain are not the
ILP's estimates but an exact replay of the block under the one lowering's liveness rule
(`replay`): abar^o is what is alive when the forward ends, o_f and o_b the peaks above
it.  Each block of a class is replayed with its own measured op times.

NOTE: [Chain memo]
A budget the solver cannot meet is refused with the smallest one it can.  The floor comes
from a min/max table over many budgets at once (`rk_rotor.min_feasible_budget`), but the
driver's targets at and above it each run RK-Rotor's cost table (`try_rk_rotor`), in both
partitions and both chain models (NOTE: [Two partitions]): tens of tables, seconds of a
warm `remat plan` (docs/measured-notes.md).  So with a cache (NOTE: [Solution cache] in
remat_dsl/plan/cache.py), each table's result is kept under `chains`, keyed by the chain
itself (every block's and option's sizes and times, so the profile and the block
solutions), the slots, the target and a digest of the DP's source.  A recalled sequence is
replayed on the chain (`simulate_chain`) and used only when it gives the time and peak it
was stored with, within the target; so the plan made from it is the plan the table would
give.
"""

from __future__ import annotations

import copy
import functools
import itertools
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, replace
from typing import ClassVar

from remat_dsl.plan import ir
from remat_dsl.plan.liveness import Interval, live_intervals, memory_profile
from remat_dsl.solve.api import BudgetError, Problem, Solver, SolverInfo, SolverResult, Status, say_phase, setting
from remat_dsl.solve.solvers.chain.model import (
    Block,
    BlockOption,
    Chain,
    ChainSchedule,
    InvalidChainSequence,
    simulate_chain,
    uncounted,
)
from remat_dsl.solve.solvers.chain.partition import (
    ChainPartition,
    affordable,
    block_name,
    chain_steps,
    is_small_chain,
    partition,
)
from remat_dsl.solve.solvers.chain.rk_rotor import min_feasible_budget as rk_min_feasible_budget
from remat_dsl.solve.solvers.chain.rk_rotor import try_rk_rotor
from remat_dsl.solve.solvers.chain.rotor import ChainConfig
from remat_dsl.solve.solvers.ilp import milp, workers
from remat_dsl.solve.solvers.ilp.checkmate import op_hgraph
from remat_dsl.solve.solvers.ilp.hilp import HGraph, HILP


@dataclass(frozen=True)
class RockmateConfig:
    """RK-Rotor's discretization and the RK-Checkmate grid of each block (thesis section 2.6.0.0.1)."""

    slots: int = setting(
        ChainConfig.slots, "memory slots of RK-Rotor's table: the budget is rounded down to a multiple of budget/slots"
    )
    peak_steps: int = setting(3, "M_peak values per block (NOTE: [Grid] in remat_dsl.solve.solvers.ilp.rockmate)")
    save_steps: int = setting(6, "M_save values per M_peak")
    max_options: int = setting(10, "options per block beyond store-all, after the Pareto filter")
    max_blocks: int = setting(ChainConfig.max_blocks, "chain blocks at the chosen module depth, before refining")
    min_block_ops: int = setting(6, "refined blocks grow to at least this many forward ops (chain.partition)")


@dataclass(frozen=True)
class Replay:
    """Memory of a block run as forward ops then `backward` (bytes, us): `xbar` alive at
    the boundary, `fwd_peak` and `bwd_peak` above what is alive outside the block."""

    xbar: int
    fwd_peak: int
    bwd_peak: int
    bwd_us: int


def replay(hg: HGraph, backward: tuple[int, ...]) -> Replay:
    """Replay forward nodes 0..t_b-1 then `backward` (node indices) under the one
    lowering's rule (NOTE: [Liveness] in remat_dsl.plan.liveness): a value kept at the
    boundary is held through the first backward step, one kept at the end is pinned."""
    tb = hg.boundary
    sequence = list(range(tb)) + list(backward)
    during, after = _memory(hg, sequence)
    xbar = after[tb - 1] if tb else 0
    bwd_us = sum(hg.nodes[k].options[0].time_us for k in backward)
    return Replay(xbar, max(during[:tb], default=0), max(during[tb:], default=0), bwd_us)


def _block_steps(hg: HGraph, sequence: list[int]) -> list[tuple[tuple[int, ...], list[int]]]:
    """The steps of running node indices `sequence` of `hg`, for `live_intervals`: per
    node, the values it reads and the values it makes (value indices)."""
    made_by: dict[int, list[int]] = defaultdict(list)
    for d, value in enumerate(hg.values):
        made_by[value.producer].append(d)
    return [(hg.nodes[k].reads, made_by[k]) for k in sequence]


def block_intervals(hg: HGraph, sequence: list[int]) -> list[Interval[int]]:
    """The live intervals of `hg`'s values when node indices `sequence` run (forward
    nodes 0..t_b-1 first): values kept at the boundary held through step t_b, values kept
    at the end pinned (NOTE: [Liveness] in remat_dsl.plan.liveness)."""
    tb = hg.boundary
    pinned = {d for d, v in enumerate(hg.values) if v.keep_at_end}
    held = {d: tb for d, v in enumerate(hg.values) if v.keep_at_boundary}
    return live_intervals(_block_steps(hg, sequence), pinned=pinned, held=held)


def _memory(hg: HGraph, sequence: list[int]) -> tuple[list[int], list[int]]:
    sizes = {d: v.size for d, v in enumerate(hg.values)}
    temp = [hg.nodes[k].options[0].overhead for k in sequence]
    return memory_profile(block_intervals(hg, sequence), sizes, temp)


def block_signature(graph: ir.Graph, forward: tuple[str, ...], backward: tuple[str, ...]) -> tuple:
    """Equal for identical blocks (Zhao et al., "Rockmate", ICML 2023, appendix A.5): op
    targets, arguments with references renamed to positions inside the block (outside
    values by shape and dtype), output shapes and dtypes, in order."""
    ops = graph.op_by_name
    decls = {
        d.name: (d.shape, d.dtype)
        for group in (graph.inputs, graph.parameters, graph.buffers, graph.tangents)
        for d in group
    }
    decls.update({t.name: (t.shape, t.dtype) for t in graph.tensors})
    local: dict[str, int] = {}
    result: list[tuple | None] = []
    for name in forward + backward:
        op = ops[name]
        result.append((op.phase, op.target, _canon(op.args, local, decls), _canon(op.kwargs, local, decls)))
        for t in op.outputs:
            local[t] = len(local)
            result.append(decls.get(t))
    return tuple(result)


def _canon(arg, local, decls):
    if isinstance(arg, ir.Ref):
        return ("r", local[arg.name]) if arg.name in local else ("x", decls.get(arg.name))
    if isinstance(arg, ir.Call):
        return ("c", arg.target, _canon(arg.args, local, decls), _canon(arg.kwargs, local, decls))
    if isinstance(arg, (ir.ListArg, ir.TupleArg)):
        return (type(arg).__name__, _canon(arg.items, local, decls))
    if isinstance(arg, ir.Sym):
        return ("s", arg.name)
    if isinstance(arg, tuple):
        return tuple(_canon(a, local, decls) for a in arg)
    return repr(arg)


@dataclass(frozen=True)
class BlockOptions:
    """The options of one block: `backward[o]` is the op sequence of B^o (o = 0 is the
    block's own backward, store-all)."""

    backward: tuple[tuple[str, ...], ...]


@dataclass(frozen=True)
class RockmateChain:
    chain: Chain
    options: tuple[BlockOptions, ...]
    classes: int  # distinct blocks solved
    ilps: int  # ILP solves
    results: tuple[milp.MilpResult, ...]  # every ILP solve, in order
    keys: tuple[int, ...]  # per block: the index of the first block identical to it


def grid(hg: HGraph, store_all: Replay, peak_steps: int = RockmateConfig.peak_steps,
         save_steps: int = RockmateConfig.save_steps) -> list[tuple[int, int]]:  # fmt: skip
    """(M_peak, M_save) pairs of section 2.6.0.0.1, bytes, deterministic: `peak_steps`
    M_peak values, `save_steps` M_save values under each (RockmateConfig).

    NOTE: [Grid]
    Three M_peak values (the store-all peak, then a quarter and a half of the way down to
    the largest temporary of an op) and six M_save values under each, so 18 ILPs per block
    class; at most `max_options` = 10 schedules after the Pareto filter.  The third, lowest
    M_peak is what makes an option recompute a block's normalized input after the
    attention's backward, which a Llama decoder's floor needs (the first layer's attention
    backward, beside the parameter gradients of the whole model).  A finer grid (4 x 8
    points, 16 options) predicted slower plans: more options are not better plans for the
    chain's 500-slot DP (docs/measured-notes.md)."""
    top = max(store_all.fwd_peak, store_all.bwd_peak)
    low = max((n.options[0].overhead for n in hg.nodes), default=0)
    out = sum(v.size for v in hg.values if v.producer < hg.boundary and (v.keep_at_boundary or v.keep_at_end))
    pairs = []
    for i in range(peak_steps):
        peak = top - (top - low) * i // (peak_steps + 1)
        for j in range(save_steps):
            save = out + (min(peak, store_all.xbar) - out) * j // save_steps
            pairs.append((peak, save))
    return list(dict.fromkeys(pairs))  # a block whose saved tensors are its outputs has one M_save


def rockmate_chain(graph: ir.Graph, part: ChainPartition, time_limit: float | None = None, report=None, cache=None,
                   jobs: int = 1, config: RockmateConfig = RockmateConfig()) -> RockmateChain:  # fmt: skip
    """The chain of `part` with every block's RK-Checkmate options (NOTE: [Option costs]).
    report: optional callable(str), told of each block class as its ILPs start (with the
    classes done and the seconds since the first) and of the end; one with `start(total)`
    and `advance(n)` also gets the count (NOTE: [Progress] in remat_dsl/plan/progress.py).  cache: a
    remat_dsl.plan.cache.Cache whose block solutions are reused (NOTE: [Solution cache]).
    jobs: processes that may solve a block's grid ILPs at once (NOTE: [Parallel grid] in
    remat_dsl.solve.solvers.ilp.workers); the result does not depend on it.  config: the
    grid and the Pareto filter's size (`slots` is not read here)."""
    by_class: dict[tuple, int] = {}
    solved: dict[int, list[tuple[int, ...]]] = {}
    results: list[milp.MilpResult] = []
    blocks, options, keys = [], [], []
    signatures = [block_signature(graph, ops.forward, ops.backward) for ops in part.blocks]
    members = Counter(signatures)
    with_ilps = len({sig for sig, ops in zip(signatures, part.blocks) if ops.forward and ops.backward})
    reported, began = 0, time.monotonic()
    counts = report is not None and hasattr(report, "advance")  # a progress bar (NOTE: [Progress] in plan/progress.py)
    say_phase(report, "solving the blocks' ILPs")
    if counts:
        report.start(with_ilps)
    for l, ops in enumerate(part.blocks):
        hg = op_hgraph(graph, ops.forward, ops.backward)
        signature = signatures[l]
        cls = by_class.setdefault(signature, l)
        keys.append(cls)
        if cls not in solved:
            key, hit = _cached_block(hg, time_limit, cache, config)
            if report and 0 < hg.boundary < len(hg.nodes):
                same = f", solved once for {members[signature]} identical blocks" if members[signature] > 1 else ""
                same += " (from the cache)" if hit is not None else ""
                reported += 1
                report(
                    f"solving block class {reported} of {with_ilps} ({reported - 1} done,"
                    f" {time.monotonic() - began:.0f} s): {block_name(part, l + 1)}, {len(hg.nodes)} ops{same}"
                )
            solved[cls] = _solve_block(hg, time_limit, results, cache, key, hit, jobs, config)
            if counts and 0 < hg.boundary < len(hg.nodes):
                report.advance(1)
        names = ops.forward + ops.backward
        schedules = pareto_schedules(hg, [tuple(range(hg.boundary, len(hg.nodes)))] + solved[cls], config.max_options)
        blocks.append(_block_with_options(part.chain.blocks[l], part.chain.delta_bytes(l), hg, schedules))
        options.append(BlockOptions(tuple(tuple(names[k] for k in s) for s in schedules)))
    if report and reported:
        report(f"solved {reported} of {with_ilps} block classes in {time.monotonic() - began:.0f} s")
    chain = replace(part.chain, blocks=tuple(blocks))
    return RockmateChain(chain, tuple(options), len(solved), len(results), tuple(results), tuple(keys))


def _solve_block(hg: HGraph, time_limit: float | None, results: list[milp.MilpResult], cache=None, key=None, hit=None,
                 jobs: int = 1, config: RockmateConfig = RockmateConfig()) -> list[tuple[int, ...]]:  # fmt: skip
    """Distinct backward schedules (node indices) found over the budget grid (`config`), in grid
    order; `key` and `hit` from `_cached_block`: the cached solution is returned, or the
    new one stored under `key` (NOTE: [Solution cache]).  With jobs > 1 the points after
    the first may be solved in worker processes (NOTE: [Parallel grid])."""
    if hg.boundary == len(hg.nodes) or hg.boundary == 0:
        return []
    if hit is not None:
        results.extend(milp.MilpResult(*r) for r in hit["results"])
        return [tuple(s) for s in hit["schedules"]]
    first = len(results)
    store_all = replay(hg, tuple(range(hg.boundary, len(hg.nodes))))
    model = HILP(hg)
    points = grid(hg, store_all, config.peak_steps, config.save_steps)
    solved: list = []
    while len(solved) < len(points):
        if jobs > 1 and len(points) - len(solved) >= 2 and workers.slow(r.seconds for _, r in solved):
            token = next(_tokens)
            rest = workers.run_all(
                _grid_point, [(token, hg, peak, save, time_limit) for peak, save in points[len(solved) :]], jobs
            )
            if rest is not None:
                solved += rest
                break
            jobs = 1  # the pool broke: the rest here
        peak, save = points[len(solved)]
        solved.append(_solve_point(model, peak, save, time_limit))
    found: list[tuple[int, ...]] = []
    for backward, result in solved:
        results.append(result)
        if backward is not None and backward not in found and backward != tuple(range(hg.boundary, len(hg.nodes))):
            found.append(backward)
    if key is not None:
        entries = [[r.status, r.gap, r.seconds, r.backend] for r in results[first:]]
        cache.put("blocks", key, {"schedules": [list(s) for s in found], "results": entries})
    return found


def _solve_point(
    model: HILP, peak: int, save: int, time_limit: float | None
) -> tuple[tuple[int, ...] | None, milp.MilpResult]:
    """(the backward schedule's node indices or None when no solution, the MILP's result)
    of one grid point (section 2.6.0.0.1)."""
    schedule = model.solve(peak, save, time_limit)
    backward = None if schedule is None else tuple(k for k, _ in schedule.steps[schedule.boundary_step :])
    return backward, model.last_result


_tokens = itertools.count()  # names a block's H-graph for the workers (NOTE: [Parallel grid])
_worker_model: tuple[int, HILP] | None = None  # in a worker: the H-ILP of the block it solved last


def _grid_point(token: int, hg: HGraph, peak: int, save: int, time_limit: float | None):
    """`_solve_point` in a worker process, whose H-ILP of `hg` is built at the block's
    first point there and kept for the next ones (`token` names the block)."""
    global _worker_model
    if _worker_model is None or _worker_model[0] != token:
        _worker_model = (token, HILP(hg))
    return _solve_point(_worker_model[1], peak, save, time_limit)


def _block_key(hg: HGraph, config: RockmateConfig = RockmateConfig()) -> str:
    """What a block's schedules depend on: its H-graph, the grid (`config`'s steps), the
    MILP settings and the ILP's source."""
    from remat_dsl.plan.cache import Cache

    ilp = _source_digest("ilp/hilp.py", "ilp/checkmate.py", "ilp/milp.py")  # the model the grid is solved with
    steps = config.peak_steps, config.save_steps  # as the two constants were: the default's key is unchanged
    return Cache.key("rockmate-block", *steps, milp.REL_GAP, milp.MAX_NODES, milp.backend_versions(), ilp, hg)


def _cached_block(hg: HGraph, time_limit: float | None, cache,
                  config: RockmateConfig = RockmateConfig()) -> tuple[str | None, dict | None]:  # fmt: skip
    """(the key `hg`'s solution is stored under, the cached solution or None); no key when
    nothing is cached: no cache, no ILP to solve, or a time limit, whose result depends on
    the machine's load."""
    if cache is None or not cache.enabled or time_limit is not None or hg.boundary in (0, len(hg.nodes)):
        return None, None
    key = _block_key(hg, config)
    hit = cache.get("blocks", key)
    return key, hit if isinstance(hit, dict) and {"schedules", "results"} <= set(hit) else None


def pareto_schedules(hg: HGraph, schedules: list[tuple[int, ...]],
                     max_options: int = RockmateConfig.max_options) -> list[tuple[int, ...]]:  # fmt: skip
    """Store-all first, then the schedules no other one beats on every cost of `replay`
    (abar, forward peak, backward time, backward peak), at most `max_options` of them (NOTE: [Grid]),
    spread evenly over abar (the memory RK-Rotor trades against time)."""
    costs = {s: replay(hg, s) for s in schedules}
    key = {s: (c.xbar, c.fwd_peak, c.bwd_us, c.bwd_peak) for s, c in costs.items()}
    store_all, rest = schedules[0], schedules[1:]
    kept = [
        s
        for s in rest
        if key[s] != key[store_all]
        and not any(o != s and all(a <= b for a, b in zip(key[o], key[s])) and key[o] != key[s] for o in schedules)
    ]
    kept = sorted(dict.fromkeys(kept), key=lambda s: (key[s], s))
    if len(kept) > max_options:
        step = (len(kept) - 1) / (max_options - 1)
        kept = [kept[round(i * step)] for i in range(max_options)]
    return [store_all, *kept]


def _block_with_options(block: Block, delta_prev: int, hg: HGraph, schedules: list[tuple[int, ...]]) -> Block:
    """`block` with store-all and every schedule costed by `replay`; delta_prev: bytes of
    delta^{l-1}, which the replay counts and rotor's B step adds on its own."""
    variants = []
    for o, backward in enumerate(schedules):
        r = replay(hg, backward)
        xbar = max(r.xbar, block.x_bytes)
        variants.append(
            BlockOption(
                xbar_bytes=xbar,
                fwd_overhead=max(0, r.fwd_peak - xbar),
                bwd_us=r.bwd_us,
                bwd_overhead=max(0, r.bwd_peak - xbar - delta_prev),
                index=o,
            )
        )
    first = variants[0]
    return replace(
        block,
        xbar_bytes=first.xbar_bytes,
        bwd_us=first.bwd_us,
        bwd_overhead=first.bwd_overhead,
        options=tuple(variants[1:]),
    )


class OverBlocks(Solver):
    """RK-Rotor over the blocks of `part`, each with its RK-Checkmate options (Algorithm 3).

    The block ILPs are solved here, once (identical blocks once, NOTE: [Option costs]);
    `solve(target)` runs RK-Rotor with the chain budget `target` (bytes).  `label` goes
    in front of the settings in the plan header (HiRemate's chain root says what it is)."""

    auto_rank: ClassVar[int | None] = None
    optimizes = True
    cheap_targets = True  # another target runs the chain DP only (NOTE: [Budget correction] in remat_dsl.solve.driver)
    Config = RockmateConfig

    def __init__(
        self, problem: Problem, part: ChainPartition, name: str, label: str = "", config: RockmateConfig | None = None
    ):
        self.config = config or RockmateConfig()
        start = time.perf_counter()
        self.name, self.label, self.part = name, label, part
        self.cache = problem.cache if problem.cache is not None and problem.cache.enabled else None
        self.rc = rockmate_chain(
            problem.graph,
            part,
            per_ilp_limit(problem.time_limit, len(part.blocks), self.config.peak_steps * self.config.save_steps),
            problem.report,
            problem.cache,
            problem.jobs,
            self.config,
        )
        status, gap = milp.status_of(self.rc.results)
        self.info = SolverInfo(Status(status), gap, time.perf_counter() - start)
        self.counted = True  # kept gradients counted (NOTE: [Two chain models] in chain/model.py)

    def describe(self) -> str:
        options = sum(len(b.options) for b in self.rc.chain.blocks)
        settings = (
            f"slots={self.config.slots} blocks={len(self.part.blocks)} classes={self.rc.classes} ilps={self.rc.ilps}"
            f" options={options}"
        )
        suffix = "" if self.counted else " gradients=uncounted"
        return f"{self.label} {settings}{suffix}".strip()

    def paper_model(self) -> OverBlocks:
        """These blocks and options in the paper's chain model, without solving anything
        again (NOTE: [Two chain models] in remat_dsl.solve.solvers.chain.model)."""
        other = copy.copy(self)
        other.__dict__.pop("_floor", None)
        other.__dict__.pop("_chain_key", None)
        other.rc, other.counted = replace(self.rc, chain=uncounted(self.rc.chain)), False
        return other

    def fallbacks(self):
        if self.counted:
            yield self.paper_model()

    @functools.cached_property
    def _chain_key(self) -> str:
        """NOTE: [Chain memo]: the key of everything RK-Rotor's results depend on."""
        from remat_dsl.plan.cache import Cache

        return Cache.key("rk-rotor", self.config.slots, _dp_digest(), self.rc.chain)

    @functools.cached_property
    def _floor(self) -> int:
        return rk_min_feasible_budget(self.rc.chain, self.config.slots)

    def floor(self) -> int:
        return self._floor

    def _schedule(self, target: int) -> ChainSchedule | None:
        """`try_rk_rotor` at `target` bytes, through NOTE: [Chain memo]."""
        if self.cache is None:
            return try_rk_rotor(self.rc.chain, target, self.config.slots)
        key = f"{self._chain_key}-{target}"
        hit = _recalled_schedule(self.cache.get("chains", key), self.rc.chain, target)
        if hit is not None:
            return hit.schedule
        schedule = try_rk_rotor(self.rc.chain, target, self.config.slots)
        entry = (
            None
            if schedule is None
            else {
                "ops": [list(op) for op in schedule.ops],
                "us": schedule.predicted_us,
                "peak": schedule.predicted_peak,
            }
        )
        self.cache.put("chains", key, {"schedule": entry})
        return schedule

    def solve(self, target: int) -> SolverResult:
        schedule = self._schedule(target)
        if schedule is None:
            raise BudgetError(target, self.floor(), self.name)
        options = [b.backward for b in self.rc.options]
        order, decisions = chain_steps(self.part, schedule.ops, options, self.rc.chain)
        return SolverResult(order, self.info, decisions)


@functools.cache
def _source_digest(*files: str) -> str:
    """SHA-256 of these source files (paths under remat_dsl/solve/solvers): a cache entry
    keyed by it is a miss once the code that made it changes, never a stale hit."""
    import hashlib
    from pathlib import Path

    here = Path(__file__).resolve().parent.parent
    digest = hashlib.sha256()
    for name in files:
        digest.update(name.encode() + b"\0" + (here / name).read_bytes())
    return digest.hexdigest()


def _dp_digest() -> str:
    """The digest of RK-Rotor's table and the chain model it runs on (NOTE: [Chain memo])."""
    return _source_digest("chain/model.py", "chain/rotor.py", "chain/rk_rotor.py")


@dataclass(frozen=True)
class _Recalled:
    schedule: ChainSchedule | None  # None: RK-Rotor found nothing within the target


def _recalled_schedule(entry, chain: Chain, target: int) -> _Recalled | None:
    """The RK-Rotor result a NOTE: [Chain memo] entry holds, or None (a miss) when it is not
    one, or when its sequence does not replay on `chain` (`simulate_chain`) to the time
    and peak it records, or peaks above `target`."""
    if not isinstance(entry, dict) or "schedule" not in entry:
        return None
    stored = entry["schedule"]
    if stored is None:
        return _Recalled(None)
    try:
        ops = tuple((str(op[0]), *(int(x) for x in op[1:])) for op in stored["ops"])
        us, peak = int(stored["us"]), int(stored["peak"])
        replayed = simulate_chain(chain, ops)
    except (KeyError, TypeError, ValueError, IndexError, InvalidChainSequence):
        return None
    if replayed != (peak, us) or peak > target:
        return None
    return _Recalled(ChainSchedule(ops, us, peak))


def per_ilp_limit(time_limit: float | None, blocks: int,
                  points: int = RockmateConfig.peak_steps * RockmateConfig.save_steps) -> float | None:  # fmt: skip
    """A user's time limit (seconds) shared by the grid's ILPs (`points` per block) of every block."""
    if time_limit is None:
        return None
    return max(0.05, time_limit / max(1, blocks) / points)


class Rockmate(OverBlocks):
    """`--solver rockmate` (thesis chapter 2, Algorithm 3) on Rockmate's blocks
    (`partition(refine=1)`, cut where no skip tensor crosses when the graph is a chain of
    small blocks, else at every separator as rotor does).

    NOTE: [Two partitions] Rockmate's blocks suit chains of repeated layers (a GPT-2
    layer's attention and MLP).  On a graph with few such blocks (the ResNet cuts into 5)
    RK-Rotor has few places to checkpoint, and rotor's finer blocks reach lower budgets;
    RK-Rotor over rotor's blocks with their RK-Checkmate options can do everything rotor
    does there.  A budget the first cannot meet goes to the second (`fallbacks`), built
    only then, and the smallest feasible budget is the least of the two.
    Rotor's blocks are not always finer: they are cut at the deepest module depth with
    at most `max_blocks` (40) blocks, so a model with more layers than that in few stages
    (torchvision's EfficientNet-V2-S, 43 blocks of at most 19 forward ops for Rockmate)
    gets its stages (11 blocks of up to 283 forward ops), and the RK-Checkmate ILP of
    one such block runs for many minutes (`remat plan --budget 1%` builds every fallback
    to find the smallest budget).  So the fallback is built only where its
    blocks are `affordable`: none larger than both Rockmate's largest and
    LARGE_BLOCK_FORWARD_OPS.  Not only where they are more blocks: fewer, larger rotor
    blocks can still reach a lower budget (the Transformer example's 6 rotor blocks
    against Rockmate's 11; docs/measured-notes.md)."""

    name = "rockmate"
    auto_rank = 2

    def __init__(self, problem: Problem, label: str = "", name: str = "rockmate", config: RockmateConfig | None = None):
        self.problem = problem
        config = config or RockmateConfig()
        strict = is_small_chain(problem.graph)
        say_phase(problem.report, "partitioning the graph into blocks")
        part = partition(problem.graph, config.max_blocks, 1, strict, config.min_block_ops)
        super().__init__(problem, part, name, label, config)

    @classmethod
    def fits(cls, problem: Problem) -> bool:
        return is_small_chain(problem.graph)

    def fallbacks(self):
        """NOTE: [Two partitions], each in both chain models (NOTE: [Two chain models])."""
        rotors = partition(self.problem.graph, self.config.max_blocks)
        finer = (
            OverBlocks(self.problem, rotors, self.name, self.label, self.config)
            if affordable(rotors, self.part)
            else None
        )
        if finer is not None:  # else its ILPs would take minutes: NOTE: [Two partitions]
            yield finer
        yield self.paper_model()
        if finer is not None:
            yield finer.paper_model()
