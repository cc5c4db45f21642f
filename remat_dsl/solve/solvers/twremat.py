"""TW-Remat: rematerialization by divide and conquer over a tree decomposition.

Kumar, Purohit, Svitkina, Vee, Wang, "Efficient Rematerialization for Deep Networks"
(NeurIPS 2019; TW-Remat in docs/references.md), section 3:
Algorithm 1 schedules a subset S of a computation graph's nodes by recursing over a tree
decomposition of the graph (its undirected version, section 2.2).  A balanced separator
bag X* (Lemma 3, Jordan's theorem) splits the decomposition into components that touch
only through X*; each node v of X* is computed, in topological order, after its inputs in
every component are computed by a recursive call, and finally each component computes
what remains of S.  With a decomposition of width k, the schedule needs O((M_in + k
M_max) log n) memory and O(T_onepass k n^log(k+2)) time (Theorem 5).  No ILP: it scales
to graphs of any size, which is why HiRemate names it as a per-level solver.

Here (NOTE: [TW-Remat on an FB-graph]):

* the graph's nodes are the FB-graph's ops, an edge u -> v when v reads an output of u;
  S is every backward op (the step's parameter and input gradients);
* the decomposition comes from a min-degree elimination order (`tree_decomposition`),
  the heuristic family of section 4 (they used min fill-in), shrunk to at most n bags
  (Lemma 1);
* the trade-off of section 4.3: TWRemat(k) stops the recursion in components of at most
  k bags and runs their needed nodes in topological order.  k = the whole decomposition
  is the store-all order; k = 1 is Algorithm 1.  `solve(target)` tries k = B, B/2, ...,
  1 (B bags) and keeps the fastest order whose exact simulated peak fits the target.

NOTE: [TW-Remat on an FB-graph]
Algorithm 1 may run any node several times; our plans run every forward op once in the
forward section, in graph order (the forward returns the model's outputs before the
backward starts), and every backward op exactly once.  So the order is the forward ops in
graph order, then the algorithm's schedule from its first backward op on, keeping only
the first run of each backward op.  Both edits keep the order valid: a dropped run's
readers read the first run's outputs, which the one lowering keeps alive until their last
use (remat_dsl.solve.lowering), and what the schedule's prefix computed before its first
backward op the forward section has computed too, so the lowering keeps exactly what the
backward reads before it recomputes it.  Both edits change memory, never correctness; the
driver simulates every candidate exactly (remat_dsl.check.replay).
"""

from __future__ import annotations

import functools
import heapq
from collections import deque
from dataclasses import dataclass

from remat_dsl.plan import ir
from remat_dsl.plan.ir import op_predecessors, op_uses, pinned_tensors
from remat_dsl.plan.liveness import estimated_peak
from remat_dsl.plan.units import format_bytes
from remat_dsl.solve.api import BudgetError, Decision, Problem, Solver, SolverInfo, SolverResult, Status, setting



@dataclass(frozen=True)
class TWRematConfig:
    """TW-Remat's recursion limits."""

    max_length_factor: int = setting(
        16,
        "a schedule longer than this many times the graph's ops is not tried (Theorem 5: length grows as n^log(k+2))",
    )


@dataclass(frozen=True)
class TreeDecomposition:
    """Bags of node indices (frozensets) and the tree's edges between bag indices; width
    is the largest bag's size minus one (section 2.2)."""

    bags: tuple[frozenset[int], ...]
    edges: tuple[tuple[int, int], ...]

    @property
    def width(self) -> int:
        return max((len(b) for b in self.bags), default=1) - 1


def tree_decomposition(adjacency: list[set[int]]) -> TreeDecomposition:
    """A tree decomposition of the undirected graph `adjacency` (node i's neighbours) from a
    min-degree elimination order, shrunk by Lemma 1 (adjacent bags where one holds the
    other are merged: at most n bags).

    Eliminating v makes its remaining neighbours a clique; its bag is v and those
    neighbours, hung below the bag of the first of them to be eliminated.  Ties go to the
    smaller index, so the decomposition is deterministic.  (networkx's
    `treewidth_min_degree` builds the same kind of decomposition, but is much slower on
    graphs of tens of thousands of nodes: docs/measured-notes.md.)
    """
    n = len(adjacency)
    adj = [set(a) for a in adjacency]
    heap = [(len(a), v) for v, a in enumerate(adj)]
    heapq.heapify(heap)
    position = [-1] * n
    order: list[int] = []
    bags: list[frozenset[int]] = []
    while heap:
        degree, v = heapq.heappop(heap)
        if position[v] >= 0 or degree != len(adj[v]):
            continue
        position[v] = len(order)
        order.append(v)
        neighbours = adj[v]
        bags.append(frozenset(neighbours | {v}))
        for u in neighbours:
            others = adj[u]
            others.discard(v)
            others |= neighbours
            others.discard(u)
            heapq.heappush(heap, (len(others), u))
        adj[v] = set()
    parent = [-1] * n
    roots = []
    for i, v in enumerate(order):
        rest = bags[i] - {v}
        if rest:
            parent[i] = min(position[u] for u in rest)
        else:
            roots.append(i)
    edges = [(i, parent[i]) for i in range(n) if parent[i] >= 0]
    edges += [(roots[j], roots[j + 1]) for j in range(len(roots) - 1)]  # a forest joined: the bags share nothing
    return _shrunk(bags, edges)


def _shrunk(bags: list[frozenset[int]], edges: list[tuple[int, int]]) -> TreeDecomposition:
    """Lemma 1: merge adjacent bags where one is a subset of the other (union-find)."""
    root = list(range(len(bags)))
    content = list(bags)

    def find(i: int) -> int:
        while root[i] != i:
            root[i] = root[root[i]]
            i = root[i]
        return i

    for a, b in edges:
        ra, rb = find(a), find(b)
        if content[ra] <= content[rb] or content[rb] <= content[ra]:
            big, small = (ra, rb) if len(content[ra]) >= len(content[rb]) else (rb, ra)
            root[small] = big
    kept = sorted({find(i) for i in range(len(bags))})
    index = {r: j for j, r in enumerate(kept)}
    pairs = ((index[find(a)], index[find(b)]) for a, b in edges if find(a) != find(b))
    tree_edges = sorted({(min(x, y), max(x, y)) for x, y in pairs})
    return TreeDecomposition(tuple(content[r] for r in kept), tuple(tree_edges))


class _Schedule:
    """Algorithm 1 over one decomposition, with the recursion stopped at `leaf_bags` bags
    (section 4.3) and the schedule's length capped at `limit` nodes."""

    def __init__(self, preds: list[list[int]], td: TreeDecomposition, leaf_bags: int, limit: int):
        self.preds, self.leaf_bags, self.limit = preds, leaf_bags, limit
        self.neighbours: list[list[int]] = [[] for _ in td.bags]
        for a, b in td.edges:
            self.neighbours[a].append(b)
            self.neighbours[b].append(a)
        self.schedule: list[int] = []

    def run(self, bag_ids: list[int], bags: dict[int, frozenset[int]], wanted: set[int]) -> None:
        """Append to self.schedule a schedule of the nodes of `bags` that computes `wanted`
        (nodes outside the bags are in memory: the callers computed them)."""
        nodes = frozenset().union(*(bags[i] for i in bag_ids))
        needed = self._ancestors(wanted, nodes)
        if len(bag_ids) <= self.leaf_bags:
            self._extend(sorted(needed))  # node indices are a topological order
            return
        separator = _centroid(bag_ids, self.neighbours)
        cut = bags[separator]
        components = []
        for component in _components(bag_ids, separator, self.neighbours):
            sub = {i: bags[i] - cut for i in component}
            members = frozenset().union(*sub.values())
            if members & needed:
                components.append((component, sub, members))
        for v in sorted(cut & needed):
            for component, sub, members in components:
                inputs = set(self.preds[v]) & members
                if inputs:
                    self.run(component, sub, inputs)
            self._extend([v])
        for component, sub, members in components:
            rest = (wanted - cut) & members
            if rest:
                self.run(component, sub, rest)

    def _ancestors(self, wanted: set[int], nodes: frozenset[int]) -> set[int]:
        seen = set(wanted)
        queue = deque(wanted)
        while queue:
            for u in self.preds[queue.popleft()]:
                if u in nodes and u not in seen:
                    seen.add(u)
                    queue.append(u)
        return seen

    def _extend(self, nodes: list[int]) -> None:
        self.schedule.extend(nodes)
        if len(self.schedule) > self.limit:
            raise _TooLong


class _TooLong(Exception):
    pass


def _centroid(bag_ids: list[int], neighbours: list[list[int]]) -> int:
    """Lemma 3: a bag whose removal leaves components of at most half the bags (the first
    such bag in a fixed traversal, so the choice is deterministic)."""
    members = set(bag_ids)
    start = min(bag_ids)
    parent = {start: -1}
    order = [start]
    for i in order:
        for j in sorted(neighbours[i]):
            if j in members and j not in parent:
                parent[j] = i
                order.append(j)
    size = {i: 1 for i in order}
    for i in reversed(order[1:]):
        size[parent[i]] += size[i]
    total = len(order)
    for i in order:
        largest = max([total - size[i]] + [size[j] for j in neighbours[i] if j in members and parent.get(j) == i])
        if 2 * largest <= total:
            return i
    return start  # unreachable for a tree (Jordan's theorem)


def _components(bag_ids: list[int], removed: int, neighbours: list[list[int]]) -> list[list[int]]:
    """Connected components (sorted bag lists, in order of their smallest bag) of the tree on
    `bag_ids` without bag `removed`."""
    members = set(bag_ids) - {removed}
    seen: set[int] = set()
    result = []
    for i in sorted(members):
        if i in seen:
            continue
        component, queue = [], [i]
        seen.add(i)
        while queue:
            j = queue.pop()
            component.append(j)
            for k in neighbours[j]:
                if k in members and k not in seen:
                    seen.add(k)
                    queue.append(k)
        result.append(sorted(component))
    return result


@dataclass(frozen=True)
class _Candidate:
    leaf_bags: int
    order: tuple[str, ...]
    peak: int  # bytes, estimated by `_estimated_peak`
    time_us: int  # the ops' time in the order


class TWRemat(Solver):
    """`--solver twremat`: TW-Remat(k) over the FB-graph's tree decomposition (see the
    module docstring); status `heuristic` (it does not minimize time: of its candidate
    orders it keeps the fastest that fits).  Raises BudgetError below its smallest peak."""

    name = "twremat"
    auto_rank = None
    optimizes = False
    Config = TWRematConfig

    def __init__(self, problem: Problem, config: TWRematConfig | None = None):
        self.config = config or TWRematConfig()
        self.problem = problem
        graph = problem.graph
        self.ops = graph.ops
        self.preds = op_predecessors(graph)
        adjacency: list[set[int]] = [set() for _ in self.ops]
        for v, ps in enumerate(self.preds):
            for u in ps:
                adjacency[u].add(v)
                adjacency[v].add(u)
        self.decomposition = tree_decomposition(adjacency)
        self.backward = [i for i, op in enumerate(self.ops) if op.phase == ir.BACKWARD]
        self.index = {op.name: i for i, op in enumerate(self.ops)}
        self.sizes = graph.nbytes
        self.reads = [op_uses(op, self.sizes) for op in self.ops]
        self.pinned = pinned_tensors(graph)

    def describe(self) -> str:
        td = self.decomposition
        return f"bags={len(td.bags)} width={td.width}"

    @functools.cached_property
    def candidates(self) -> list[_Candidate]:
        """One order per recursion limit k = B, B/2, ..., 1 (section 4.3) with its estimated
        peak (`_estimated_peak`); a limit whose schedule is longer than `config.max_length_factor` x
        the ops is left out, and so are the smaller ones (their schedules are longer still)."""
        td = self.decomposition
        limits, k = [], len(td.bags)
        while k >= 1:
            limits.append(k)
            k //= 2
        result: list[_Candidate] = []
        report = self.problem.report
        for k in limits:
            if report:
                report(f"twremat: recursion down to {k} bag{'s' if k > 1 else ''} of {len(td.bags)} (width {td.width})")
            try:
                order = self.order(k)
            except _TooLong:
                break
            if any(c.order == order for c in result):
                continue
            steps = [self.index[name] for name in order]
            time_us = sum(self.ops[v].time_us for v in steps)
            result.append(_Candidate(k, order, self._estimated_peak(steps), time_us))
        return result

    def _estimated_peak(self, steps: list[int]) -> int:
        """The peak (bytes) of running op indices `steps` under the one lowering's rule
        (`estimated_peak`, NOTE: [Liveness] in remat_dsl.plan.liveness): outputs and
        temporaries counted while an op runs, model outputs and gradients never freed.
        Linear in the order's length, where the exact simulation (remat_dsl.check.replay)
        is too slow for the candidates of a 20,000-op graph; it leaves out what every
        candidate holds alike (inputs, RNG states), and the driver simulates the
        order it is given exactly (NOTE: [Budget correction] in remat_dsl.solve.driver)."""
        ops = self.ops
        return estimated_peak(
            [(self.reads[v], ops[v].outputs) for v in steps],
            self.sizes,
            [ops[v].temp_bytes for v in steps],
            pinned=self.pinned,
        )

    def order(self, leaf_bags: int) -> tuple[str, ...]:
        """The op order of TW-Remat(leaf_bags) (NOTE: [TW-Remat on an FB-graph]).  Raises
        _TooLong past `config.max_length_factor` x the graph's ops."""
        td = self.decomposition
        schedule = _Schedule(self.preds, td, leaf_bags, self.config.max_length_factor * len(self.ops))
        ids = list(range(len(td.bags)))
        schedule.run(ids, dict(enumerate(td.bags)), set(self.backward))
        order = [op.name for op in self.ops if op.phase == ir.FORWARD]
        first = next((j for j, v in enumerate(schedule.schedule) if self.ops[v].phase == ir.BACKWARD), 0)
        done: set[int] = set()
        for v in schedule.schedule[first:]:
            if self.ops[v].phase == ir.BACKWARD:
                if v in done:
                    continue
                done.add(v)
            order.append(self.ops[v].name)
        return tuple(order)

    def floor(self) -> int:
        """The smallest exact peak of its candidate orders (bytes)."""
        return min(c.peak for c in self.candidates)

    def floor_targets(self) -> list[int]:
        return [self.floor()]

    @property
    def info(self) -> SolverInfo:  # type: ignore[override]  # read-only: the driver only reads it
        return SolverInfo(Status.HEURISTIC)

    def solve(self, target: int) -> SolverResult:
        """The fastest candidate whose exact peak is at most `target` bytes."""
        fitting = [c for c in self.candidates if c.peak <= target]
        if not fitting:
            raise BudgetError(target, self.floor(), self.name)
        best = min(fitting, key=lambda c: (c.time_us, -c.leaf_bags))
        text = (
            f"twremat: recursion stopped at {best.leaf_bags} of {len(self.decomposition.bags)} bags "
            f"(width {self.decomposition.width}): peak {format_bytes(best.peak)}"
        )
        return SolverResult(best.order, self.info, (Decision(0, text),))
