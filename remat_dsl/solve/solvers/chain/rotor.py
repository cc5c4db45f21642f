"""Rotor's optimal persistent sequence for a chain under a memory budget.

Beaumont et al., "Optimal checkpointing for heterogeneous chains", section 4.4: Theorem
4.8, equations (6)-(7), Algorithm 3 (the table C_MP(s, t, m)) and Algorithm 4 (OptRecP,
the sequence from the table), with memory discretized into S slots (section 5.2).
The step semantics are those of `remat_dsl.solve.solvers.chain.model` (NOTE: [Step semantics]).

NOTE: [Memory conditions]
C_MP(s, t, m) is the best time to turn delta^t into delta^{s-1} starting from a^{s-1},
with peak at most m *above* the memory held outside (a^{s-1} is outside; delta^t inside).
  eq. (6)   C(s, s, m)  = u_f^s + u_b^s                         if m >= m_all(s, s)
  C_all     C(s, t, m)  = u_f^s + C(s+1, t, m - abar^s) + u_b^s if m >= m_all(s, t)
  C_ck      C(s, t, m)  = sum_{k=s}^{s'-1} u_f^k + C(s', t, m - a^{s'-1}) + C(s, s'-1, m - G(s', t))
                          if m >= delta^t + max(a^s + o_f^s, max_{s<j<s'} a^{j-1}+a^j+o_f^j)
  m_all(s, t) = max(delta^t + abar^s + o_f^s, abar^s + delta^s + delta^{s-1} + o_b^s + G(s+1, t))
m_all is the paper's but for G(i, j) = omega_g^i + ... + omega_g^j, the gradients B^i..B^j
keep to the step's end (NOTE: [Kept gradients] in remat_dsl.solve.solvers.chain.model): they are
live while B^s runs, and while C_ck's second subproblem runs, so that one is solved as
C(s, s'-1, m - G(s', t)).  With G = 0 these are the paper's equations.  For C_ck we check
the F_ck^s, F_n^{s+1..s'-1} steps of the branch itself, i.e. the paper's m_empty(s, t)
cut at j < s' for each s'; the terms for j >= s' are implied by the subproblem
C(s', t, m - a^{s'-1}), which computes those forwards with delta^t live, so the two
tables are equal.  With these conditions a sequence from the
table has, under `simulate_chain`, exactly the peak the table accounts for.

NOTE: [Discretization]
Section 5.2: the budget B is cut into S slots of B/S bytes and every size is rounded UP to
whole slots (ceil(x * S / B)).  A sum of rounded sizes bounds the true sum, so a sequence
that fits S slots fits B bytes; the price is that a budget within about (number of live
values) slots of the true minimum can be refused.  Two consequences we handle exactly:
- when the store-all sequence (no rematerialization) fits the budget in bytes we return it
  without the table: its time, sum u_f + sum u_b, is the least any sequence can have;
- `min_feasible_budget` is the smallest budget at which `solve_rotor` succeeds with the
  same S (slots): a search over budgets, feasibility being monotone in the budget because
  rounded sizes only shrink as B grows.  `min_persistent_peak` is the undiscretized floor.

NOTE: [Ties]
Deterministic: among F_ck branches the smallest s' wins; F_all wins a tie with F_ck.
"""

from __future__ import annotations

import copy
import functools
import time
from dataclasses import dataclass, fields, replace

import numpy as np

from remat_dsl.solve.api import BudgetError, Problem, Solver, SolverInfo, SolverResult, Status, setting
from remat_dsl.solve.solvers.chain.partition import chain_steps, partition

from remat_dsl.solve.solvers.chain.model import (
    Chain,
    ChainOp,
    ChainSchedule,
    InfeasibleBudget,
    simulate_chain,
    store_all_schedule,
    uncounted,
)



@dataclass(frozen=True)
class ChainConfig:
    """Rotor's chain: the dynamic program's discretization and how many blocks the graph is cut into."""

    slots: int = setting(
        500, "memory slots of the DP's table: the budget is rounded down to a multiple of budget/slots"
    )
    max_blocks: int = setting(40, "chain blocks at the chosen module depth, before refining (chain.partition)")


_SEARCH_FANOUT = 64  # budgets tried at once by min_feasible_budget


@dataclass(frozen=True)
class _Sizes:
    """Sizes indexed 0..L (index 0 of per-block arrays unused), shape (L+1,) or (L+1, nB).

    a: omega_a, abar: omega_abar, d: omega_delta, of/ob: overheads; kg[i, j] = G(i, j) =
    omega_g^i + ... + omega_g^j (0 when i > j; NOTE: [Kept gradients]), shape (L+2, L+1, ...).
    Units: bytes or slots.
    """

    a: np.ndarray
    abar: np.ndarray
    d: np.ndarray
    of: np.ndarray
    ob: np.ndarray
    kg: np.ndarray

    def kept(self, first, last):
        """G(first, last): the kept gradients of blocks first..last (0 when first > last);
        `first` may be an array of block indices."""
        return self.kg[first, last]

    def column(self, j: int) -> "_Sizes":
        """The sizes of budget column j."""
        return _Sizes(*(getattr(self, f.name)[..., j] for f in fields(self)))

    @property
    def length(self) -> int:
        return self.a.shape[0] - 1


def _exact_sizes(chain: Chain) -> _Sizes:
    def column(values) -> np.ndarray:
        return np.array(values, dtype=np.int64)

    blocks = chain.blocks
    return _Sizes(
        a=column([chain.input_bytes] + [b.x_bytes for b in blocks]),
        abar=column([0] + [b.xbar_bytes for b in blocks]),
        d=column([chain.input_grad_bytes] + [b.grad_bytes for b in blocks]),
        of=column([0] + [b.fwd_overhead for b in blocks]),
        ob=column([0] + [b.bwd_overhead for b in blocks]),
        kg=_kept_sums(column([0] + [b.kept_bytes for b in blocks])),
    )


def _kept_sums(g: np.ndarray) -> np.ndarray:
    """kg[i, j] = g[i] + ... + g[j] for 1 <= i <= j <= L, else 0; shape (L+2, L+1)."""
    cg = np.cumsum(g)
    i, j = np.arange(len(g) + 1)[:, None], np.arange(len(g))[None, :]
    return np.where((i >= 1) & (i <= j), cg[j] - cg[np.clip(i - 1, 0, len(g) - 1)], 0)


def _rounded_sizes(exact: _Sizes, budgets: np.ndarray, slots: int) -> _Sizes:
    """Sizes in slots, ceil(x * slots / B), for each budget B (NOTE: [Discretization]).

    Shape (L+1, nB), kg (L+2, L+1, nB).  A budget of 0 has no slot size: 0 stays 0,
    anything else becomes slots + 1 (it can never fit).  Each G(i, j) is rounded on its
    own, so every memory condition, a sum of rounded sizes, bounds the exact one.
    """

    return _Sizes(*(in_slots(getattr(exact, f.name), budgets, slots) for f in fields(exact)))


def in_slots(x: np.ndarray, budgets: np.ndarray, slots: int) -> np.ndarray:
    """Bytes `x` in slots of each budget, ceil(x * slots / B), shape x.shape + (nB,); a
    budget of 0 leaves 0 at 0 and makes anything else slots + 1 (NOTE: [Discretization])."""
    x = x[..., None]
    out = -((-x * slots) // np.maximum(budgets, 1))
    return np.where(budgets > 0, out, np.where(x > 0, slots + 1, 0))


def _need_all(sz: _Sizes, s: int, t: int):
    """m_all(s, t) of section 4.4: F_all^s with delta^t live, then B^s with the kept
    gradients of blocks s+1..t (NOTE: [Memory conditions])."""
    return np.maximum(
        sz.d[t] + sz.abar[s] + sz.of[s],
        sz.abar[s] + sz.d[s] + sz.d[s - 1] + sz.ob[s] + sz.kept(s + 1, t),
    )


def _need_forward(sz: _Sizes, s: int, t: int):
    """Memory of F_ck^s, F_n^{s+1..s'-1} with delta^t live, for s' = s+1..t: shape (t-s, ...)."""
    steps = np.concatenate([(sz.a[s] + sz.of[s])[None], sz.a[s : t - 1] + sz.a[s + 1 : t] + sz.of[s + 1 : t]])
    return sz.d[t] + np.maximum.accumulate(steps, axis=0)


def _min_peak(sz: _Sizes, options: list[np.ndarray] | None = None) -> np.ndarray:
    """Least peak of a persistent sequence, in the units of `sz`, per budget column.

    The table of NOTE: [Memory conditions] with min/max in place of time: P(s, t) is the
    least m for which C_MP(s, t, m) is finite.  Returns a^0 + P(1, L), shape sz.a.shape[1:].
    options: RK-Rotor's (remat_dsl.solve.solvers.chain.rk_rotor), per block l (index 0 unused) its
    options' (abar, o_f, o_b) in the units of `sz`, shape (3, options, ...): F_all^s takes
    the best of them (thesis eq. 2.20); None: rotor's one, the block's own sizes.
    """
    L = sz.length
    P = np.zeros((L + 2, L + 2) + sz.a.shape[1:], dtype=np.int64)  # P[t, s]
    for dist in range(0, L):  # by increasing length as in Algorithm 3
        for s in range(1, L + 1 - dist):
            t = s + dist
            abar, of, ob = options[s] if options is not None else (sz.abar[s][None], sz.of[s][None], sz.ob[s][None])
            need = np.maximum(sz.d[t] + abar + of, abar + sz.d[s] + sz.d[s - 1] + ob + sz.kept(s + 1, t))  # m_all
            if s < t:
                need = np.maximum(need, abar + P[t, s + 1])
            P[t, s] = need.min(axis=0)
            if s < t:  # F_ck
                nexts = np.arange(s + 1, t + 1)
                left = P[nexts - 1, s] + sz.kept(nexts, t)
                ck = np.maximum(_need_forward(sz, s, t), np.maximum(sz.a[nexts - 1] + P[t, nexts], left))
                P[t, s] = np.minimum(P[t, s], ck.min(axis=0))
    return sz.a[0] + P[L, 1]


def min_persistent_peak(chain: Chain) -> int:
    """Least peak (bytes) of any persistent sequence (Definition 4.1), undiscretized.

    `solve_rotor` at this budget may still refuse when the rounding to slots costs a few
    slots; `min_feasible_budget` is the budget it accepts.
    """
    return int(_min_peak(_exact_sizes(chain)))


def min_feasible_budget(chain: Chain, slots: int = ChainConfig.slots) -> int:
    """Smallest budget (bytes) for which `solve_rotor(chain, budget, slots)` succeeds.

    Exact, not estimated: a search over integer budgets between `min_persistent_peak` and
    the store-all peak, testing many budgets per round with the vectorized memory table
    (NOTE: [Discretization]).  Raises ValueError when slots < 1.
    """
    _check_slots(slots)
    exact = _exact_sizes(chain)
    return first_fitting(int(_min_peak(exact)) - 1, store_all_schedule(chain).predicted_peak,
                         lambda budgets: _min_peak(_rounded_sizes(exact, budgets, slots)) <= slots)  # fmt: skip


def first_fitting(lo: int, hi: int, fits) -> int:
    """The least integer budget in (lo, hi] that `fits`, given that `lo` does not (or is -1)
    and `hi` does, feasibility being monotone (NOTE: [Discretization]): rounds of up to
    _SEARCH_FANOUT budgets at once.  fits(budgets) -> bool array, budgets an int64 array."""
    while hi - lo > 1:
        candidates = np.unique(np.linspace(lo + 1, hi - 1, num=min(_SEARCH_FANOUT, hi - lo - 1)).astype(np.int64))
        fits_now = fits(candidates)
        if fits_now.any():
            first = int(np.argmax(fits_now))
            hi = int(candidates[first])
            lo = int(candidates[first - 1]) if first > 0 else lo
        else:
            lo = int(candidates[-1])
    return hi


def solve_rotor(chain: Chain, budget: int, slots: int = ChainConfig.slots) -> ChainSchedule:
    """The fastest persistent sequence whose peak is at most `budget` bytes.

    Algorithm 3 (table C_MP(s, t, m), Theorem 4.8, eqs. (6)-(7)) over memory discretized
    into `slots` slots of budget/slots bytes, sizes rounded up (section 5.2), then
    Algorithm 4 (OptRecP) for the sequence.  `predicted_us` is the table's makespan;
    `predicted_peak` is `simulate_chain`'s peak, at most `budget`.  Runs in
    O(L^3 * slots) time and O(L^2 * slots) memory (float64 and int32 tables).
    Raises InfeasibleBudget (with the smallest budget that works at these slots) when no
    sequence fits, ValueError when budget < 0 or slots < 1.
    """
    _check_slots(slots)
    if budget < 0:
        raise ValueError(f"budget must be >= 0 bytes, got {budget}")
    store_all = store_all_schedule(chain)
    if store_all.predicted_peak <= budget:
        return store_all  # NOTE: [Discretization]
    sz = _rounded_sizes(_exact_sizes(chain), np.array([budget], dtype=np.int64), slots).column(0)
    top = slots - int(sz.a[0])
    if top < 0:
        raise InfeasibleBudget(budget, min_feasible_budget(chain, slots))
    cost, choice = _persistent_table(chain, sz, slots)
    L = chain.length
    if not np.isfinite(cost[L, 1, top]):
        raise InfeasibleBudget(budget, min_feasible_budget(chain, slots))
    ops = _opt_rec_p(choice, sz, top)
    peak, total = simulate_chain(chain, ops)
    predicted = int(cost[L, 1, top])
    assert total == predicted and peak <= budget, (total, predicted, peak, budget)
    return ChainSchedule(ops, predicted, peak)


def _check_slots(slots: int) -> None:
    if not isinstance(slots, int) or slots < 1:
        raise ValueError(f"slots must be a positive int, got {slots!r}")


def _persistent_table(chain: Chain, sz: _Sizes, slots: int) -> tuple[np.ndarray, np.ndarray]:
    """Algorithm 3: cost[t, s, m] = C_MP(s, t, m) (microseconds, inf when infeasible).

    choice[t, s, m] is 0 for F_all^s, s' >= s+1 for F_ck^s with next checkpoint a^{s'-1},
    -1 when infeasible.  m runs over 0..slots; every memory axis is one numpy vector, and
    the F_ck branches of one (s, t) are one (t-s, slots+1) array.  Eqs. in NOTE: [Memory
    conditions].
    """
    L = chain.length
    uf = np.array([0] + [b.fwd_us for b in chain.blocks], dtype=np.float64)
    ub = np.array([0] + [b.bwd_us for b in chain.blocks], dtype=np.float64)
    cum_f = np.cumsum(uf)  # cum_f[k] = u_f^1 + ... + u_f^k
    cost = np.full((L + 2, L + 2, slots + 1), np.inf)
    choice = np.full((L + 2, L + 2, slots + 1), -1, dtype=np.int32)
    for s in range(1, L + 1):  # eq. (6)
        need = int(_need_all(sz, s, s))
        if need <= slots:
            cost[s, s, need:] = uf[s] + ub[s]
            choice[s, s, need:] = 0
    for dist in range(1, L):  # eq. (7), by increasing length as in Algorithm 3
        for s in range(1, L + 1 - dist):
            t = s + dist
            best = np.full(slots + 1, np.inf)
            lo = max(int(_need_all(sz, s, t)), int(sz.abar[s]))
            if lo <= slots:  # C_all
                shift = int(sz.abar[s])
                best[lo:] = uf[s] + ub[s] + cost[t, s + 1, lo - shift : slots + 1 - shift]
            ck_best, ck_next = checkpoint_branch(cost, cum_f, sz, s, t)
            use_ck = ck_best < best  # NOTE: [Ties]
            cost[t, s] = np.where(use_ck, ck_best, best)
            choice[t, s] = np.where(use_ck, ck_next, np.where(np.isfinite(best), 0, -1))
    return cost, choice


def checkpoint_branch(cost: np.ndarray, cum_f: np.ndarray, sz: _Sizes, s: int, t: int) -> tuple[np.ndarray, np.ndarray]:
    """C_ck of eq. (7) for every memory m: (best time, its next checkpoint s'), shape (slots+1,).

    F_ck^s F_n^{s+1..s'-1}, then C(s', t, m - a^{s'-1}), then C(s, s'-1, m - G(s', t)), over
    s' = s+1..t, one row per s' (NOTE: [Memory conditions]).  Shared with RK-Rotor's eq. 2.21.
    """
    slots = cost.shape[2] - 1
    m = np.arange(slots + 1)
    nexts = np.arange(s + 1, t + 1)
    cols = m[None, :] - sz.a[nexts - 1][:, None]
    first = np.take_along_axis(cost[t, s + 1 : t + 1], np.clip(cols, 0, slots), axis=1)
    rest = m[None, :] - sz.kept(nexts, t)[:, None]
    second = np.take_along_axis(cost[s:t, s], np.clip(rest, 0, slots), axis=1)
    forward = (cum_f[nexts - 1] - cum_f[s - 1])[:, None]
    ck = forward + np.where(cols >= 0, first, np.inf) + np.where(rest >= 0, second, np.inf)
    ck[m[None, :] < _need_forward(sz, s, t)[:, None]] = np.inf
    row = np.argmin(ck, axis=0)
    return ck[row, m], nexts[row]


def _store_all_step(sz: _Sizes):
    return lambda s, t, mem: (("F_all", s), ("B", s), int(sz.abar[s]))


def _opt_rec_p(choice: np.ndarray, sz: _Sizes, top: int, all_step=None) -> tuple[ChainOp, ...]:
    """Algorithm 4 (OptRecP) from (1, L, top), with an explicit stack instead of recursion.

    all_step(s, t, mem) -> (forward step, backward step, bytes kept) for a choice of 0
    (F_all^s); rotor's store-all by default, RK-Rotor's chosen option (Algorithm 6)."""
    all_step = all_step or _store_all_step(sz)
    ops: list[ChainOp] = []
    stack: list[tuple[int, int, int] | ChainOp] = [(1, sz.length, top)]
    while stack:
        item = stack.pop()
        if isinstance(item[0], str):
            ops.append(item)
            continue
        s, t, mem = item
        branch = int(choice[t, s, mem])
        assert branch >= 0, f"OptRecP reached an infeasible entry C({s}, {t}, {mem})"
        if branch == 0:  # F_all^s, the chain s+1..t, B^s
            forward, backward, kept = all_step(s, t, mem)
            ops.append(forward)
            stack.append(backward)
            if s < t:
                stack.append((s + 1, t, mem - kept))
            continue
        ops.append(("F_ck", s))  # F_ck^s F_n^{s+1..s'-1}, the chain s'..t, then s..s'-1
        ops.extend(("F_n", j) for j in range(s + 1, branch))
        stack.append((s, branch - 1, mem - int(sz.kept(branch, t))))
        stack.append((branch, t, mem - int(sz.a[branch - 1])))
    return tuple(ops)


class Rotor(Solver):
    """`--solver rotor`: Algorithms 3-4 over the chain of blocks cut at the graph's
    1-separators (remat_dsl.solve.solvers.chain.partition; Zhao et al., "Rockmate", ICML 2023,
    appendix A.4), with
    `config.slots` memory slots.  Its chain budget is the driver's target."""

    Config = ChainConfig

    name = "rotor"
    auto_rank = None
    optimizes = True
    cheap_targets = True  # another target runs the DP only (NOTE: [Budget correction] in remat_dsl.solve.driver)

    def __init__(self, problem: Problem, config: ChainConfig | None = None):
        self.config = config or ChainConfig()
        start = time.perf_counter()
        self.part = partition(problem.graph, self.config.max_blocks)
        self.seconds = time.perf_counter() - start
        self.counted = True  # kept gradients counted (NOTE: [Two chain models])

    def describe(self) -> str:
        suffix = "" if self.counted else " gradients=uncounted"
        return f"slots={self.config.slots} blocks={len(self.part.blocks)}{suffix}"

    def paper_model(self) -> "Rotor":
        """The same blocks in the paper's chain model (NOTE: [Two chain models])."""
        other = copy.copy(self)
        other.__dict__.pop("_floor", None)
        other.part, other.counted = replace(self.part, chain=uncounted(self.part.chain)), False
        return other

    def fallbacks(self):
        if self.counted:
            yield self.paper_model()

    @functools.cached_property
    def _floor(self) -> int:
        return min_feasible_budget(self.part.chain, self.config.slots)

    def floor(self) -> int:
        return self._floor

    def solve(self, target: int) -> SolverResult:
        try:
            schedule = solve_rotor(self.part.chain, target, self.config.slots)
        except InfeasibleBudget:
            raise BudgetError(target, self.floor(), self.name) from None
        order, decisions = chain_steps(self.part, schedule.ops)
        return SolverResult(order, self.info, decisions)

    @property
    def info(self) -> SolverInfo:  # type: ignore[override]  # read-only: the driver only reads it
        return SolverInfo(Status.OPTIMAL, None, self.seconds)
