"""HiRemate: a hierarchy of clusters solved bottom-up, H-ILP at every level.

Zhao, PhD thesis "Optimizing Memory Usage when Training Deep Neural Networks" (2024),
chapter 3, and Gusak et al., "HiRemate" (preprint, 2023): the graph is partitioned into a
hierarchy of small clusters (section 3.3); each cluster is solved on a grid of budgets,
its children being nodes with options (H-ILP, section 3.4, eq. 3.4-3.34, in
remat_dsl.solve.solvers.ilp.hilp); the schedules found become the cluster's own options one level
up (section 3.4.5), and the root is solved at the user's budget.  Identical clusters are
solved once (section 3.3.5).

NOTE: [Hierarchy]
Level 0 are operations.  Level 1 are Rockmate's blocks (remat_dsl.solve.solvers.chain.partition,
`partition(refine=1, strict=False)`): intervals of the forward order cut at separators
(skip tensors may cross them), solved by RK-Checkmate on the budget grid
(remat_dsl.solve.solvers.ilp.rockmate, identical blocks once).  Above, H-Partition (Algorithm 7,
remat_dsl.solve.solvers.ilp.hpartition) runs on the quotient DAG of blocks (an edge where a block reads a
tensor another made; eq. 3.1 scores groups by the bytes crossing them) and gives a tree
of convex groups of at most `max_children` blocks (HiremateConfig); a convex set of blocks of this DAG is
an interval of the forward order, so each group's backward is its blocks' backwards in
reverse order, as the FB-graph requires.  Every value that crosses children is an aNode
of the parent's H-ILP, with its real liveness: skip tensors of encoder-decoders and
U-Nets are planned, not ignored as in a chain model.

NOTE: [Options of a cluster]
An option of a child is one backward sequence (recomputations and backward ops); its
forward is always the child's forward ops.  Its H-ILP costs come from an exact replay of
the child's ops under the lowering's liveness rule (remat_dsl.solve.solvers.ilp.rockmate.replay):
the phantom p_{j,o} is what the option keeps beyond the child's outputs, the overheads
are the peaks above the state after the node.  Each child also has the phantom-free
fast-forward.  The correction terms of section 3.4.4.1 are not added: the overheads are
measured with the child's inputs kept to its end, which bounds the corrected value from
above; the exact simulation of the lowered plan decides feasibility.
"""

from __future__ import annotations

import hashlib
import time
from dataclasses import dataclass

import networkx as nx

from remat_dsl.plan import ir
from remat_dsl.plan.ir import op_uses, pinned_tensors
from remat_dsl.solve.api import Problem, Solver, SolverInfo, SolverResult, fallbacks, floor_targets, say_phase, setting
from remat_dsl.solve.solvers.chain.partition import ChainPartition, is_small_chain, partition
from remat_dsl.solve.solvers.ilp import milp
from remat_dsl.solve.solvers.ilp.checkmate import op_hgraph
from remat_dsl.solve.solvers.ilp.hilp import HILP, CNode, HGraph, Option, TargetSolver, Value, ops_of
from remat_dsl.solve.solvers.ilp.hpartition import HCluster, h_partition
from remat_dsl.solve.solvers.ilp.rockmate import (
    Rockmate,
    RockmateChain,
    RockmateConfig,
    grid,
    pareto_schedules,
    per_ilp_limit,
    replay,
    rockmate_chain,
)

@dataclass(frozen=True)
class HiremateConfig(RockmateConfig):
    """HiRemate's hierarchy (H-Partition) on top of Rockmate's settings, which its blocks' and
    clusters' grid and the RK-Rotor of a chain root take as they are."""

    max_children: int = setting(12, "children per cluster above the blocks (M^l = M^t of Algorithm 7)")
    alpha: float = setting(0.5, "score exponent of H-Partition's eq. 3.1 (the default of the HiRemate paper, 3.1)")
    stuck_ratio: float = setting(0.75, "an H-Partition level that keeps more than this share of its units is stuck")


@dataclass(frozen=True)
class Child:
    """A node of a level: its forward ops, backward ops (graph order) and options, each a
    backward op sequence (option 0: its store-all backward)."""

    forward: tuple[str, ...]
    backward: tuple[str, ...]
    options: tuple[tuple[str, ...], ...]
    key: str  # equal for identical children


class Hierarchy:
    """HiRemate's clusters for one graph, solved bottom-up once: `top` is the root level's
    H-ILP graph and `model` its H-ILP, `results` every MILP solve made on the way."""

    def __init__(self, graph: ir.Graph, part: ChainPartition, rc: RockmateChain, time_limit: float | None = None,
                 config: HiremateConfig = HiremateConfig()):  # fmt: skip
        self.graph, self.part, self.time_limit, self.config = graph, part, time_limit, config
        self.results: list[milp.MilpResult] = list(rc.results)
        self._solved: dict[str, list[tuple[int, ...]]] = {}  # key -> option sequences, by position
        blocks = [
            Child(b.forward, b.backward, rc.options[l].backward, _digest(repr(rc_key)))
            for l, (b, rc_key) in enumerate(zip(part.blocks, rc.keys))
        ]
        tree = _group_blocks(graph, part, config)
        children = [self._child(node, blocks) for node in tree.children]
        self.levels = 2 + _depth(tree)
        self.clusters = len(blocks)
        self.top = _level_graph(graph, [(name,) for name in part.prelude], children)
        self.model = HILP(self.top)

    def _child(self, node, blocks: list[Child]) -> Child:
        if isinstance(node, str):
            return blocks[int(node)]
        kids = [self._child(c, blocks) for c in node.children]
        forward = tuple(n for k in kids for n in k.forward)
        backward = tuple(n for k in reversed(kids) for n in k.backward)
        key = _digest(node.key + "|" + "|".join(k.key for k in kids))
        if key not in self._solved:
            self._solved[key] = self._cluster_options(kids, forward, backward)
        first = self._solved[key]
        names = forward + backward
        options = tuple(tuple(names[i] for i in seq) for seq in first)
        return Child(forward, backward, (backward, *options), key)

    def _cluster_options(self, kids: list[Child], forward, backward) -> list[tuple[int, ...]]:
        """Backward schedules of a cluster over the grid (positions into forward+backward)."""
        hg = _level_graph(self.graph, [], kids)
        model = HILP(hg)
        ops_hg = op_hgraph(self.graph, forward, backward)
        position = {n.name: i for i, n in enumerate(ops_hg.nodes)}
        store_all = tuple(range(ops_hg.boundary, len(ops_hg.nodes)))
        found: list[tuple[int, ...]] = [store_all]
        steps = self.config.peak_steps, self.config.save_steps
        for peak, save in grid(ops_hg, replay(ops_hg, store_all), *steps):
            schedule = model.solve(peak, save, self.time_limit)
            self.results.append(model.last_result)
            if schedule is None:
                continue
            seq = tuple(position[n] for n in ops_of(hg, schedule.steps[schedule.boundary_step :]))
            if seq not in found:
                found.append(seq)
        return pareto_schedules(ops_hg, found, self.config.max_options)[1:]



class Hiremate(Solver):
    """`--solver hiremate`: HiRemate's hierarchy (NOTE: [Hierarchy]), the root solved at the
    target by H-ILP (`TargetSolver`).

    NOTE: [H-Solver on chains] HiRemate "includes not only H-ILP, but also other solvers,
    including CHECKMATE and ROTOR, to provide solutions when the target graph has a
    desirable structure" (thesis, chapter 1 and section 3.2.2).  When the clusters above
    the blocks form a chain (`is_small_chain`), the root level is solved by RK-Rotor,
    exact for persistent schedules of a chain, over the blocks' RK-Checkmate options: the
    same plan as rockmate (remat_dsl.solve.solvers.ilp.rockmate, with its fallback)."""

    name = "hiremate"
    auto_rank = 3
    optimizes = True
    Config = HiremateConfig

    def __init__(self, problem: Problem, config: HiremateConfig | None = None):
        self.config = config or HiremateConfig()
        if is_small_chain(problem.graph):
            self.inner: Rockmate | _Root = Rockmate(
                problem, label="levels=2 root=rk-rotor", name=self.name, config=self.config
            )
        else:
            self.inner = _Root(problem, self.config)

    @classmethod
    def fits(cls, problem: Problem) -> bool:
        return True  # any graph

    @property
    def info(self) -> SolverInfo:  # type: ignore[override]  # read-only: the driver only reads it
        return self.inner.info

    def describe(self) -> str:
        return self.inner.describe()

    def solve(self, target: int) -> SolverResult:
        return self.inner.solve(target)

    def floor(self) -> int:
        return self.inner.floor()

    def floor_targets(self) -> list[int]:
        return floor_targets(self.inner)

    def fallbacks(self):
        return fallbacks(self.inner)


class _Root(TargetSolver):
    """The hierarchy built bottom-up (NOTE: [Hierarchy]); its root H-ILP solved at the target."""

    def __init__(self, problem: Problem, config: HiremateConfig):
        start = time.perf_counter()
        graph = problem.graph
        say_phase(problem.report, "partitioning the graph into blocks")
        part = partition(graph, config.max_blocks, 1, False, config.min_block_ops)
        rc = rockmate_chain(
            graph,
            part,
            per_ilp_limit(problem.time_limit, len(part.blocks), config.peak_steps * config.save_steps),
            problem.report,
            problem.cache,
            problem.jobs,
            config,
        )
        if problem.report:
            problem.report(f"solving the clusters above the {len(part.blocks)} blocks (H-ILP per cluster class)")
        say_phase(problem.report, "solving the clusters' H-ILPs")
        h = Hierarchy(graph, part, rc, problem.time_limit, config)
        super().__init__(problem, h.model, lambda schedule: ops_of(h.top, schedule.steps), "hiremate")
        self.results = list(h.results)
        self.seconds = time.perf_counter() - start
        self.settings = (
            f"levels={h.levels} blocks={h.clusters} classes={rc.classes} ilps={len(h.results)}"
            f" top-nodes={len(h.top.nodes)}"
        )

    def describe(self) -> str:
        return self.settings


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _depth(cluster: HCluster) -> int:
    return 1 + max((_depth(c) for c in cluster.children if not isinstance(c, str)), default=0)


def _group_blocks(graph: ir.Graph, part: ChainPartition, config: HiremateConfig) -> HCluster:
    """H-Partition (Algorithm 7) of the quotient DAG of blocks, with `config`'s max_children,
    alpha and stuck_ratio; leaves are block indices as strings.  NOTE: [Hierarchy]."""
    ops = graph.op_by_name
    block_of = {name: l for l, b in enumerate(part.blocks) for name in b.forward}
    made_in = {t: block_of[n] for n in block_of for t in ops[n].outputs}
    tensors = graph.tensor_by_name
    dag = nx.DiGraph()
    dag.add_nodes_from(str(l) for l in range(len(part.blocks)))
    out_bytes = {str(l): 0 for l in range(len(part.blocks))}
    for name, l in block_of.items():
        for t in op_uses(ops[name], set(made_in)):
            if made_in[t] != l:
                dag.add_edge(str(made_in[t]), str(l))
                out_bytes[str(made_in[t])] += tensors[t].nbytes
    labels = {str(l): str(len(b.forward)) + "/" + str(len(b.backward)) for l, b in enumerate(part.blocks)}
    if len(part.blocks) <= config.max_children:
        return HCluster(tuple(str(l) for l in range(len(part.blocks))), "root")
    return h_partition(dag, out_bytes, labels, config.max_children, config.alpha, config.stuck_ratio)


def _level_graph(graph: ir.Graph, singles: list[tuple[str, ...]], children: list[Child]) -> HGraph:
    """H-ILP graph of one level: single ops (the prelude, at the root) then the children's
    forward nodes, then their backward nodes in reverse order; aNodes are the tensors read
    outside the node that made them (NOTE: [Options of a cluster])."""
    ops = graph.op_by_name
    tensors = graph.tensor_by_name
    S, C = len(singles), len(children)
    groups = list(singles) + [c.forward for c in children] + [c.backward for c in reversed(children)]
    owner = {name: k for k, group in enumerate(groups) for name in group}
    made_by = {t: owner[n] for n in owner for t in ops[n].outputs}
    inside = set(made_by)
    pinned = pinned_tensors(graph)
    crossing: set[str] = {t for t in pinned if t in made_by}
    own_backward = {S + j: S + 2 * C - 1 - j for j in range(C)}  # a child's forward group -> its backward's
    reads: dict[int, list[str]] = {k: [] for k in range(len(groups))}
    outside_readers: set[str] = set()
    for op in graph.ops:  # NOTE: [Saved tensors are phantoms]
        for t in op_uses(op, inside):
            if op.name not in owner:
                outside_readers.add(t)
            elif made_by[t] != owner[op.name] and own_backward.get(made_by[t]) != owner[op.name]:
                crossing.add(t)
    crossing |= outside_readers
    for op in graph.ops:
        for t in op_uses(op, crossing):
            if op.name in owner and made_by[t] != owner[op.name] and t not in reads[owner[op.name]]:
                reads[owner[op.name]].append(t)
    order = [t for op in graph.ops if op.name in owner for t in op.outputs if t in crossing]
    index = {t: d for d, t in enumerate(order)}
    first_backward = S + C
    values = tuple(
        Value(
            t,
            tensors[t].nbytes,
            made_by[t],
            keep_at_boundary=t in outside_readers and made_by[t] < first_backward,
            keep_at_end=t in pinned or (t in outside_readers and made_by[t] >= first_backward),
        )
        for t in order
    )
    nodes = [
        CNode(
            name,
            False,
            (Option(ops[name].time_us, ops[name].temp_bytes, 0, (name,)),),
            tuple(index[t] for t in reads[k]),
        )
        for k, (name,) in enumerate(singles)
    ]
    costs = [_option_costs(graph, c) for c in children]
    for j, child in enumerate(children):
        k = S + j
        out = sum(v.size for v in values if v.producer == k)
        options = [
            Option(fwd_us, max(0, fwd_peak - xbar), max(0, xbar - out), child.forward)
            for xbar, fwd_peak, fwd_us, _, _ in costs[j][1:]
        ]
        xbar, fwd_peak, fwd_us, _, _ = costs[j][0]
        options.append(Option(fwd_us, max(0, fwd_peak - out), 0, child.forward))  # fast-forward
        nodes.append(CNode(f"F:{j}", False, tuple(options), tuple(index[t] for t in reads[k]), pair=S + 2 * C - 1 - j))
    for i, child in enumerate(reversed(children)):
        j = C - 1 - i
        k = S + C + i
        made = sum(v.size for v in values if v.producer == k)
        bwd_options = tuple(
            Option(bwd_us, max(0, bwd_peak - xbar - made), 0, seq)
            for (xbar, _, _, bwd_us, bwd_peak), seq in zip(costs[j][1:], child.options)
        )
        nodes.append(CNode(f"B:{j}", True, bwd_options, tuple(index[t] for t in reads[k]), pair=S + j))
    return HGraph(tuple(nodes), values)


# NOTE: [Saved tensors are phantoms]
# A tensor a child's forward makes and only that child's backward reads is what the child
# saves for its backward: in the H-ILP it is part of the phantom p_{j,o} of the option the
# child runs (eq. 3.5, 3.16-3.19), the bytes the option keeps beyond the child's outputs.
# So only tensors read by another child (or by ops outside the level, or pinned) are
# aNodes; a saved tensor that another child also reads stays one, and its own backward
# reads it as an aNode too.  Were a child's own saved tensors aNodes, their bytes would
# count as outputs, every phantom would be 0, and the H-ILP could free a saved tensor only
# by running the child's whole forward again: the options' memory savings would be out of
# its reach (docs/measured-notes.md).


def _option_costs(graph: ir.Graph, child: Child) -> list[tuple[int, int, int, int, int]]:
    """[(xbar, fwd_peak, fwd_us, bwd_us, bwd_peak)] for fast-forward, then each option."""
    hg = op_hgraph(graph, child.forward, child.backward)
    position = {n.name: i for i, n in enumerate(hg.nodes)}
    fwd_us = sum(n.options[0].time_us for n in hg.nodes[: hg.boundary])
    result = []
    for seq in ((), *child.options):
        r = replay(hg, tuple(position[n] for n in seq))
        result.append((r.xbar, r.fwd_peak, fwd_us, r.bwd_us, r.bwd_peak))
    return result
