"""RK-Checkmate: the ILP of thesis section 2.4 (eq. 2.3-2.19) on a set of operations.

`op_hgraph` turns the ops of a graph, or of one block of it, into the H-ILP's graph with
one option per op and no phantoms (remat_dsl.solve.solvers.ilp.hilp: H-ILP with single-option
nodes is RK-Checkmate; our FB-graph has explicit saved tensors, so there are no phantoms
and no fast-forward option to choose, see thesis section 2.3 "FB-Graph").

Values made outside the ops given (block inputs, skip tensors, parameters) are always
available and not counted: the chain or the caller counts them.
"""

from __future__ import annotations

import time

from remat_dsl.plan import ir
from remat_dsl.plan.ir import op_uses, pinned_tensors
from remat_dsl.solve.api import Problem, refuse_above
from remat_dsl.solve.solvers.ilp.hilp import HILP, CNode, HGraph, Option, TargetSolver, Value, ops_of


def op_hgraph(graph: ir.Graph, forward: tuple[str, ...], backward: tuple[str, ...]) -> HGraph:
    """The FB-graph of `forward` + `backward` ops (names, each in graph order) as an HGraph.

    A value read by an op outside this set must be alive at the forward/backward boundary
    when a forward op made it, and kept to the end when a backward op made it; model
    outputs and parameter gradients are kept to the end.
    """
    ops, tensors, readers = graph.op_by_name, graph.tensor_by_name, graph.readers  # NOTE: [Graph index]
    names = list(forward) + list(backward)
    inside = set(names)
    index = {t: i for i, t in enumerate(t for n in names for t in ops[n].outputs)}
    made = set(index)
    read_outside = {t for t in made if not readers.get(t, set()) <= inside}
    pinned = pinned_tensors(graph)
    values = []
    for k, name in enumerate(names):
        for t in ops[name].outputs:
            outside = t in read_outside
            backward_made = k >= len(forward)
            values.append(
                Value(
                    t,
                    tensors[t].nbytes,
                    k,
                    keep_at_boundary=outside and not backward_made,
                    keep_at_end=t in pinned or (outside and backward_made),
                )
            )
    nodes = []
    for k, name in enumerate(names):
        op = ops[name]
        reads = tuple(index[t] for t in op_uses(op, made))
        option = Option(op.time_us, op.temp_bytes, 0, (name,))
        nodes.append(CNode(name, k >= len(forward), (option,), reads))
    return HGraph(tuple(nodes), tuple(values))


class Checkmate(TargetSolver):
    """`--solver checkmate`: RK-Checkmate (thesis section 2.4, eq. 2.3-2.19) as one ILP over
    every op of the graph, solved at the target.  For small graphs: refused above MAX_OPS
    ops (RematError), chosen by `auto` up to AUTO_OPS."""

    name = "checkmate"
    auto_rank = 1
    MAX_OPS = 160
    AUTO_OPS = 60

    def __init__(self, problem: Problem):
        graph = problem.graph
        refuse_above(
            graph, self.MAX_OPS, self.name, "one ILP",
            hint="use --solver rockmate or --solver hiremate (or auto), which solve small pieces",
        )  # fmt: skip
        start = time.perf_counter()
        forward = tuple(op.name for op in graph.ops if op.phase == ir.FORWARD)
        backward = tuple(op.name for op in graph.ops if op.phase == ir.BACKWARD)
        hg = op_hgraph(graph, forward, backward)
        super().__init__(problem, HILP(hg), lambda schedule: ops_of(hg, schedule.steps), self.name)
        self.seconds = time.perf_counter() - start
        self.ops = len(graph.ops)

    @classmethod
    def fits(cls, problem: Problem) -> bool:
        return len(problem.graph.ops) <= cls.AUTO_OPS

    def describe(self) -> str:
        return f"ops={self.ops}"
