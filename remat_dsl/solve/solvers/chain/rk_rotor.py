"""RK-Rotor: rotor's dynamic program with several options per block.

Zhao, PhD thesis "Optimizing Memory Usage when Training Deep Neural Networks" (2024),
section 2.5: eq. 2.20 (Opt_1, block s computed once with option o > 0 keeping abar_s^o),
eq. 2.21 (Opt_2, block s computed without keeping anything, then the next checkpoint),
eq. 2.22 (Opt = min of both), Algorithm 5 (the table) and
Algorithm 6 (the sequence).  Option 0 of the thesis (keep nothing) is rotor's F_ck/F_n;
the options with a backward are the block's store-all (`Block`'s own fields, our option
0) and its `BlockOption`s.  The memory conditions are rotor's (remat_dsl.solve.solvers.chain.rotor,
NOTE: [Memory conditions]) with m_all taken per option:
  m_all^o(s, t) = max(delta^t + abar_s^o + o_f^{s,o}, abar_s^o + delta^s + delta^{s-1} + o_b^{s,o} + G(s+1, t))
so that with one option per block this is exactly rotor's table.  Memory is discretized
into slots as in rotor (NOTE: [Discretization]).
"""

from __future__ import annotations

import numpy as np

from remat_dsl.solve.solvers.chain.model import (
    Chain,
    ChainSchedule,
    InfeasibleBudget,
    simulate_chain,
    store_all_schedule,
)
from remat_dsl.solve.solvers.chain.rotor import (
    ChainConfig,
    _exact_sizes,
    _min_peak,
    _opt_rec_p,
    _rounded_sizes,
    _Sizes,
    checkpoint_branch,
    first_fitting,
    in_slots,
)


def _option_sizes(chain: Chain, budget: int, slots: int):
    """Per block l (1..L), per option o: (abar, o_f, u_b, o_b) in slots, u_b in us."""

    def rounded(x: int) -> int:
        return -((-x * slots) // budget) if budget > 0 else (0 if x == 0 else slots + 1)

    table: list[list[tuple[int, int, int, int]]] = [[]]
    for block in chain.blocks:
        rows = []
        for o in range(len(block.options) + 1):
            xbar, fwd_overhead, bwd_us, bwd_overhead = block.variant(o)
            rows.append((rounded(xbar), rounded(fwd_overhead), bwd_us, rounded(bwd_overhead)))
        table.append(rows)
    return table


def _tables(chain: Chain, budget: int, slots: int):
    """Algorithm 5: cost[t, s, m] (us), choice[t, s, m] (0: Opt_1, s' > s: Opt_2 with the
    next checkpoint a^{s'-1}, -1: infeasible) and option[t, s, m] for Opt_1."""
    L = chain.length
    exact = _exact_sizes(chain)
    sz = _rounded_sizes(exact, np.array([budget], dtype=np.int64), slots).column(0)
    opts = _option_sizes(chain, budget, slots)
    uf = np.array([0] + [b.fwd_us for b in chain.blocks], dtype=np.float64)
    cum_f = np.cumsum(uf)
    cost = np.full((L + 2, L + 2, slots + 1), np.inf)
    choice = np.full((L + 2, L + 2, slots + 1), -1, dtype=np.int32)
    option = np.zeros((L + 2, L + 2, slots + 1), dtype=np.int16)
    for dist in range(0, L):
        for s in range(1, L + 1 - dist):
            t = s + dist
            best = np.full(slots + 1, np.inf)
            best_option = np.zeros(slots + 1, dtype=np.int16)
            for o, (abar, of, ub, ob) in enumerate(opts[s]):  # eq. 2.20
                backward = abar + int(sz.d[s]) + int(sz.d[s - 1]) + ob + int(sz.kept(s + 1, t))
                need = max(int(sz.d[t]) + abar + of, backward, abar)
                if need > slots:
                    continue
                candidate = np.full(slots + 1, np.inf)
                if s == t:
                    candidate[need:] = uf[s] + ub
                else:
                    candidate[need:] = uf[s] + ub + cost[t, s + 1, need - abar : slots + 1 - abar]
                better = candidate < best
                best = np.where(better, candidate, best)
                best_option = np.where(better, o, best_option)
            choice[t, s] = np.where(np.isfinite(best), 0, -1)
            option[t, s] = best_option
            cost[t, s] = best
            if s == t:
                continue
            ck_best, ck_next = checkpoint_branch(cost, cum_f, sz, s, t)  # eq. 2.21
            use_ck = ck_best < best  # eq. 2.22; ties go to Opt_1
            cost[t, s] = np.where(use_ck, ck_best, best)
            choice[t, s] = np.where(use_ck, ck_next, choice[t, s])
    return cost, choice, option, sz, opts


def _build(choice, option, sz: _Sizes, opts, top: int):
    """Algorithm 6: rotor's OptRecP with F_all^s / B^s taking the option of the table."""

    def all_step(s: int, t: int, mem: int):
        o = int(option[t, s, mem])
        return ("F_all", s, o), ("B", s, o), opts[s][o][0]

    return _opt_rec_p(choice, sz, top, all_step)


def solve_rk_rotor(chain: Chain, budget: int, slots: int = ChainConfig.slots) -> ChainSchedule:
    """The fastest persistent sequence over the blocks' options within `budget` bytes.

    Raises InfeasibleBudget (with the smallest budget that works at these slots) when no
    sequence fits.  `predicted_peak` is `simulate_chain`'s (bytes), `predicted_us` the
    table's makespan (microseconds).
    """
    store_all = store_all_schedule(chain)
    if store_all.predicted_peak <= budget:
        return store_all  # option 0 everywhere: no recomputation at all
    schedule = try_rk_rotor(chain, budget, slots)
    if schedule is None:
        raise InfeasibleBudget(budget, min_feasible_budget(chain, slots))
    return schedule


def try_rk_rotor(chain: Chain, budget: int, slots: int = ChainConfig.slots) -> ChainSchedule | None:
    """`solve_rk_rotor` without the search for the smallest budget: None when nothing fits."""
    if budget <= 0:
        return None
    cost, choice, option, sz, opts = _tables(chain, budget, slots)
    top = slots - int(sz.a[0])
    if top < 0 or not np.isfinite(cost[chain.length, 1, top]):
        return None
    ops = _build(choice, option, sz, opts, top)
    peak, total = simulate_chain(chain, ops)
    assert peak <= budget and total == int(cost[chain.length, 1, top]), (peak, budget, total)
    return ChainSchedule(ops, total, peak)


def min_feasible_budget(chain: Chain, slots: int = ChainConfig.slots) -> int:
    """Smallest budget (bytes) at which `try_rk_rotor` succeeds (`solve_rk_rotor` without
    its store-all shortcut), exactly: rotor's search (`rotor.first_fitting`) over the
    budgets between the undiscretized floor and the store-all peak, with rotor's min/max
    table (`rotor._min_peak`) over the options, many budgets per round (feasibility grows
    with the budget: rounded sizes shrink); much faster than a bisection, which runs the
    whole cost table a dozen times (NOTE: [Chain memo] in solve/solvers/ilp/rockmate.py)."""
    exact = _exact_sizes(chain)
    options = _option_bytes(chain)
    floor = int(_min_peak(exact, options))

    def fits(budgets: np.ndarray) -> np.ndarray:
        rounded = _rounded_sizes(exact, budgets, slots)
        return (budgets > 0) & (_min_peak(rounded, [in_slots(o, budgets, slots) for o in options]) <= slots)

    return first_fitting(max(floor - 1, 0), store_all_schedule(chain).predicted_peak, fits)


def _option_bytes(chain: Chain) -> list[np.ndarray]:
    """Per block l (index 0 unused), its options' (abar, o_f, o_b) in bytes, shape (3, options + 1)."""
    table = [np.zeros((3, 1), dtype=np.int64)]
    for block in chain.blocks:
        variants = [block.variant(o) for o in range(len(block.options) + 1)]
        table.append(
            np.array([[v[0] for v in variants], [v[1] for v in variants], [v[3] for v in variants]], dtype=np.int64)
        )
    return table
