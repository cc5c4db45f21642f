"""RK-Checkmate: the ILP of thesis section 2.4 (eq. 2.3-2.19) on a set of operations.

`op_hgraph` turns the ops of a graph, or of one block of it, into the H-ILP's graph with
one option per op and no phantoms (remat_dsl.solve.ilp.hilp: H-ILP with single-option
nodes is RK-Checkmate; our FB-graph has explicit saved tensors, so there are no phantoms
and no fast-forward option to choose, see thesis section 2.3 "FB-Graph").

Values made outside the ops given (block inputs, skip tensors, parameters) are always
available and not counted: the chain or the caller counts them.
"""

from __future__ import annotations

from remat_dsl.plan import ir
from remat_dsl.solve.lowering import op_uses, pinned_tensors
from remat_dsl.solve.ilp.hilp import CNode, HGraph, Option, Value


def op_hgraph(graph: ir.Graph, forward: tuple[str, ...], backward: tuple[str, ...]) -> HGraph:
    """The FB-graph of `forward` + `backward` ops (names, each in graph order) as an HGraph.

    A value read by an op outside this set must be alive at the forward/backward boundary
    when a forward op made it, and kept to the end when a backward op made it; model
    outputs and parameter gradients are kept to the end.
    """
    ops = {op.name: op for op in graph.ops}
    names = list(forward) + list(backward)
    inside = set(names)
    tensors = {t.name: t for t in graph.tensors}
    index = {t: i for i, t in enumerate(t for n in names for t in ops[n].outputs)}
    read_outside: set[str] = set()
    for op in graph.ops:
        if op.name not in inside:
            read_outside.update(t for t in op_uses(op, set(index)))
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
        reads = tuple(index[t] for t in op_uses(op, set(index)))
        option = Option(op.time_us, op.temp_bytes, 0, (name,))
        nodes.append(CNode(name, k >= len(forward), (option,), reads))
    return HGraph(tuple(nodes), tuple(values))
