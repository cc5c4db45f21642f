"""Host memory as the generated module allocates it: its host copies grouped (thesis 4.7.2).

Source: Zhao, PhD thesis "Optimizing Memory Usage when Training Deep Neural Networks"
(2024), section 4.7.2 "Grouping of CPU Memory Allocations".

NOTE: [Pinned host memory]
On a GPU every host copy the generated module makes is pinned (page-locked), so that its
copies run asynchronously: the activations and gradients a step offloads, the parameters
kept in host memory (NOTE: [Parameters on the host] in remat_dsl.check.replay) and paged
optimizer states (NOTE: [Paged optimizer states] in remat_dsl.plan.optimizer).  PyTorch's
pinned allocator (CachingHostAllocator, ATen/core/CachingHostAllocator.h, `allocate`)
rounds each request up to the next power of two (`c10::llvm::PowerOf2Ceil`; the default
`pinned_max_round_threshold` is unlimited), so one pinned tensor per copy would hold up to
twice the plan's bytes: a Llama-2-7B MLP weight in fp32 (172 MiB) takes 256 MiB, and its
two AdamW states as much each.  The thesis met this as host memory above its eq. 4.18
and grouped its allocations "to obtain groups of size almost 2^n".

Here the copies of one kind are packed into groups, first fit by decreasing size, each
group at most `capacity` = the larger of the next power of two of the largest copy and
GROUP_BYTES (the next power of two of all of them, when that is smaller), every copy at a
multiple of PINNED_ALIGN; a group then asks for the bytes it uses, which the allocator
rounds up to at most `capacity`.  A group the rounding would leave partly empty (the last
ones) is packed again at half the capacity, recursively, or split into one group per copy,
whichever reserves least, so that the groups never pin more than one allocation per copy.
Three kinds, each one layout (`host_copies`):

    pool      what one step offloads (one group set per step in flight, NOTE: [Streams] 5 in
              remat_dsl/codegen/runtime.py), keyed by tensor;
    streamed  the parameters kept in host memory, keyed by parameter;
    paged     paged optimizer states, one slot per parameter holding its state tensors
              (`Optimizer.state_tensors`), each its parameter's bytes, one after another.

The checker counts, for a plan on a GPU, each group at `reserved_bytes` (the allocator's
rounding) and for a plan on the CPU at its bytes (no pinning there); the generated module
allocates the same groups (codegen emits the layouts as literals).  A parameter's or a
state's host copy is a tensor with a storage of its own inside its group (so that a
checkpoint writes each at its size and safetensors finds no shared storage).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

from remat_dsl.plan import ir
from remat_dsl.plan.ir import DTYPE_ITEMSIZE
from remat_dsl.plan.optimizer import parse_optimizer

PINNED_ALIGN = 64  # bytes: every host copy starts at a multiple of this (a cache line; any dtype's size divides it)
GROUP_BYTES = 1 << 30  # bytes: a group's size when the copies are larger in total


def reserved_bytes(nbytes: int) -> int:
    """The bytes PyTorch's pinned allocator reserves for a request of `nbytes` bytes: the
    next power of two (0 for 0).  Source: ATen/core/CachingHostAllocator.h, `allocate`."""
    return 0 if nbytes <= 0 else 1 << (nbytes - 1).bit_length()


def aligned(nbytes: int) -> int:
    """`nbytes` rounded up to a multiple of PINNED_ALIGN."""
    return -(-nbytes // PINNED_ALIGN) * PINNED_ALIGN


@dataclass(frozen=True)
class HostGroups:
    """Copies packed into groups (NOTE: [Pinned host memory]).

    sizes: the bytes each group asks for (the copies it holds, aligned); slots: copy ->
    (group index, byte offset in the group), the offset a multiple of PINNED_ALIGN."""

    sizes: tuple[int, ...]
    slots: Mapping[str, tuple[int, int]]

    @property
    def nbytes(self) -> int:
        """Bytes the groups ask for (the host memory they hold on a CPU)."""
        return sum(self.sizes)

    @property
    def pinned_bytes(self) -> int:
        """Bytes the groups hold as pinned memory on a GPU (`reserved_bytes` of each)."""
        return sum(reserved_bytes(size) for size in self.sizes)


def group_copies(copies: Mapping[str, int]) -> HostGroups:
    """`copies` (name -> bytes) packed into groups, first fit by decreasing size (ties by
    name, so the layout is the same on any machine), as NOTE: [Pinned host memory] says;
    the pinned bytes of the groups are at most those of one group per copy."""
    if not copies:
        return HostGroups((), {})
    ordered = sorted(((aligned(max(n, 1)), name) for name, n in copies.items()), key=lambda c: (-c[0], c[1]))
    total = sum(size for size, _ in ordered)
    capacity = max(reserved_bytes(ordered[0][0]), min(GROUP_BYTES, reserved_bytes(total)))
    used: list[int] = []
    slots: dict[str, tuple[int, int]] = {}
    for members in _packed(ordered, capacity):
        offset = 0
        for size, name in members:
            slots[name] = (len(used), offset)
            offset += size
        used.append(offset)
    return HostGroups(tuple(used), dict(sorted(slots.items())))


Copies = list[tuple[int, str]]  # (aligned bytes, name), by decreasing size


def _packed(ordered: Copies, capacity: int) -> list[Copies]:
    """`ordered` in groups of at most `capacity` bytes, first fit; a group the allocator
    would round up (its bytes above half its power of two) is packed again at half the
    capacity, or split into one group per copy, where that reserves less."""
    groups: list[Copies] = []
    used: list[int] = []
    for size, name in ordered:
        group = next((g for g, u in enumerate(used) if u + size <= capacity), len(used))
        if group == len(used):
            groups.append([])
            used.append(0)
        groups[group].append((size, name))
        used[group] += size
    result: list[Copies] = []
    for members, nbytes in zip(groups, used):
        options = [[members], [[copy] for copy in members]]
        if capacity // 2 >= reserved_bytes(members[0][0]) and nbytes > capacity // 2:
            options.append(_packed(members, capacity // 2))
        result.extend(min(options, key=lambda split: sum(reserved_bytes(sum(s for s, _ in g)) for g in split)))
    return result


def offload_bytes(decl: ir.TensorDecl) -> int:
    """The bytes of `decl`'s host copy: its dense copy, max(nbytes, numel x itemsize) (a
    tensor whose storage is smaller than its elements, which no captured graph has, still fits)."""
    return max(decl.nbytes, math.prod(decl.shape) * DTYPE_ITEMSIZE[decl.dtype])


@dataclass(frozen=True)
class HostCopies:
    """The module's three kinds of host copies (NOTE: [Pinned host memory]).

    pool: keyed by offloaded tensor; streamed: by parameter kept in host memory; paged: by
    parameter with paged states, its slot `state_tensors` copies of the parameter's aligned
    bytes one after another."""

    pool: HostGroups
    streamed: HostGroups
    paged: HostGroups
    state_tensors: int

    def nbytes(self, pinned: bool) -> int:
        """Bytes of host memory the three hold: as pinned groups on a GPU (`pinned`), else as
        plain ones."""
        kinds = (self.pool, self.streamed, self.paged)
        return sum(k.pinned_bytes if pinned else k.nbytes for k in kinds)


def host_copies(plan: ir.Plan) -> HostCopies:
    """The layouts of `plan`'s host copies: each offloaded tensor once (a parameter's
    `offload` is its write-back into its own host copy, not a pool slot), each parameter
    the plan prefetches, and each parameter whose states it pages.  Its dtypes are those
    the verifier accepts (KeyError otherwise)."""
    tensors = plan.graph.tensor_by_name
    params = {p.name: math.prod(p.shape) * DTYPE_ITEMSIZE[p.dtype] for p in plan.graph.parameters}
    instructions = (*plan.forward, *plan.backward)
    pool = {
        i.target: offload_bytes(tensors[i.target]) for i in instructions if i.verb == "offload" and i.target in tensors
    }
    streamed = {i.target: params[i.target] for i in instructions if i.verb == "prefetch" and i.target in params}
    optimizer = parse_optimizer(plan.header.optimizer) if plan.header.optimizer else None
    count = optimizer.state_tensors if optimizer is not None else 0
    paged = {
        i.target: count * aligned(params[i.target])
        for i in plan.backward
        if i.verb == "prefetch_states" and i.target in params
    }
    return HostCopies(group_copies(pool), group_copies(streamed), group_copies(paged), count)
