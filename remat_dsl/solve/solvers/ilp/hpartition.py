"""H-Partition: the recursive convex partition of the forward graph used by HiRemate.

References (docs/references.md):
  [HR]  Gusak, Zhao, Le Hellard, Li, Eyraud-Dubois, Beaumont, "HiRemate: Hierarchical
        Approach for Efficient Re-materialization of Large Neural Networks" (preprint,
        2023), Section 3.1 and Appendix A (Algorithm 1 = Algorithm 2, eq. (1),
        Property 1, Lemma A.2, Lemma A.3, Theorem A.4) and Appendix C.1.1.
  [TH]  Zhao, PhD thesis "Optimizing Memory Usage when Training Deep Neural Networks"
        (2024), Section 3.3 (Algorithm 7, eq. 3.1 - 3.3, Definition 3.3.1, Lemma 3.3.1,
        Lemma 3.3.2, Theorem 3.3.2, Section 3.3.5 identical H-clusters, Section 3.3.6
        complexity).

`h_partition(dag, value_bytes, labels, max_size)` returns the root `HCluster` of a
hierarchy of convex groups of the forward DAG, each with at most `max_size` children
(M^l = M^t = max_size).  `is_convex` is the convexity test of Definition 3.3.1, and
`forward_dag(graph)` builds the input of `h_partition` from an `ir.Graph`.

NOTE: [Algorithm 7, level by level]
One iteration of the outer loop of Algorithm 7 (a *level*) works on the quotient graph Q
whose nodes ("units") are the leaves and clusters made so far.
 1. Candidate groups (line 5, [TH] 3.3.1 "Forming candidate groups"): for each unit x,
    a(x) is the closest common ancestor of the direct predecessors of x: the common
    ancestor (a predecessor counts as its own ancestor, paths of length 0 are paths,
    3.3.2) that comes last in the topological order of Q, or a virtual global source when
    the predecessors have no common ancestor.  The candidates are the nodes on all paths
    from a(x) to x, desc(a(x)) & anc(x), with and without x and with and without a(x)
    (four groups); groups of fewer than 2 or more than max_size units are discarded.
 2. Selection (line 7): the candidate of least score s_alpha, eq. 3.1 (eq. (1) of [HR];
    the thesis prints the node-count factor as a fraction by mistake):
        s_alpha(C) = (bytes of the values that enter or leave C) * (original nodes in C)^alpha
    with alpha = 0.5.  A value is one op's `value_bytes`; a value enters C when an op of C
    reads it and its producer is outside C, and leaves C when an op outside C reads it or
    it is a sink of the DAG (a model output).  Ties break on the candidate's units: the
    candidate whose last unit (in the topological order of Q) comes first, and so on.
 3. Wrap (line 8) and update (line 9, [TH] 3.3.4): every candidate that intersects the
    new group C is replaced by its union with C, made convex again (NOTE: [Convexity])
    and dropped if it has more than max_size units.  Groups grow inside a level (a later
    candidate may absorb an earlier group: the new group's children are the units of
    both, flat).
 4. The level stops when Q has at most max_size parts (M^t) or no candidate is left; the
    groups become clusters (line 10-11) and the next level runs on the new quotient.

NOTE: [Convexity]
[TH] 3.3.3 - 3.3.4 prove convexity through Property 3 (eq. 3.2, 3.3: a head h(C) is the
only node outside C with an edge into C, and reaches all of C), which holds when a(x)
dominates the interval.  With the common-ancestor reading it does not always hold: in
GPT-2 the interval [attn.c_attn, attn.bmm_1] of a layer contains attn.add, which also
reads the causal mask from outside (a dominator reading instead makes a(x) the global
source for every node after the mask is added, and leaves almost no small candidate).  So
Theorem 3.3.2 (the union of two intersecting candidates is a candidate) is not relied on;
convexity is kept directly instead:
  - an interval desc(a) & anc(x) is convex (a path between two of its nodes stays in
    it), and removing its unique source a or its unique sink x keeps it convex;
  - an updated candidate is replaced by its convex closure desc(S) & anc(S) in Q,
    re-expanded to whole groups until it is both (`_Merger.normalize`).
Every cluster is then convex in the DAG (Definition 3.3.1, the conclusion of Lemma
3.3.1): a path that leaves a union of convex units and re-enters it is a path of Q that
does the same.

NOTE: [Sequential wraps]
Convexity of each group in Q is not enough when a level wraps several groups: A = {a, a'}
and B = {b, b'} with edges a -> b and b' -> a' are both convex, yet the quotient has the
cycle A -> B -> A.  The argument of 3.3.2 ("merging a convex subgraph into a node does not
create new cycles") is for one contraction at a time, so each wrap must be convex in the
graph G' where the groups already formed in the level are contracted.  `_Merger` keeps a
topological order of G' (ranks of parts) and, before a wrap, searches the parts ranked
between the candidate's first and last part for a path that leaves it and comes back; if
there is one, the candidate is replaced by its closure in G' and re-queued.  After the
wrap the window is re-ranked: the parts that reach the new group, the group, the rest.

NOTE: [Deferred candidates]
An updated candidate (line 9) is a natural candidate plus a group that happened to meet
it.  Wrapping it even when that raises the level's total score (eq. 3.1 summed over the
parts) pushes leftover units onto whatever neighbour they touch: in GPT-2 the residual
add that ends layer k would join the attention block of layer k+1 and every layer would
be cut off-centre.  Such a candidate is deferred: it stays in the candidate set (an update
re-queues it), but is wrapped only if the level formed no group at all; the leftover unit
gets fresh candidates (line 5) at the next level, where the residual add joins its own
MLP block.  Candidates as formed on line 5 are always eligible, as in the paper.

NOTE: [Complexity]
[TH] 3.3.6 states O(N^2 log N) for the authors' implementation.  Here reachability is
kept as bitsets (Python ints, bit i = i-th unit of Q in topological order): anc(x) and
desc(x) are built in one pass over the edges, a(x) is the highest bit of the AND of the
predecessors' ancestor sets, an interval is one AND, a convex closure a few ORs and one
AND.  Candidates live in a heap with lazy deletion, and an index unit -> candidates
touches only the candidates that meet a new group; each candidate grows at most max_size
times; the G' check of a wrap scans the window of the candidate only.  The work is
O((N + E) * max_size * log N) Python operations per level, and levels shrink by at least
a quarter (NOTE: [Fallback]), so the sum over levels is of the same order.  The bitset
operations add a factor N/64 machine words (about 50 for 3000 nodes) and O(N^2/64) bits
of memory (1 MB at 3000 nodes, 12 MB at 10^4): negligible at the sizes of forward graphs,
quadratic beyond (timings: docs/measured-notes.md).

NOTE: [Fallback]
Algorithm 7 can get stuck: no candidate of a level fits max_size (isolated nodes such as
batch-norm counters, a node with hundreds of independent readers, ...) or a level merges
so little that the number of levels would grow with N (a star: one group of max_size
units per level).  When a level leaves more than max_size units and reduced their number
by less than a quarter, the units (after the groups Algorithm 7 did form) are cut into
contiguous intervals of their topological order, of balanced sizes <= max_size.  An
interval of a topological order of Q is convex, so every cluster stays convex.

NOTE: [Identical clusters, 3.3.5 and [HR] C.1.1]
A cluster's `key` is a digest of a canonical description that only uses positions: the
children's keys in order (a leaf's key is its label), the edges between children as
(child position, leaf index in the child) pairs, the external inputs as the sorted tuple
of the (child, leaf) positions that read each external value, and the positions of the
leaves whose value leaves the cluster.  Equal keys mean equal structure; a hash table is
all the recognition needs (no graph isomorphism), as in C.1.1.

NOTE: [Order of children]
Children are ordered by a topological order of the cluster's quotient graph that always
takes the ready child whose earliest leaf comes first (Kahn with that priority).  When the
order by earliest leaf is topological (the common case) this is exactly that order.
`leaves()` of any cluster is then a topological order of its nodes.
"""

from __future__ import annotations

import hashlib
import heapq
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

import networkx as nx

from remat_dsl.plan import ir

@dataclass(frozen=True)
class HCluster:
    """A convex group of the forward DAG: `children` are node names (str, leaves) or HCluster,
    listed in a topological order of the group; `key` is equal for identical clusters (3.3.5)."""

    children: tuple[str | HCluster, ...]
    key: str

    def leaves(self) -> tuple[str, ...]:
        """All leaf nodes, in topological order (children's leaves, concatenated)."""
        cached = self.__dict__.get("_leaves")
        if cached is None:
            out: list[str] = []
            for child in self.children:
                if isinstance(child, HCluster):
                    out.extend(child.leaves())
                else:
                    out.append(child)
            cached = tuple(out)
            object.__setattr__(self, "_leaves", cached)
        return cached

    def clusters(self) -> Iterator[HCluster]:
        """This cluster and every cluster below it, parents before children."""
        yield self
        for child in self.children:
            if isinstance(child, HCluster):
                yield from child.clusters()

    def depth(self) -> int:
        """1 for a cluster of leaves, 1 + the deepest child otherwise."""
        return 1 + max((c.depth() for c in self.children if isinstance(c, HCluster)), default=0)


Unit = str | HCluster


# ---------------------------------------------------------------------------
# Convexity (Definition 3.3.1)
# ---------------------------------------------------------------------------


def is_convex(dag: nx.DiGraph, nodes: Iterable[str]) -> bool:
    """Definition 3.3.1: every path between two nodes of `nodes` stays in `nodes`.

    Equivalently no node outside the set is both reachable from it and reaches it: walk
    forward from the set's outside successors and fail if the walk re-enters the set.
    """
    inside = set(nodes)
    frontier = [w for u in inside for w in dag.successors(u) if w not in inside]
    seen = set(frontier)
    while frontier:
        u = frontier.pop()
        for w in dag.successors(u):
            if w in inside:
                return False
            if w not in seen:
                seen.add(w)
                frontier.append(w)
    return True


# ---------------------------------------------------------------------------
# Bit helpers
# ---------------------------------------------------------------------------


def _bits(mask: int) -> Iterator[int]:
    """Indices of the set bits of `mask`, increasing."""
    while mask:
        low = mask & -mask
        yield low.bit_length() - 1
        mask ^= low


# ---------------------------------------------------------------------------
# The original graph, as positions
# ---------------------------------------------------------------------------


class _Base:
    """The input DAG as integer positions 0..n-1 in the given topological order."""

    def __init__(self, dag: nx.DiGraph, value_bytes: dict[str, int], labels: dict[str, str]):
        insertion = {u: i for i, u in enumerate(dag.nodes)}
        order = list(nx.lexicographical_topological_sort(dag, key=insertion.__getitem__))
        for u in order:
            if not isinstance(u, str):
                raise TypeError(f"h_partition: node {u!r} is not a str")
            if u not in value_bytes:
                raise ValueError(f"h_partition: value_bytes has no entry for node {u!r}")
            if u not in labels:
                raise ValueError(f"h_partition: labels has no entry for node {u!r}")
        self.names = order
        self.pos = {u: i for i, u in enumerate(order)}
        n = len(order)
        self.succ: list[list[int]] = [[] for _ in range(n)]
        self.pred: list[list[int]] = [[] for _ in range(n)]
        for u in order:
            i = self.pos[u]
            self.succ[i] = sorted({self.pos[w] for w in dag.successors(u) if w != u})
            self.pred[i] = sorted({self.pos[w] for w in dag.predecessors(u) if w != u})
        self.bytes = [int(value_bytes[u]) for u in order]
        self.labels = [str(labels[u]) for u in order]
        self.sink = [not s for s in self.succ]


# ---------------------------------------------------------------------------
# Keys of identical clusters (3.3.5)
# ---------------------------------------------------------------------------


def _leaf_positions(unit: Unit, base: _Base) -> list[int]:
    if isinstance(unit, HCluster):
        return [base.pos[u] for u in unit.leaves()]
    return [base.pos[unit]]


def _cluster_key(children: list[Unit], base: _Base) -> str:
    """Canonical description of a cluster in positions only (NOTE: [Identical clusters])."""
    loc: dict[int, tuple[int, int]] = {}
    child_keys = []
    for j, child in enumerate(children):
        child_keys.append(child.key if isinstance(child, HCluster) else "L" + base.labels[base.pos[child]])
        for k, p in enumerate(_leaf_positions(child, base)):
            loc[p] = (j, k)
    edges = []
    outputs = []
    external: dict[int, list[tuple[int, int]]] = {}
    for p, where in loc.items():
        leaves_cluster = base.sink[p]
        for w in base.succ[p]:
            other = loc.get(w)
            if other is None:
                leaves_cluster = True
            elif other[0] != where[0]:
                edges.append((where, other))
        if leaves_cluster:
            outputs.append(where)
        for v in base.pred[p]:
            if v not in loc:
                external.setdefault(v, []).append(where)
    inputs = sorted(tuple(sorted(readers)) for readers in external.values())
    text = repr((tuple(child_keys), sorted(edges), inputs, sorted(outputs)))
    return hashlib.sha256(text.encode()).hexdigest()[:20]


def _make_cluster(children: list[Unit], base: _Base) -> HCluster:
    return HCluster(tuple(children), _cluster_key(children, base))


# ---------------------------------------------------------------------------
# One level of Algorithm 7
# ---------------------------------------------------------------------------


def _topo_units(units: list[Unit], first: list[int], edges: set[tuple[int, int]]) -> list[int]:
    """Kahn's algorithm over unit indices, always taking the ready unit with the earliest leaf."""
    indeg = [0] * len(units)
    out: list[list[int]] = [[] for _ in units]
    for a, b in edges:
        out[a].append(b)
        indeg[b] += 1
    ready = [(first[i], i) for i in range(len(units)) if indeg[i] == 0]
    heapq.heapify(ready)
    order = []
    while ready:
        _, i = heapq.heappop(ready)
        order.append(i)
        for j in out[i]:
            indeg[j] -= 1
            if indeg[j] == 0:
                heapq.heappush(ready, (first[j], j))
    if len(order) != len(units):  # pragma: no cover - convexity makes Q acyclic
        raise AssertionError("h_partition: the quotient graph has a cycle (a cluster is not convex)")
    return order


class _Level:
    """The quotient graph Q of one level: units in topological order, bitset reachability."""

    def __init__(self, units: list[Unit], base: _Base):
        owner_tmp = {}
        first = []
        for i, unit in enumerate(units):
            leaves = _leaf_positions(unit, base)
            first.append(min(leaves))
            for p in leaves:
                owner_tmp[p] = i
        edges = {
            (owner_tmp[p], owner_tmp[w])
            for p in range(len(base.names))
            for w in base.succ[p]
            if owner_tmp[p] != owner_tmp[w]
        }
        order = _topo_units(units, first, edges)
        rank = {old: new for new, old in enumerate(order)}
        self.units = [units[i] for i in order]
        self.first = [first[i] for i in order]
        n = len(self.units)
        self.n = n
        self.owner = [0] * len(base.names)
        for p, i in owner_tmp.items():
            self.owner[p] = rank[i]
        self.size = [0] * n  # original nodes per unit
        for p in range(len(base.names)):
            self.size[self.owner[p]] += 1
        self.pred: list[list[int]] = [[] for _ in range(n)]
        self.succ: list[list[int]] = [[] for _ in range(n)]
        for a, b in sorted((rank[a], rank[b]) for a, b in edges):
            self.succ[a].append(b)
            self.pred[b].append(a)
        # Reachability, inclusive: anc[i] has bit i and the bits of every ancestor of i.
        self.anc = [0] * n
        for i in range(n):
            m = 1 << i
            for p in self.pred[i]:
                m |= self.anc[p]
            self.anc[i] = m
        self.desc = [0] * n
        for i in range(n - 1, -1, -1):
            m = 1 << i
            for s in self.succ[i]:
                m |= self.desc[s]
            self.desc[i] = m
        # Boundary values of each unit (for eq. 3.1).
        owner = self.owner
        self.readers: list[tuple[int, ...]] = [()] * len(base.names)  # other units reading value p
        self.out_vals: list[list[int]] = [[] for _ in range(n)]
        self.in_vals: list[list[int]] = [[] for _ in range(n)]
        for p in range(len(base.names)):
            o = owner[p]
            readers = tuple(sorted({owner[w] for w in base.succ[p] if owner[w] != o}))
            self.readers[p] = readers
            if readers or base.sink[p]:
                self.out_vals[o].append(p)
            for r in readers:
                self.in_vals[r].append(p)


class _Merger:
    """Lines 5-9 of Algorithm 7 on one level (NOTE: [Algorithm 7, level by level]).

    A candidate or a part is a tuple of unit indices sorted in decreasing order: it is its
    own identity and its tie-break (compared like a bitmask, the set whose last unit comes
    first is smaller).  Parts are the units and groups of the level; `rank` is a
    topological order of the graph G' in which the groups formed so far are contracted
    (NOTE: [Sequential wraps]).
    """

    def __init__(self, level: _Level, base: _Base, max_size: int, alpha: float):
        self.q = level
        self.base = base
        self.max_size = max_size
        self.alpha = alpha
        n = level.n
        self.part_of = list(range(n))  # part id of each unit
        self.part_units: list[tuple[int, ...]] = [(i,) for i in range(n)]  # () once absorbed
        self.part_score: dict[int, float] = {}
        self.rank = list(range(n))  # rank of each part in a topological order of G'
        self.slots = list(range(n))  # part at each rank, -1 for a hole
        self.parts = n
        self.wrapped = 0
        self.cands: list[tuple[int, ...]] = []  # () = dropped
        self.expanded: list[bool] = []  # changed by an update (line 9) since line 5
        self.by_set: dict[tuple[int, ...], int] = {}
        self.index: list[list[int]] = [[] for _ in range(n)]
        self.heap: list[tuple[float, tuple[int, ...], int]] = []

    # -- sets ------------------------------------------------------------------

    def normalize(self, units: Iterable[int]) -> tuple[int, ...] | None:
        """Smallest superset of `units` that is convex in Q and a union of whole parts, as
        a candidate tuple; None if it has more than max_size units."""
        q, limit = self.q, self.max_size
        current = set(units)
        while True:
            grown: set[int] = set()
            for i in current:
                grown.update(self.part_units[self.part_of[i]])
            if len(grown) > limit:
                return None
            down = up = 0
            for i in grown:
                down |= q.desc[i]
                up |= q.anc[i]
            closed = down & up  # desc(S) & anc(S): the convex closure, a superset of S
            count = closed.bit_count()
            if count > limit:
                return None
            if count == len(grown):
                return tuple(sorted(grown, reverse=True))
            current = set(_bits(closed))

    def useful(self, cand: tuple[int, ...]) -> bool:
        """A candidate must merge at least two parts."""
        return len(cand) >= 2 and len(self.part_units[self.part_of[cand[0]]]) != len(cand)

    def score(self, cand: tuple[int, ...]) -> float:
        """eq. 3.1: (bytes entering or leaving the group) * (original nodes in it) ** alpha."""
        q, base = self.q, self.base
        inside = set(cand)
        io = 0
        nodes = 0
        seen_inputs: set[int] = set()
        for i in cand:
            nodes += q.size[i]
            for p in q.out_vals[i]:
                if base.sink[p] or any(r not in inside for r in q.readers[p]):
                    io += base.bytes[p]
            for p in q.in_vals[i]:
                if q.owner[p] not in inside and p not in seen_inputs:
                    seen_inputs.add(p)
                    io += base.bytes[p]
        return io * nodes**self.alpha

    # -- candidates --------------------------------------------------------------

    def _push(self, c: int, cand: tuple[int, ...]) -> None:
        self.cands[c] = cand
        self.by_set[cand] = c
        heapq.heappush(self.heap, (self.score(cand), cand, c))

    def _drop(self, c: int) -> None:
        cand = self.cands[c]
        if cand and self.by_set.get(cand) == c:
            del self.by_set[cand]
        self.cands[c] = ()

    def _replace(self, c: int, new: tuple[int, ...] | None) -> None:
        """Candidate c becomes `new` (None, useless or a duplicate: c is dropped)."""
        old = set(self.cands[c])
        self._drop(c)
        if new is not None and self.useful(new) and new not in self.by_set:
            for i in new:
                if i not in old:
                    self.index[i].append(c)
            self.expanded[c] = True
            self._push(c, new)

    def form_candidates(self) -> None:
        """Line 5 / 3.3.1: the four groups between a(x) and x, for every unit x."""
        q, limit = self.q, self.max_size
        for x in range(q.n):
            preds = q.pred[x]
            if not preds:
                continue  # a(x) is the global source: anc(x) = {x}, a single unit
            common = -1
            for p in preds:
                common &= q.anc[p]
            if common:
                a = common.bit_length() - 1  # the common ancestor that comes last
                interval = q.desc[a] & q.anc[x]
                ends: tuple[int, ...] = (a, x)
            else:
                interval = q.anc[x]  # paths from the virtual global source
                ends = (x,)
            count = interval.bit_count()
            if count > limit + len(ends) or count < 2:
                continue
            units = sorted(_bits(interval), reverse=True)
            for drop in ((), ends[:1], ends[1:], ends) if len(ends) == 2 else ((), ends):
                cand = tuple(u for u in units if u not in drop)  # with / without a(x), x
                if 2 <= len(cand) <= limit and cand not in self.by_set:
                    c = len(self.cands)
                    self.cands.append(())
                    self.expanded.append(False)
                    for i in cand:
                        self.index[i].append(c)
                    self._push(c, cand)

    # -- main loop -----------------------------------------------------------------

    def run(self) -> None:
        """Lines 6-9: select the least score, wrap it, update the candidates it meets.

        An updated candidate whose wrap would raise the level's total score is deferred
        (NOTE: [Deferred candidates]); deferred ones are wrapped only if the level formed
        no group at all.
        """
        deferred = self._loop(strict=True)
        if self.wrapped == 0:
            for entry in deferred:
                heapq.heappush(self.heap, entry)
            self._loop(strict=False)

    def _loop(self, strict: bool) -> list[tuple[float, tuple[int, ...], int]]:
        deferred = []
        while self.heap and self.parts > self.max_size:
            entry = heapq.heappop(self.heap)
            score, cand, c = entry
            if self.cands[c] != cand:
                continue  # stale entry
            if strict and self.expanded[c] and self._gain(score, cand) > 0:
                deferred.append(entry)  # stays a candidate: an update re-queues it
                continue
            between = self._between(cand)
            if between:  # not convex once the groups of this level are contracted
                self._replace(c, self.normalize(cand + between))
                continue
            self._drop(c)
            self._wrap(cand)
            touched = sorted({t for i in cand for t in self.index[i] if self.cands[t]})
            group = set(cand)
            for t in touched:
                old = self.cands[t]
                if group.issubset(old):
                    if len(old) == len(group):
                        self._drop(t)
                    continue  # already holds the whole group: unchanged
                self._replace(t, self.normalize(group.union(old)))
        return deferred

    def _gain(self, score: float, cand: tuple[int, ...]) -> float:
        """Change of the level's total score (eq. 3.1 summed over its parts) if cand is wrapped."""
        total = 0.0
        for p in {self.part_of[i] for i in cand}:
            if p not in self.part_score:
                self.part_score[p] = self.score(tuple(sorted(self.part_units[p], reverse=True)))
            total += self.part_score[p]
        return score - total

    def _search(self, cand: tuple[int, ...], forward: bool) -> set[int]:
        """Parts outside cand that it reaches (forward) or that reach it, in G', among those
        ranked strictly between its lowest and highest ranked parts."""
        q = self.q
        mine = {self.part_of[i] for i in cand}
        lo = min(self.rank[p] for p in mine)
        hi = max(self.rank[p] for p in mine)
        adj = q.succ if forward else q.pred
        found: set[int] = set()
        stack = list(cand)
        while stack:
            i = stack.pop()
            for j in adj[i]:
                p = self.part_of[j]
                if p in mine or p in found or not lo < self.rank[p] < hi:
                    continue
                found.add(p)
                stack.extend(self.part_units[p])
        return found

    def _between(self, cand: tuple[int, ...]) -> tuple[int, ...]:
        """Units of the parts on a path of G' that leaves cand and comes back (() if none)."""
        down = self._search(cand, True)
        if not down:
            return ()
        up = self._search(cand, False)
        return tuple(i for p in sorted(down & up) for i in self.part_units[p])

    def _wrap(self, cand: tuple[int, ...]) -> None:
        """Line 8: contract cand into one part, keeping `rank` a topological order of G': in
        the rank window of cand, the parts that reach cand go first, then cand, then the
        others, each in their previous order."""
        mine = {self.part_of[i] for i in cand}
        ranks = sorted(self.rank[p] for p in mine)
        lo, hi = ranks[0], ranks[-1]
        up = self._search(cand, False)
        window = [self.slots[r] for r in range(lo, hi + 1) if self.slots[r] >= 0]
        new = len(self.part_units)
        self.part_units.append(tuple(sorted(cand)))
        self.rank.append(-1)
        order = [p for p in window if p in up] + [new] + [p for p in window if p not in up and p not in mine]
        for r in range(lo, hi + 1):
            self.slots[r] = -1
        for k, p in enumerate(order):
            self.slots[lo + k] = p
            self.rank[p] = lo + k
        for p in mine:
            self.part_units[p] = ()
        for i in cand:
            self.part_of[i] = new
        self.parts -= len(mine) - 1
        self.wrapped += 1

    def groups(self) -> list[list[int]]:
        """The parts at the end of the level, as sorted lists of unit indices, in rank order."""
        return [sorted(self.part_units[p]) for p in self.slots if p >= 0]


def _ordered_children(members: list[int], level: _Level) -> list[Unit]:
    """Units of a group in a topological order of the group's quotient, earliest leaf first."""
    local = {u: k for k, u in enumerate(members)}
    edges = {(local[a], local[b]) for a in members for b in level.succ[a] if b in local}
    units = [level.units[u] for u in members]
    order = _topo_units(units, [level.first[u] for u in members], edges)
    return [units[k] for k in order]


def _intervals(count: int, limit: int) -> list[range]:
    """Balanced contiguous chunks of range(count), each of at most `limit` items."""
    chunks = -(-count // limit)
    bounds = [round(k * count / chunks) for k in range(chunks + 1)]
    return [range(bounds[k], bounds[k + 1]) for k in range(chunks)]


# ---------------------------------------------------------------------------
# Algorithm 7
# ---------------------------------------------------------------------------


def h_partition(dag: nx.DiGraph, value_bytes: dict[str, int], labels: dict[str, str],
                max_size: int = 12, alpha: float = 0.5, stuck_ratio: float = 0.75) -> HCluster:
    """dag: nodes are op names (str); an edge u->v means v reads a value u produces.
    value_bytes[u]: bytes of the values u produces (the interface cost used by eq. 3.1).
    labels[u]: a structural label of op u (its target and shapes) used to detect identical clusters.
    Returns the root cluster; every cluster has at most max_size children, is convex
    (no path leaves it and re-enters it), and the leaves of the root are exactly the nodes of dag.
    Deterministic: same input -> same output (tie-break on node order / names, never on hash order).
    alpha: the score exponent of eq. 3.1 (0.5, the default of [HR] Section 3.1).  stuck_ratio: a
    level that keeps more than this fraction of its units is stuck (NOTE: [Fallback]).
    HiremateConfig holds both (remat_dsl.solve.solvers.ilp.hiremate); the defaults are its.

    Algorithm 7 of the thesis (Algorithm 1/2 of the HiRemate paper) with M^l = M^t =
    max_size; see the module NOTEs for how a(x), convexity, the update
    of candidates (3.3.4), identical clusters (3.3.5) and the interval fallback are done.
    """
    if max_size < 2:
        raise ValueError("h_partition: max_size must be at least 2")
    base = _Base(dag, value_bytes, labels)
    units: list[Unit] = list(base.names)
    while len(units) > max_size:
        level = _Level(units, base)
        merger = _Merger(level, base, max_size, alpha)
        merger.form_candidates()
        merger.run()
        parts = merger.groups()
        next_units: list[Unit] = [
            level.units[p[0]] if len(p) == 1 else _make_cluster(_ordered_children(p, level), base)
            for p in parts
        ]
        if len(next_units) > max_size and len(next_units) > stuck_ratio * len(units):
            next_units = _fallback(next_units, base, max_size)
        units = next_units
    if len(units) == 1 and isinstance(units[0], HCluster):
        return units[0]
    level = _Level(units, base)
    return _make_cluster(list(level.units), base)


def _fallback(units: list[Unit], base: _Base, max_size: int) -> list[Unit]:
    """NOTE: [Fallback]: contiguous intervals of a topological order of the units."""
    level = _Level(units, base)
    out: list[Unit] = []
    for chunk in _intervals(level.n, max_size):
        members = list(chunk)
        if len(members) == 1:
            out.append(level.units[members[0]])
        else:
            out.append(_make_cluster(_ordered_children(members, level), base))
    return out


# ---------------------------------------------------------------------------
# From an ir.Graph
# ---------------------------------------------------------------------------


def _anonymous(arg: ir.Arg, decls: dict[str, tuple[tuple[int, ...], str]]) -> str:
    """An argument with value names replaced by their dtype and shape ("same code modulo
    renaming, same characteristics of inputs and parameters", [HR] C.1.1)."""
    if isinstance(arg, ir.Ref):
        shape, dtype = decls.get(arg.name, ((), "?"))
        return f"%{dtype}{list(shape)}"
    if isinstance(arg, ir.Sym):
        return arg.name
    if isinstance(arg, ir.Call):
        inner = [_anonymous(a, decls) for a in arg.args]
        inner += [f"{k}={_anonymous(a, decls)}" for k, a in arg.kwargs]
        return f"{arg.target}({', '.join(inner)})"
    if isinstance(arg, ir.ListArg):
        return "[" + ", ".join(_anonymous(a, decls) for a in arg.items) + "]"
    if isinstance(arg, ir.TupleArg):
        return "(" + ", ".join(_anonymous(a, decls) for a in arg.items) + ")"
    return repr(arg)


def forward_dag(graph: ir.Graph) -> tuple[nx.DiGraph, dict[str, int], dict[str, str]]:
    """(dag, value_bytes, labels) of an ir.Graph's forward ops, in their captured order.

    dag: one node per forward op (op.name), inserted in the graph's order (a topological
    order); an edge u -> v when v's arguments refer to an output of u.
    value_bytes[u]: total nbytes of u's outputs.
    labels[u]: `target(anonymized args) -> dtype[shape], ...` of the outputs: the target,
    its arguments with every value replaced by its dtype and shape, and the outputs' dtype
    and shape -- equal for the same code on same-shaped values.
    """
    tensors = graph.tensor_by_name
    decls: dict[str, tuple[tuple[int, ...], str]] = {t.name: (t.shape, t.dtype) for t in graph.tensors}
    for group in (graph.inputs, graph.parameters, graph.buffers, graph.tangents):
        for v in group:
            decls[v.name] = (v.shape, v.dtype)
    forward = [op for op in graph.ops if op.phase == ir.FORWARD]
    names = {op.name for op in forward}
    dag = nx.DiGraph()
    value_bytes: dict[str, int] = {}
    labels: dict[str, str] = {}
    for op in forward:
        dag.add_node(op.name)
        value_bytes[op.name] = sum(tensors[t].nbytes for t in op.outputs if t in tensors)
        args = [_anonymous(a, decls) for a in op.args]
        args += [f"{k}={_anonymous(a, decls)}" for k, a in op.kwargs]
        outs = ", ".join(f"{decls[t][1]}{list(decls[t][0])}" for t in op.outputs if t in decls)
        labels[op.name] = f"{op.target}({', '.join(args)}) -> {outs}"
    for op in forward:
        for ref in ir.op_refs(op):
            t = tensors.get(ref.name)
            if t is not None and t.producer in names and t.producer != op.name:
                dag.add_edge(t.producer, op.name)
    return dag, value_bytes, labels
