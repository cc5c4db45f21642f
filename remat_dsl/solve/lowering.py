"""The one lowering from solver decisions to plan instructions.

Every solver decides only the ORDER in which operations run: a list of op names, where
the first run of a forward op is a `compute` and any later run a `recompute`, split into
the forward section (everything before the first backward op) and the backward section.
`lower` turns that order into instructions by liveness: each tensor is deleted right after
its last use before it is next created (or the step ends), so memory is exactly what the
order needs and nothing is freed that is still used.  Model outputs and parameter
gradients are never deleted (the caller and autograd hold them).
"""

from __future__ import annotations

from collections import defaultdict

from remat_dsl.plan import ir


def refs_in(arg: ir.Arg) -> list[str]:
    """Names referred to (`%name`) anywhere inside an argument tree."""
    return [ref.name for ref in ir.iter_refs(arg)]


def op_uses(op: ir.Op, tensors: set[str]) -> list[str]:
    """Tensor names (allocations, not parameters/inputs) that `op` reads, in order, unique."""
    return list(dict.fromkeys(ref.name for ref in ir.op_refs(op) if ref.name in tensors))


def pinned_tensors(graph: ir.Graph) -> set[str]:
    """Tensors the plan may not delete: model outputs and parameter gradients."""
    names = set(refs_in(graph.outputs))
    for grad in graph.gradients:
        names.update(refs_in(grad.value))
    return names


def lower(graph: ir.Graph, order: list[str]) -> tuple[tuple[ir.Instruction, ...], tuple[ir.Instruction, ...]]:
    """Instructions for running ops in `order`, with deletes placed by liveness.

    order: op names; forward ops before the first backward op form the forward section.
    Returns (forward instructions, backward instructions).
    """
    ops = {op.name: op for op in graph.ops}
    tensor_names = {t.name for t in graph.tensors}
    pinned = pinned_tensors(graph)
    uses = [op_uses(ops[name], tensor_names) for name in order]
    deletes_after = _deletes(order, ops, uses, pinned)
    first_backward = next((i for i, n in enumerate(order) if ops[n].phase == ir.BACKWARD), len(order))
    sections: tuple[list, list] = ([], [])
    computed: set[str] = set()
    for step, name in enumerate(order):
        verb = "recompute" if name in computed else "compute"
        computed.add(name)
        section = sections[step >= first_backward]
        section.append(ir.Instruction(verb, name, ir.COMPUTE_STREAM))
        for tensor in deletes_after.get(step, ()):
            section.append(ir.Instruction("delete", tensor, ir.COMPUTE_STREAM))
    return tuple(sections[0]), tuple(sections[1])


def _deletes(order, ops, uses, pinned) -> dict[int, list[str]]:
    """step -> tensors to delete right after it (last use before the next creation)."""
    created_at: dict[str, int] = {}
    last_use: dict[str, int] = {}
    result: dict[int, list[str]] = defaultdict(list)

    def close(tensor: str) -> None:
        if tensor in created_at and tensor not in pinned:
            result[max(created_at[tensor], last_use.get(tensor, -1))].append(tensor)

    for step, name in enumerate(order):
        for tensor in uses[step]:
            last_use[tensor] = step
        for tensor in ops[name].outputs:
            if tensor in created_at:
                close(tensor)
            created_at[tensor] = step
            last_use.pop(tensor, None)
    for tensor in created_at:
        close(tensor)
    key = _declaration_order(ops)
    return {step: sorted(names, key=key) for step, names in result.items()}


def _declaration_order(ops):
    position = {t: i for i, t in enumerate(t for op in ops.values() for t in op.outputs)}
    return lambda name: position[name]
