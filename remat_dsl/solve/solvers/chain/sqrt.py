"""Chen et al.'s sqrt(n) segments ("Training deep nets with sublinear memory cost", 2016),
as `torch.utils.checkpoint.checkpoint_sequential` runs them, in the chain vocabulary of
`remat_dsl.solve.solvers.chain.model` (rotor paper, section 5.4, the "sequential" strategy).
"""

from __future__ import annotations

import math

from remat_dsl.solve.api import Problem, Status
from remat_dsl.solve.solvers.autograd import FixedOrder
from remat_dsl.solve.solvers.chain.model import Chain, ChainOp, ChainSchedule, simulate_chain
from remat_dsl.solve.solvers.chain.partition import chain_steps, partition


def segment_bounds(length: int, segments: int) -> list[tuple[int, int]]:
    """Blocks (first, last), 1-based and inclusive, of each segment, split as
    checkpoint_sequential does: segments-1 segments of length // segments blocks, the last
    segment takes the rest.  Raises ValueError unless 1 <= segments <= length.
    """
    if not 1 <= segments <= length:
        raise ValueError(f"segments must be in 1..{length} for a chain of {length} blocks, got {segments}")
    size = length // segments
    bounds = [(k * size + 1, (k + 1) * size) for k in range(segments - 1)]
    bounds.append(((segments - 1) * size + 1, length))
    return bounds


def solve_checkpoint_sqrt(chain: Chain, segments: int | None = None) -> ChainSchedule:
    """checkpoint_sequential's sequence: `segments` (default round(sqrt(L))) segments.

    Forward: each segment but the last keeps only its input (F_ck on its first block, F_n on
    the others); the last segment runs F_all.  Backward: B on the last segment, then each
    earlier segment, from last to first, reruns with F_all and runs B in reverse.
    Predictions come from `simulate_chain` (bytes, microseconds).  Raises ValueError for a
    segment count outside 1..L.
    """
    L = chain.length
    if segments is None:
        segments = max(1, min(L, round(math.sqrt(L))))
    bounds = segment_bounds(L, segments)
    ops: list[ChainOp] = []
    for first, last in bounds[:-1]:
        ops.append(("F_ck", first))
        ops.extend(("F_n", l) for l in range(first + 1, last + 1))
    first, last = bounds[-1]
    ops.extend(("F_all", l) for l in range(first, last + 1))
    ops.extend(("B", l) for l in range(last, first - 1, -1))
    for first, last in reversed(bounds[:-1]):
        ops.extend(("F_all", l) for l in range(first, last + 1))
        ops.extend(("B", l) for l in range(last, first - 1, -1))
    peak, total = simulate_chain(chain, ops)
    return ChainSchedule(tuple(ops), total, peak)


class CheckpointSqrt(FixedOrder):
    """`--solver checkpoint-sqrt`: checkpoint_sequential's segments over the chain of blocks
    (remat_dsl.solve.solvers.chain.partition), whatever the budget (status `heuristic`)."""

    name = "checkpoint-sqrt"
    status = Status.HEURISTIC

    def __init__(self, problem: Problem):
        super().__init__(problem)
        self.part = partition(problem.graph)

    def describe(self) -> str:
        return f"blocks={len(self.part.blocks)}"

    def steps(self):
        return chain_steps(self.part, solve_checkpoint_sqrt(self.part.chain).ops)
