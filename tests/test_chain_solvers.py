"""Chain solvers: the step semantics of `simulate_chain`, rotor's persistent DP against
brute-force enumeration of persistent sequences, sqrt segments, infeasibility, timing."""

from __future__ import annotations

import functools
import math
import random
import time
from dataclasses import replace

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from remat_dsl.solve.solvers.chain.model import (
    Block,
    Chain,
    InfeasibleBudget,
    InvalidChainSequence,
    simulate_chain,
    store_all_ops,
    store_all_schedule,
)
from remat_dsl.solve.solvers.chain.rotor import min_feasible_budget, min_persistent_peak, solve_rotor
from remat_dsl.solve.solvers.chain.sqrt import segment_bounds, solve_checkpoint_sqrt

SETTINGS = settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def block(fwd=1, bwd=2, x=3, xbar=5, grad=3, of=0, ob=0) -> Block:
    return Block(fwd, bwd, x, xbar, grad, of, ob)


# --- simulate_chain on hand examples -------------------------------------------------


def test_one_block_store_all():
    chain = Chain((block(fwd=4, bwd=6, x=3, xbar=5, grad=2, of=1, ob=4),), input_bytes=10, input_grad_bytes=7)
    # start: a0 + delta1 = 12; F_all: 12 + 5 + 1 = 18; B: 12 + 5 + 7 (delta0) + 4 = 28.
    assert simulate_chain(chain, [("F_all", 1), ("B", 1)]) == (28, 10)


def test_checkpoint_then_recompute():
    chain = Chain((block(fwd=1, bwd=10, x=4, xbar=6, grad=4), block(fwd=2, bwd=20, x=8, xbar=9, grad=8)), 2, 2)
    ops = [("F_ck", 1), ("F_all", 2), ("B", 2), ("F_all", 1), ("B", 1)]
    # live at start: a0 2 + delta2 8 = 10
    # F_ck 1: 10 + a1 4 = 14 (a0 kept)          -> live 14
    # F_all 2: 14 + abar2 9 = 23                -> live 23
    # B 2: 23 + delta1 4 = 27; frees delta2, abar2, plain a1 -> live 2 + 4 = 6
    # F_all 1: 6 + 6 = 12; B 1: 12 + delta0 2 = 14
    assert simulate_chain(chain, ops) == (27, 1 + 2 + 20 + 1 + 10)


def test_kept_gradients_stay_from_their_backward_step_on():
    """NOTE: [Kept gradients]: B^2's 7 bytes of parameter gradients are live while B^1 runs."""
    chain = Chain(
        (block(fwd=1, bwd=10, x=4, xbar=6, grad=4), replace(block(fwd=2, bwd=20, x=8, xbar=9, grad=8), kept_bytes=7)),
        2,
        2,
    )
    ops = [("F_ck", 1), ("F_all", 2), ("B", 2), ("F_all", 1), ("B", 1)]
    # as test_checkpoint_then_recompute, with 7 more from B 2 on: F_all 1: 6 + 7 + 6 = 19; B 1: 19 + 2 = 21
    assert simulate_chain(chain, ops) == (27, 34)
    # with 20 bytes, B 1 peaks at 2 + 4 + 20 + 6 + 2 = 34, as high as store-all's B 1, which
    # is faster: the table must count the 20 bytes to refuse 33 and give store-all at 34
    heavier = replace(chain, blocks=(chain.blocks[0], replace(chain.blocks[1], kept_bytes=20)))
    assert simulate_chain(heavier, ops) == (34, 34)
    assert simulate_chain(heavier, store_all_ops(heavier)) == (34, 33)
    assert min(peak for peak, _, _ in all_persistent(heavier)) == 34
    assert solve_rotor(heavier, 34, slots=34).predicted_us == 33
    with pytest.raises(InfeasibleBudget):
        solve_rotor(heavier, 33, slots=33)


def test_f_n_frees_plain_input_but_not_abar():
    chain = Chain(tuple(block(fwd=1, bwd=1, x=10, xbar=10, grad=0) for _ in range(3)), 1, 0)
    # F_ck 1 keeps a0, F_n 2 frees a1, F_all 3 keeps a2: peak at F_all 3 = 1 + 10 + 10 = 21.
    ops = [("F_ck", 1), ("F_n", 2), ("F_all", 3), ("B", 3), ("F_ck", 1), ("F_all", 2), ("B", 2), ("F_all", 1), ("B", 1)]
    assert simulate_chain(chain, ops) == (21, 6 + 3)
    # F_n 2 reads a1 inside abar1 and keeps it (B 1 needs it); the plain a2 it makes is
    # kept by F_all 3 and freed by B 3.  Peak at F_all 3: a0 + abar1 + a2 + abar3 = 31.
    from_abar = [("F_all", 1), ("F_n", 2), ("F_all", 3), ("B", 3), ("F_all", 2), ("B", 2), ("B", 1)]
    assert simulate_chain(chain, from_abar) == (31, 4 + 3)
    # F_n 3 frees the plain a2, so B 3 lacks its input.
    with pytest.raises(InvalidChainSequence, match="input a\\^2 is not live"):
        simulate_chain(chain, [("F_all", 1), ("F_n", 2), ("F_n", 3), ("B", 3)])


def test_paper_toy_example():
    """Section 3.2, Table 2 (0.01 MB and 0.01 ms units): store-all peaks at 107 MB in
    37.4 ms; the sequence given for M = 90 MB peaks at 86.8 MB in 47.4 ms.  Block 7 is the
    loss.  Table 2 lists abar^4 = 10.66 < a^4 = 10.68 (measurement noise); we use 10.68."""
    a = [763, 954, 1068, 1106, 1068, 954, 763, 0]
    abar = [None, 954, 1068, 1108, 1068, 954, 763, 0]
    ob = [None, 2001, 2764, 3099, 3099, 2764, 1908, 0]
    uf = [None, 160, 220, 244, 251, 210, 143, 0]
    ub = [None, 305, 448, 509, 493, 421, 334, 0]
    chain = Chain(tuple(Block(uf[l], ub[l], a[l], abar[l], a[l], 0, ob[l]) for l in range(1, 8)), a[0], a[0])
    # peak at B^5: a0 + abar1..abar5 + delta5 + delta4 = 79.37 MB, plus o_b^5
    assert simulate_chain(chain, store_all_ops(chain)) == (7937 + 2764, 3738)
    paper = [("F_ck", 1), ("F_n", 2), ("F_n", 3)] + [("F_all", l) for l in range(4, 8)]
    paper += [("B", l) for l in range(7, 3, -1)]
    paper += [("F_ck", 1), ("F_n", 2), ("F_all", 3), ("B", 3), ("F_all", 1), ("F_all", 2), ("B", 2), ("B", 1)]
    assert simulate_chain(chain, paper) == (8677, 4742)
    best = solve_rotor(chain, 9000, slots=9000)  # one slot per 0.01 MB: exact
    assert best.predicted_us == 4742 and best.predicted_peak <= 9000


@pytest.mark.parametrize(
    "ops, message",
    [
        ([("F_ck", 1), ("B", 2)], "abar\\^2 is not live"),
        ([("F_all", 2)], "input a\\^1 is not live"),
        ([("F_all", 1), ("F_all", 1)], "a\\^1 is already live"),
        ([("F_n", 1), ("F_all", 2), ("B", 2), ("F_all", 1)], "input a\\^0 is not live"),
        ([("F_all", 1), ("F_all", 2), ("B", 2)], "only delta\\^0 may remain"),
        ([("X", 1)], "unknown step kind"),
        ([("F_all", 3)], "block index"),
    ],
)
def test_invalid_sequences(ops, message):
    chain = Chain((block(), block()), 1, 1)
    with pytest.raises(InvalidChainSequence, match=message):
        simulate_chain(chain, ops)


def test_block_validation():
    with pytest.raises(ValueError, match="xbar_bytes"):
        Block(1, 1, 10, 9, 1, 0, 0)
    with pytest.raises(ValueError, match="non-negative"):
        Block(1, -1, 1, 1, 1, 0, 0)
    with pytest.raises(ValueError, match="at least one block"):
        Chain((), 0, 0)


# --- sqrt ------------------------------------------------------------------------------


def test_segment_bounds_follow_checkpoint_sequential():
    assert segment_bounds(10, 3) == [(1, 3), (4, 6), (7, 10)]
    assert segment_bounds(4, 1) == [(1, 4)]
    with pytest.raises(ValueError):
        segment_bounds(4, 5)


def test_sqrt_sequence_shape():
    chain = Chain(tuple(block() for _ in range(4)), 1, 1)
    schedule = solve_checkpoint_sqrt(chain)  # round(sqrt(4)) = 2 segments of 2
    assert schedule.ops == (
        ("F_ck", 1), ("F_n", 2), ("F_all", 3), ("F_all", 4), ("B", 4), ("B", 3),
        ("F_all", 1), ("F_all", 2), ("B", 2), ("B", 1),
    )  # fmt: skip
    assert (schedule.predicted_peak, schedule.predicted_us) == simulate_chain(chain, schedule.ops)
    assert schedule.predicted_us == 4 * 1 + 2 * 1 + 4 * 2
    assert solve_checkpoint_sqrt(chain, segments=1).ops == store_all_ops(chain)


# --- brute force over persistent sequences -------------------------------------------------


@functools.lru_cache(maxsize=None)
def persistent_sequences(s: int, t: int) -> tuple[tuple, ...]:
    """Every memory persistent sequence (Definition 4.1) turning delta^t into delta^{s-1},
    built by the case analysis of Theorem 4.8 with no memory pruning."""
    if s == t:
        return ((("F_all", s), ("B", s)),)
    out = [(("F_all", s),) + rest + (("B", s),) for rest in persistent_sequences(s + 1, t)]
    for nxt in range(s + 1, t + 1):
        head = (("F_ck", s),) + tuple(("F_n", j) for j in range(s + 1, nxt))
        for right in persistent_sequences(nxt, t):
            for left in persistent_sequences(s, nxt - 1):
                out.append(head + right + left)
    return tuple(out)


def all_persistent(chain: Chain) -> list[tuple[int, int, tuple]]:
    """(peak, time, ops) of every persistent sequence of the chain."""
    return [(*simulate_chain(chain, ops), ops) for ops in persistent_sequences(1, chain.length)]


@st.composite
def chains(draw, max_blocks=6, max_size=12):
    n = draw(st.integers(1, max_blocks))
    size = st.integers(0, max_size)
    blocks = []
    for _ in range(n):
        x = draw(size)
        fields = (
            draw(st.integers(0, 20)),
            draw(st.integers(0, 20)),
            x,
            x + draw(size),
            draw(size),
            draw(st.integers(0, 6)),
            draw(st.integers(0, 6)),
        )
        blocks.append(Block(*fields, kept_bytes=draw(size) if draw(st.booleans()) else 0))  # NOTE: [Kept gradients]
    return Chain(tuple(blocks), draw(size), draw(size))


def assert_consistent(chain: Chain, schedule, budget: int) -> None:
    peak, total = simulate_chain(chain, schedule.ops)  # raises when invalid
    assert peak == schedule.predicted_peak <= budget
    assert total == schedule.predicted_us


@SETTINGS
@given(chains(), st.data())
def test_rotor_is_optimal_among_persistent_sequences(chain, data):
    """With one slot per byte (slots == budget) the DP is exact: it fits exactly when some
    persistent sequence fits, and its time is the least time of those that fit."""
    candidates = all_persistent(chain)
    store_all = store_all_schedule(chain)
    budget = data.draw(st.integers(1, store_all.predicted_peak + 3))
    fitting = [total for peak, total, _ in candidates if peak <= budget]
    if not fitting:
        with pytest.raises(InfeasibleBudget) as info:
            solve_rotor(chain, budget, slots=budget)
        assert info.value.smallest_feasible > budget
        return
    schedule = solve_rotor(chain, budget, slots=budget)
    assert_consistent(chain, schedule, budget)
    assert schedule.predicted_us == min(fitting)
    for segments in range(1, chain.length + 1):
        sqrt = solve_checkpoint_sqrt(chain, segments)
        if sqrt.predicted_peak <= budget:
            assert schedule.predicted_us <= sqrt.predicted_us


@SETTINGS
@given(chains())
def test_min_persistent_peak_matches_enumeration(chain):
    assert min_persistent_peak(chain) == min(peak for peak, _, _ in all_persistent(chain))


@SETTINGS
@given(chains(max_size=10**9), st.data())
def test_rotor_discretized_is_valid_and_within_budget(chain, data):
    """At the default 500 slots of large sizes: valid, within budget, never better than the
    exact persistent optimum, and never worse than store-all when store-all fits."""
    store_all = store_all_schedule(chain)
    budget = data.draw(st.integers(0, store_all.predicted_peak + 5))
    try:
        schedule = solve_rotor(chain, budget)
    except InfeasibleBudget as error:
        assert error.budget == budget and error.smallest_feasible > budget
        assert error.smallest_feasible == min_feasible_budget(chain)
        return
    assert_consistent(chain, schedule, budget)
    fitting = [total for peak, total, _ in all_persistent(chain) if peak <= budget]
    assert schedule.predicted_us >= min(fitting)
    if store_all.predicted_peak <= budget:
        assert schedule.predicted_us == store_all.predicted_us


# --- infeasibility and the smallest budget ----------------------------------------------


@SETTINGS
@given(chains(max_size=10**9), st.sampled_from([7, 50, 500]))
def test_min_feasible_budget_is_tight(chain, slots):
    smallest = min_feasible_budget(chain, slots)
    assert min_persistent_peak(chain) <= smallest <= store_all_schedule(chain).predicted_peak
    assert_consistent(chain, solve_rotor(chain, smallest, slots), smallest)
    if smallest > 0:
        with pytest.raises(InfeasibleBudget) as info:
            solve_rotor(chain, smallest - 1, slots)
        assert info.value.smallest_feasible == smallest
        assert f"smallest feasible budget is {smallest} bytes" in str(info.value)


def test_infeasible_budget_attributes():
    chain = Chain((block(x=100, xbar=100, grad=100),), 100, 100)
    with pytest.raises(InfeasibleBudget) as info:
        solve_rotor(chain, 10)
    assert info.value.budget == 10
    assert info.value.smallest_feasible == min_feasible_budget(chain) == 400
    assert "400 bytes" in str(info.value)


def test_bad_arguments():
    chain = Chain((block(),), 1, 1)
    with pytest.raises(ValueError):
        solve_rotor(chain, -1)
    with pytest.raises(ValueError):
        solve_rotor(chain, 100, slots=0)


# --- store-all when it fits -----------------------------------------------------------------


@SETTINGS
@given(chains(max_size=10**6), st.integers(0, 10**6), st.sampled_from([3, 500]))
def test_ample_budget_gives_store_all(chain, extra, slots):
    store_all = store_all_schedule(chain).predicted_peak
    schedule = solve_rotor(chain, store_all + extra, slots)
    assert schedule.ops == store_all_ops(chain)
    assert schedule.predicted_us == sum(b.fwd_us + b.bwd_us for b in chain.blocks)
    assert schedule.predicted_peak == store_all


# --- determinism and scale ----------------------------------------------------------------


def random_chain(length: int, seed: int) -> Chain:
    rng = random.Random(seed)
    blocks = []
    for _ in range(length):
        x = rng.randint(1, 10**8)
        blocks.append(
            Block(
                rng.randint(1, 1000),
                rng.randint(1, 2000),
                x,
                x + rng.randint(0, 3 * 10**8),
                x,
                rng.randint(0, 10**8),
                rng.randint(0, 2 * 10**8),
            )
        )
    return Chain(tuple(blocks), rng.randint(1, 10**8), 0)


def test_deterministic():
    chain = random_chain(12, seed=1)
    budget = store_all_schedule(chain).predicted_peak // 3
    assert solve_rotor(chain, budget) == solve_rotor(chain, budget)


def test_thirty_blocks_smoke():
    chain = random_chain(30, seed=0)
    store_all = store_all_schedule(chain).predicted_peak
    start = time.perf_counter()
    smallest = min_feasible_budget(chain)
    for budget in (smallest, store_all // 3, store_all // 2, store_all - 1):
        schedule = solve_rotor(chain, budget)
        assert_consistent(chain, schedule, budget)
    solve_checkpoint_sqrt(chain)
    print(f"30 blocks, 500 slots: {time.perf_counter() - start:.3f} s for min_feasible_budget and 4 solves")
    assert math.isfinite(smallest)
