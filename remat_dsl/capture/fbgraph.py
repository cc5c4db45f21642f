"""Build the plan's FB-graph (`ir.Graph`) from captured FX graphs and their profile.

Each FX node that allocates becomes an `ir.Op` whose outputs are `ir.TensorDecl`s; nodes
that only return views of their arguments (view, t, expand, _unsafe_view, detach, ...)
become `ir.Call` expressions that code generation inlines where they are used, so every
op owns its allocations and deleting a tensor frees its storage.

NOTE: [Stable names]
An op is named after the module that ran it (`nn_module_stack` on forward nodes,
`fwd_nn_module_stack` on backward ones): a module with a single forward op gives it its
path (`transformer.h.0.ln_1`); otherwise `PATH.KIND` with `_1`, `_2` ... for repeats of
one kind inside that module, and backward ops are `PATH.bwd.KIND`.  Counters are local to
a module, so a change elsewhere in the model does not rename anything here.
"""

from __future__ import annotations

import operator
import re
from collections import Counter
from typing import Any

import torch
import torch.fx as fx
import torch.utils._pytree as pytree

from remat_dsl.plan import ir
from remat_dsl.capture.fx import Captured
from remat_dsl.capture.model_file import Inputs
from remat_dsl.plan.errors import RematError
from remat_dsl.plan.operators import SCALAR_READ, is_view
from remat_dsl.capture.profile import NodeProfile, StepProfile, dtype_name, is_call


# NOTE: [CUDA blocks]
# PyTorch's CUDA caching allocator hands out blocks of a multiple of 512 bytes, at least
# 512 (`round_size` and kMinBlockSize in c10/cuda/CUDACachingAllocator.cpp), and
# `torch.cuda.max_memory_allocated` counts those blocks.  So in a CUDA plan each
# allocation's bytes are its block's: the simulated peak is what that counter reports.
# Not modelled: a cached block reused for a request up to 1 MiB smaller (the allocator
# does not split it) counts whole; that depends on the allocator's history, not the plan.
CUDA_BLOCK = 512


def cuda_block_bytes(nbytes: int) -> int:
    """Bytes of the CUDA caching allocator's block for an allocation of `nbytes` (NOTE:
    [CUDA blocks]); 0 stays 0 (nothing is allocated)."""
    return -(-nbytes // CUDA_BLOCK) * CUDA_BLOCK


def build_graph(
    captured: Captured, step: StepProfile, inputs: Inputs, device_kinds: dict[str, str] | None = None
) -> ir.Graph:
    """The FB-graph of one training step, with the profile's times and exact sizes.

    device_kinds: device kinds to rename in `torch.device(...)` arguments: the kind the
    model was captured on -> the kind the plan is for (`{"cpu": "cuda"}` for a plan made
    on this CPU for a GPU).
    """
    _drop_dead_backward_nodes(captured.backward)
    names = op_names(captured, step)
    builder = _Builder(names, device_kinds or {}, captured.averages)
    fw_env = builder.walk(captured.forward, step.forward, ir.FORWARD, _primal_refs(captured))
    bw_refs = _backward_refs(captured, fw_env)
    bw_env = builder.walk(captured.backward, step.backward, ir.BACKWARD, bw_refs)
    fw_returned = captured.forward.graph.output_node().args[0]
    bw_returned = captured.backward.graph.output_node().args[0]
    # fx: the output node's one argument holds the returned values
    assert isinstance(fw_returned, (tuple, list)) and isinstance(bw_returned, (tuple, list))
    fw_out, bw_out = list(fw_returned), list(bw_returned)
    first = len(captured.mutated)
    model_outputs = [builder.arg(n, fw_env) for n in fw_out[first : first + captured.num_outputs]]
    graph = ir.Graph(
        inputs=_values(captured, "input"),
        parameters=_values(captured, "parameter"),
        buffers=_values(captured, "buffer"),
        tangents=_tangents(captured),
        tensors=tuple(builder.tensors),
        ops=tuple(builder.ops),
        outputs=output_structure(captured.out_spec, _leaves(model_outputs, captured.none_leaves, captured.leaves)),
        gradients=_gradients(captured, bw_out, bw_env),
        updates=_updates(captured, fw_out[:first], fw_env),
        constants=tuple(
            ir.ConstantInput(name, value, DEFAULTED if name in captured.defaulted else ())
            for name, value in captured.constants
        ),
    )
    return ir.with_gradient_zeros(graph)  # NOTE: [Gradient zeros]


# NOTE: [Gradient zeros]
# A model output's gradient (tangent, `grad_output.k`) is the caller's memory, like an
# input: no plan holds it (NOTE: [Memory model] in remat_dsl.check.replay).  When the
# caller gives none (a Hugging Face causal LM returns its logits beside the loss, and
# `loss.backward()` differentiates the loss alone), the generated module makes the zeros
# autograd would have used at each op that reads it, and frees them after that op (NOTE:
# [Absent output gradients] in remat_dsl/codegen/runtime.py); a sum with the other operand in
# its layout makes none.  So where a step has two or more outputs to differentiate, every
# op that reads a tangent counts the tangent's bytes among its temporaries
# (`ir.with_gradient_zeros`), once per tangent, whatever the caller does, so the module
# holds no more than the plan predicts; a step with one gets its gradient whenever its
# backward runs.  Counted instead from the backward's start to its end, the zeros would be
# held that long, and a language model's logits gradient is a large share of its
# autograd peak (docs/measured-notes.md).  A profile
# file keeps the measured temporaries alone (`write_profile` takes the zeros out,
# `apply_profile` puts them back).


# The comment above a constant that capture filled in (NOTE: [Stock models] in fx.py).
DEFAULTED = (
    "left out by sample_inputs(): a training step keeps no key/value cache, so the plan is of",
    "model(..., use_cache=False), as Hugging Face's gradient checkpointing runs it (with a cache,",
    "a hybrid Mamba model such as Bamba computes gradients differing in the last bits)",
)


# --- naming -----------------------------------------------------------------


def module_path(node: fx.Node) -> str:
    """`L['self'].transformer.h.0.ln_1` -> `transformer.h.0.ln_1`, and
    `L['self'].__dict__['_modules']['base_model'].model` -> `base_model.model` ('' for the root)."""
    stack = node.meta.get("nn_module_stack") or node.meta.get("fwd_nn_module_stack") or {}
    if not stack:
        return ""
    raw = list(stack.values())[-1][0]
    raw = re.sub(r"^L\['[^']*'\]", "", raw)
    # a module reached through `__dict__` (peft's wrappers forward attributes that way)
    raw = re.sub(r"\.(?:__dict__\['_modules'\]|_modules)\['([^']*)'\]", r".\1", raw)
    raw = re.sub(r"\['([^']*)'\]|\[(\d+)\]", lambda m: "." + (m.group(1) or m.group(2)), raw)
    return ir.plan_name(raw.strip("."))


def _inherited_path(node: fx.Node, memo: dict) -> str:
    """The node's module path; for nodes outside any module (sums of gradient
    contributions) the path of an argument made inside a module, else inherited."""
    if node not in memo:
        inputs = node.all_input_nodes
        memo[node] = (
            module_path(node)
            or next((p for p in map(module_path, inputs) if p), "")
            or next((p for p in (_inherited_path(a, memo) for a in inputs) if p), "")
        )
    return memo[node]


def _kind(node: fx.Node) -> str:
    target = node.target
    packet = getattr(target, "_overloadpacket", None)
    return packet.__name__ if packet is not None else getattr(target, "__name__", "op")


def _allocates(info: NodeProfile) -> bool:
    return any(o is not None and not o.alias for o in info.outputs)


def op_names(captured: Captured, step: StepProfile) -> dict[fx.Node, str]:
    names: dict[fx.Node, str] = {}
    for phase, profiles in ((ir.FORWARD, step.forward), (ir.BACKWARD, step.backward)):
        nodes = [n for n, info in profiles.items() if _allocates(info)]
        memo: dict[fx.Node, str] = {} if phase == ir.BACKWARD else {n: module_path(n) for n in nodes}
        per_path = Counter(_inherited_path(n, memo) for n in nodes)
        seen: Counter = Counter()
        for node in nodes:
            path, kind = _inherited_path(node, memo), _kind(node)
            if phase == ir.FORWARD and path and per_path[path] == 1:
                names[node] = path
                continue
            stem = ".".join(p for p in (path, "bwd" if phase == ir.BACKWARD else "", kind) if p)
            count = seen[stem]
            seen[stem] += 1
            names[node] = stem if count == 0 else f"{stem}_{count}"
    return _deduplicate(names)


def _deduplicate(names: dict[fx.Node, str]) -> dict[fx.Node, str]:
    used: Counter = Counter()
    result = {}
    for node, name in names.items():
        unique = name if used[name] == 0 else f"{name}.{used[name]}"
        used[name] += 1
        result[node] = unique
    return result


# --- graph walking ----------------------------------------------------------


class _Builder:
    """Turns FX nodes into ops, tensors and argument expressions."""

    def __init__(self, names: dict[fx.Node, str], device_kinds: dict[str, str], averages: dict[str, tuple[int, str]]):
        self.device_kinds = device_kinds
        self.names = names
        self.averages = averages  # NOTE: [Cumulative averages] in capture/stateful.py
        self.ops: list[ir.Op] = []
        self.tensors: list[ir.TensorDecl] = []

    def walk(self, gm: fx.GraphModule, profiles: dict, phase: str, refs: dict[str, ir.Arg]) -> dict[str, Any]:
        env: dict[str, Any] = dict(refs)  # an ir.Arg per node, or the list of a multi-output call's
        for node in gm.graph.nodes:
            if node.op != "call_function":
                continue
            if node.target is operator.getitem:
                env[node.name] = env[node.args[0].name][node.args[1]]
            elif is_call(node):
                env[node.name] = self._call(node, profiles[node], phase, env)
        return env

    def _call(self, node: fx.Node, info: NodeProfile, phase: str, env) -> object:
        args = tuple(self.arg(a, env) for a in node.args)
        if phase == ir.FORWARD and node.name in self.averages:  # NOTE: [Cumulative averages] in capture/stateful.py
            position, factor = self.averages[node.name]
            read = ir.Call(SCALAR_READ, (env[factor],))
            args = (*args[:position], read, *args[position + 1 :])
        kwargs = tuple((k, self.arg(v, env)) for k, v in node.kwargs.items())
        target = str(node.target)
        if not _allocates(info):
            if not is_view(node.target):  # the verifier would refuse it inline: say so now, not after the solve
                raise RematError(
                    f"error: operation {target} returns views of its inputs, but its schema does not say so and "
                    "remat-dsl does not know it as a view (remat_dsl/plan/operators.py, VIEW_EXTRA), so it cannot "
                    "write it inside another operation's arguments",
                    hint="run the model with another operation there, or report the operator to remat-dsl",
                )
            call = ir.Call(target, args, kwargs)
            if not info.multi:
                return call
            return [ir.Call("operator.getitem", (call, i)) for i in range(len(info.outputs))]
        if any(o is not None and o.alias for o in info.outputs):
            raise RematError(
                f"error: operation {target} returns both new tensors and views of its inputs, which remat-dsl cannot"
                " schedule"
            )
        name = self.names[node]
        outputs: list[ir.Ref | None] = []
        for index, out in enumerate(info.outputs):
            if out is None:
                outputs.append(None)
                continue
            tensor = name if index == 0 else f"{name}:{index}"
            nbytes = cuda_block_bytes(out.nbytes) if "cuda" in self.device_kinds.values() else out.nbytes
            self.tensors.append(ir.TensorDecl(tensor, out.shape, out.dtype, nbytes, name, index))
            outputs.append(ir.Ref(tensor))
        self.ops.append(
            ir.Op(
                name=name,
                phase=phase,
                target=target,
                args=args,
                kwargs=kwargs,
                outputs=tuple(r.name for r in outputs if r is not None),
                time_us=info.time_us,
                temp_bytes=info.temp_bytes,
                random=info.random,
            )
        )
        return outputs if info.multi else outputs[0]

    def arg(self, value, env) -> ir.Arg:
        if isinstance(value, fx.Node):
            return env[value.name]
        if isinstance(value, (list, tuple)):
            return ir.ListArg(tuple(self.arg(v, env) for v in value))
        if isinstance(value, torch.device) and value.type in self.device_kinds:
            return constant(torch.device(self.device_kinds[value.type]))
        return constant(value)


def constant(value) -> ir.Arg:
    """A Python/torch constant of an FX argument as an IR argument."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, torch.dtype):
        return ir.Sym(str(value))
    if isinstance(value, (torch.layout, torch.memory_format)):
        return ir.Sym(str(value))
    if isinstance(value, torch.device):
        return ir.Call("torch.device", (value.type,))  # the kind: a plan runs on any device of it
    raise RematError(f"error: an operation argument of type {type(value).__name__} ({value!r}) is not supported")


def _drop_dead_backward_nodes(gm: fx.GraphModule) -> None:
    """Remove unused backward nodes (the default partition leaves dead dropout copies)."""
    for node in reversed(list(gm.graph.nodes)):
        if node.op == "call_function" and not node.users:
            gm.graph.erase_node(node)


def _primal_refs(captured: Captured) -> dict[str, ir.Arg]:
    placeholders = [n for n in captured.forward.graph.nodes if n.op == "placeholder"]
    return {node.name: ir.Ref(name) for node, (_, name) in zip(placeholders, captured.primal_names)}


def _backward_refs(captured: Captured, fw_env: dict[str, Any]) -> dict[str, ir.Arg]:
    refs: dict[str, ir.Arg] = {}
    tangent = 0
    for node in captured.backward.graph.nodes:
        if node.op != "placeholder":
            continue
        if node.name.startswith("tangents_"):
            refs[node.name] = ir.Ref(f"grad_output.{captured.tangent_of[tangent]}")
            tangent += 1
        else:
            refs[node.name] = fw_env[node.name]
    return refs


def _values(captured: Captured, kind: str) -> tuple[ir.ValueDecl, ...]:
    return tuple(
        ir.ValueDecl(kind, name, tuple(t.shape), dtype_name(t.dtype))
        for (k, name), t in zip(captured.primal_names, captured.example_primals)
        if k == kind
    )


def _tangents(captured: Captured) -> tuple[ir.ValueDecl, ...]:
    nodes = [n for n in captured.backward.graph.nodes if n.op == "placeholder" and n.name.startswith("tangents_")]
    return tuple(
        ir.ValueDecl("tangent", f"grad_output.{index}", tuple(n.meta["val"].shape), dtype_name(n.meta["val"].dtype))
        for n, index in zip(nodes, captured.tangent_of)
    )


def _leaves(tensors: list, none_leaves: list[bool], leaves: list[int]):
    """The output leaves in pytree order: the graph's outputs (`leaves`: which one each
    tensor leaf is, NOTE: [Output order] in fx.py), with None where the model returned None."""
    in_order = iter([tensors[k] for k in leaves])
    for none in none_leaves:
        yield None if none else next(in_order)


def output_structure(spec: pytree.TreeSpec, leaves) -> ir.Arg:
    """The plan's `outputs` value for an output pytree (NOTE: [Stock models] in fx.py):
    tuples and lists as themselves, a dict as `dict(key=...)`, a named tuple, dataclass or
    Hugging Face `ModelOutput` as `module.Class(field=...)`; `leaves` gives the values of
    the tensor leaves in pytree order.  Raises RematError for structures the generated
    module could not rebuild (keys that are not identifiers, classes defined in a function)."""
    if spec.is_leaf():
        return next(leaves)
    children = [output_structure(child, leaves) for child in spec.children()]
    kind = spec.type
    if kind is tuple:
        return ir.TupleArg(tuple(children))
    if kind is list:
        return ir.ListArg(tuple(children))
    if kind is dict:
        keys = list(spec.context)
        target = "dict"
    elif isinstance(spec.context, type) and hasattr(spec.context, "_fields"):  # namedtuple
        keys, target = list(spec.context._fields), _class_path(spec.context)
    elif isinstance(spec.context, (list, tuple)) and all(
        isinstance(k, str) for k in spec.context
    ):  # ModelOutput, dataclasses
        keys, target = list(spec.context), _class_path(kind)
    else:
        raise RematError(
            f"error: the model's forward returns a {kind.__name__}, which remat-dsl cannot rebuild",
            hint="return a tuple, list, dict or dataclass of tensors",
        )
    bad = next((k for k in keys if not (isinstance(k, str) and k.isidentifier())), None)
    if bad is not None:
        raise RematError(
            f"error: the model's output has the key {bad!r}; output keys must be identifiers",
            hint="return a dict with identifier keys, or a tuple",
        )
    return ir.Call(target, (), tuple(zip(keys, children, strict=True)))


def _class_path(kind: type) -> str:
    path = f"{kind.__module__}.{kind.__qualname__}"
    if "<" in path or kind.__module__ == "__main__":
        raise RematError(
            f"error: the model's output type {kind.__qualname__} is defined where the generated module cannot import it"
            f" ({kind.__module__})",
            hint="define the output class at the top level of an importable module, or return a tuple or dict",
        )
    return path


def _gradients(captured: Captured, bw_out: list, bw_env) -> tuple[ir.Gradient, ...]:
    """One line per trainable parameter (NOTE: [Frozen and unused parameters] in
    remat_dsl.plan.ir): its gradient, or None where the loss does not reach it."""
    grads = []
    for (kind, name), node, primal in zip(captured.primal_names, bw_out, captured.example_primals):
        if kind == "parameter" and primal.requires_grad:
            grads.append(ir.Gradient(name, None if node is None else bw_env[node.name]))
    return tuple(grads)


def _updates(captured: Captured, update_nodes: list, fw_env) -> tuple[ir.BufferUpdate, ...]:
    updates = []
    for index, node in zip(captured.mutated, update_nodes):
        kind, name = captured.primal_names[index]
        value = fw_env[node.name]
        if kind != "buffer" or not isinstance(value, ir.Ref):
            raise RematError(f"error: the model updates {kind} '{name}' in place in a way remat-dsl cannot replay")
        updates.append(ir.BufferUpdate(name, value.name))
    return tuple(updates)
