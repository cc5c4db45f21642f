"""Liveness: where each tensor of an order of steps is made and where it is freed.

NOTE: [Liveness]
A tensor is freed right after the last step that reads it before it is made again, and
a tensor no step reads right after the step that makes it.  Making a tensor again starts
a new copy with an interval of its own; the reads after it are of the new copy.  Within a
step, its reads come before its writes.  A pinned tensor (a model output, a parameter
gradient: the caller and autograd hold them) is never freed, each copy of it.  A held
tensor is kept at least through a given step (a block's output, read outside the block,
kept to its backward's start).  The one lowering places its `delete`s by this rule, so
every estimate made before lowering (the solvers', polish's moves, the chain's block
costs) counts what the plan will hold: `memory_profile`'s peak is the exact replay's
(remat_dsl.check.replay) for a lowered order, but for what the replay adds for every
order alike (inputs, parameters) or for some ops (RNG states, in-place outputs), and
for a pinned tensor made again, which the estimate counts once per copy where the
replay discards the new copy after its step (tests/test_liveness.py, NOTE: [Estimate
and replay]).

Keys are any hashable names of tensors (tensor names, value indices of a solver's graph).
"""

from __future__ import annotations

from typing import Collection, Generic, Hashable, Iterable, Mapping, NamedTuple, Sequence, TypeVar

from remat_dsl.plan import ir

K = TypeVar("K", bound=Hashable)


class Interval(NamedTuple, Generic[K]):
    """One copy of a tensor in an order of steps (indices into the order, 0-based).

    made: the step that makes it; -1 for a tensor resident before the first step.
    last_read: the last step that reads this copy, None when no step does.
    end: the step right after which it is freed, max(made, last_read, the step it is
    held through); None for a pinned tensor (never freed).  May be len(steps) or more
    when it is held past the last step.
    """

    tensor: K
    made: int
    last_read: int | None
    end: int | None


def live_intervals(
    steps: Iterable[tuple[Iterable[K], Iterable[K]]],
    *,
    pinned: Collection[K] = frozenset(),
    held: Mapping[K, int] | None = None,
    resident: Iterable[K] = (),
) -> list[Interval[K]]:
    """Each copy's live interval when `steps` run in order (NOTE: [Liveness]).

    steps: per step, (the tensors it reads, the tensors it makes).  A read of a tensor
    that is neither resident nor made by an earlier step is no copy's read (an input, a
    parameter, or an order the replay will refuse).
    pinned: tensors never freed.  held: tensor -> a step through which a copy made at or
    before it stays (end at least that step).  resident: tensors made before the first
    step (made = -1).
    Returns the intervals, resident copies first, then in the order of their making.
    Linear in the reads and writes.
    """
    held = held or {}
    tensors: list[K] = []
    made: list[int] = []
    last: list[int | None] = []
    current: dict[K, int] = {}  # tensor -> index of its copy that reads go to

    def start(t: K, i: int) -> int:
        tensors.append(t)
        made.append(i)
        last.append(None)
        return len(tensors) - 1

    for t in resident:
        current[t] = start(t, -1)
    for i, (reads, writes) in enumerate(steps):
        for t in reads:
            j = current.get(t)
            if j is not None:
                last[j] = i
        for t in writes:
            current[t] = start(t, i)
    result = []
    for j, t in enumerate(tensors):
        read, floor = last[j], held.get(t)
        end = made[j] if read is None else max(made[j], read)
        if floor is not None and made[j] <= floor:
            end = max(end, floor)
        result.append(Interval(t, made[j], read, None if t in pinned else end))
    return result


def memory_profile(
    intervals: Iterable[Interval[K]], sizes: Mapping[K, int], temp: Sequence[int]
) -> tuple[list[int], list[int]]:
    """The memory of the steps whose `intervals` these are (bytes), per step: (during,
    after).  during[i]: what is alive before step i, plus every copy it makes, plus
    temp[i] (its temporaries); after[i]: alive right after it, its frees done.

    sizes: tensor -> bytes.  temp: bytes per step, len(temp) steps.  Copies resident
    before the first step are left out (the caller adds what they hold).  Raises KeyError
    for a tensor without a size.
    """
    n = len(temp)
    made, freed = [0] * n, [0] * n
    for iv in intervals:
        if iv.made < 0:
            continue
        size = sizes[iv.tensor]
        made[iv.made] += size
        if iv.end is not None and iv.end < n:
            freed[iv.end] += size
    during, after, live = [], [], 0
    for i in range(n):
        during.append(live + made[i] + temp[i])
        live += made[i] - freed[i]
        after.append(live)
    return during, after


def estimated_peak(
    steps: Sequence[tuple[Iterable[K], Iterable[K]]],
    sizes: Mapping[K, int],
    temp: Sequence[int],
    *,
    pinned: Collection[K] = frozenset(),
) -> int:
    """The peak (bytes) of running `steps` under NOTE: [Liveness]: the largest `during` of
    `memory_profile`, 0 for no steps.  Linear in the order's length, where the exact
    replay is too slow for many candidate orders of a large graph.  For an order of a
    graph's ops (reads: `op_uses`, writes: the outputs, temp: temp_bytes, pinned:
    `pinned_tensors`) it is the peak of the replay of the lowered plan without in-place
    outputs and RNG states, or above it by at most the bytes of the pinned tensors made
    again (NOTE: [Liveness])."""
    during, _ = memory_profile(live_intervals(steps, pinned=pinned), sizes, temp)
    return max(during, default=0)


def op_steps(graph: ir.Graph, order: Iterable[str]) -> list[tuple[list[str], tuple[str, ...]]]:
    """The steps of an order of `graph`'s op names, for `live_intervals`: per op, the
    tensors it reads (`op_uses`: allocations, not inputs or parameters) and its outputs.
    Raises KeyError for a name that is not an op of `graph`."""
    ops, tensors = graph.op_by_name, graph.tensor_by_name
    return [(ir.op_uses(ops[name], tensors), ops[name].outputs) for name in order]
