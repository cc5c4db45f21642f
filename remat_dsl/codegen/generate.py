"""Render a verified plan as a standalone PyTorch module (Jinja2 template, black-formatted).

The module imports torch only.  Each instruction becomes one statement: `compute` and
`recompute` call the aten operator (views are inlined where they are used), `delete` is
`del`, `offload`/`prefetch`/`wait` call three small helpers whose CUDA path uses side
streams, events and pinned host buffers and whose CPU path copies synchronously.  Random
operations that the plan recomputes save the RNG state at their first run and replay it.
"""

from __future__ import annotations

import keyword
import math
import re

import black
import jinja2
import torch

from remat_dsl.plan import ir
from remat_dsl.plan.ir import refs_in
from remat_dsl.plan.resources import data_path
from remat_dsl.plan.units import format_bytes

TEMPLATES = data_path("templates")


def generate(plan: ir.Plan, source: str = "a plan") -> str:
    """Python source of the module that runs `plan` (assumed verified by `simulate`)."""
    names = _Namespace(plan.graph)
    ctx = _Renderer(plan, names).context()
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(TEMPLATES), keep_trailing_newline=True, autoescape=False)
    text = env.get_template("module.py.jinja").render(source=source, header=plan.header, **ctx)
    return black.format_str(text, mode=black.Mode(line_length=100))


class _Namespace:
    """Unique, readable Python identifiers for every value the plan names."""

    PREFIX = {"parameter": "param_", "buffer": "buf_", "input": "in_", "tangent": ""}

    def __init__(self, graph: ir.Graph):
        self.used: set[str] = {"ctx", "torch", "buffers", "outputs", "_r", "_state"}
        self.var: dict[str, str] = {}
        for group in (graph.inputs, graph.parameters, graph.buffers, graph.tangents):
            for value in group:
                self.var[value.name] = self._fresh(self.PREFIX[value.kind] + value.name)
        for tensor in graph.tensors:
            self.var[tensor.name] = self._fresh(tensor.name)

    def _fresh(self, name: str) -> str:
        base = re.sub(r"\W", "_", name)
        if base[0].isdigit() or keyword.iskeyword(base) or base.startswith("aten_"):
            base = "v_" + base
        candidate, k = base, 1
        while candidate in self.used:
            candidate, k = f"{base}_{k}", k + 1
        self.used.add(candidate)
        return candidate

    def host(self, tensor: str) -> str:
        return f"host_{self.var[tensor]}"

    def event(self, tensor: str) -> str:
        return f"event_{self.var[tensor]}"

    def rng(self, op: str) -> str:
        return "rng_" + re.sub(r"\W", "_", op)


def render_arg(arg: ir.Arg, var: dict[str, str]) -> str:
    """Python expression of an IR argument."""
    if isinstance(arg, ir.Ref):
        return var[arg.name]
    if isinstance(arg, ir.Sym):
        return arg.name
    if isinstance(arg, ir.Call):
        return _render_call(arg, var)
    if isinstance(arg, ir.ListArg):
        return "[" + ", ".join(render_arg(a, var) for a in arg.items) + "]"
    if isinstance(arg, ir.TupleArg):
        items = [render_arg(a, var) for a in arg.items]
        return "(" + ", ".join(items) + ("," if len(items) == 1 else "") + ")"
    if isinstance(arg, float) and not math.isfinite(arg):
        return f'float("{arg}")'
    return repr(arg)


def _render_call(call: ir.Call, var) -> str:
    args = [render_arg(a, var) for a in call.args] + [f"{k}={render_arg(v, var)}" for k, v in call.kwargs]
    if call.target == "operator.getitem":
        return f"{args[0]}[{args[1]}]"
    return f"{callable_name(call.target)}({', '.join(args)})"


def callable_name(target: str) -> str:
    """`aten.addmm.default` -> `aten_addmm_default`, bound once at the top of the module."""
    return target.replace(".", "_") if target.startswith("aten.") else target


def aten_targets(plan: ir.Plan) -> list[str]:
    """Every aten operator the module calls (ops and inlined views), sorted."""
    found: set[str] = set()

    def walk(arg) -> None:
        if isinstance(arg, ir.Call):
            found.add(arg.target)
            for a in (*arg.args, *(v for _, v in arg.kwargs)):
                walk(a)
        elif isinstance(arg, (ir.ListArg, ir.TupleArg)):
            for a in arg.items:
                walk(a)

    for op in plan.graph.ops:
        found.add(op.target)
        for a in (*op.args, *(v for _, v in op.kwargs)):
            walk(a)
    walk(plan.graph.outputs)
    for grad in plan.graph.gradients:
        walk(grad.value)
    return sorted(t for t in found if t.startswith("aten."))


def _returns_tuple(target: str) -> bool:
    _, name, overload = target.split(".")
    schema = getattr(getattr(torch.ops.aten, name), overload)._schema
    return len(schema.returns) != 1 or str(schema.returns[0].type).endswith("[]")


class _Renderer:
    """Walks the instructions once, tracking residency, and emits one statement each."""

    def __init__(self, plan: ir.Plan, names: _Namespace):
        self.plan, self.names, self.var = plan, names, names.var
        self.ops = {op.name: op for op in plan.graph.ops}
        self.tensors = {t.name: t for t in plan.graph.tensors}
        self.updates = {u.tensor: u.buffer for u in plan.graph.updates}
        self.replayed = {i.target for i in (*plan.forward, *plan.backward) if i.verb == "recompute" and self.ops[i.target].random}
        self.recomputes_left = {}
        for i in (*plan.forward, *plan.backward):
            if i.verb == "recompute":
                self.recomputes_left[i.target] = self.recomputes_left.get(i.target, 0) + 1
        self.resident: set[str] = set()
        self.host: set[str] = set()
        self.rng: set[str] = set()

    def context(self) -> dict:
        graph = self.plan.graph
        forward_body = [line for i in self.plan.forward for line in self.instruction(i)]
        saved, saved_pack = self._saved()
        outputs = graph.outputs
        flat = _flatten(outputs)
        backward_body = [line for i in self.plan.backward for line in self.instruction(i)]
        buffers = [self.var[b.name] for b in graph.buffers]
        gradients = {g.parameter for g in graph.gradients if g.value is not None}
        return dict(
            device=self.plan.header.device,
            operators=[(callable_name(t), t) for t in aten_targets(self.plan)],
            budget=format_bytes(self.plan.header.budget),
            peak=format_bytes(self.plan.header.peak_bytes),
            time=f"{self.plan.header.time_us / 1000:.3f} ms",
            inputs=[(v.name, tuple(v.shape), v.dtype) for v in graph.inputs],
            parameters=[(p.name, tuple(p.shape), p.dtype, p.name in gradients) for p in graph.parameters],
            buffers=[(b.name, tuple(b.shape), b.dtype) for b in graph.buffers],
            watched=self._watched(saved),
            forward_args=[self.var[v.name] for v in (*graph.inputs, *graph.parameters)],
            buffer_unpack=_unpack(buffers, "buffers"),
            buffer_unpack_ctx=_unpack(buffers, "ctx.buffers"),
            forward_body=forward_body,
            saved=saved,
            saved_pack=saved_pack,
            non_differentiable=self._non_differentiable(flat),
            forward_tail=self._forward_tail(flat),
            forward_return="(" + "".join(f"out_{i}, " for i in range(len(flat))) + ")",
            tangent_args=self._tangent_args(flat),
            backward_body=backward_body,
            backward_return=self._backward_return(),
            rebuild=_rebuild(outputs, len(flat)),
        )

    # --- instructions -----------------------------------------------------

    def instruction(self, ins: ir.Instruction) -> list[str]:
        return getattr(self, "_" + ins.verb)(ins.target)

    def _compute(self, name: str) -> list[str]:
        op = self.ops[name]
        lines = []
        if name in self.replayed:
            lines.append(f"{self.names.rng(name)} = _rng_state()")
            self.rng.add(self.names.rng(name))
        lines += self._call(op)
        lines += [f"{self.var[self.updates[t]]}.copy_({self.var[t]})" for t in op.outputs if t in self.updates and op.phase == ir.FORWARD]
        return lines

    def _recompute(self, name: str) -> list[str]:
        op = self.ops[name]
        if not op.random:
            return self._call(op)
        state = self.names.rng(name)
        lines = ["_state = _rng_state()", f"_set_rng_state({state})", *self._call(op), "_set_rng_state(_state)", "del _state"]
        self.recomputes_left[name] -= 1
        if self.recomputes_left[name] == 0:
            self.rng.discard(state)
            lines.append(f"del {state}")
        return lines

    def _call(self, op: ir.Op) -> list[str]:
        args = [render_arg(a, self.var) for a in op.args] + [f"{k}={render_arg(v, self.var)}" for k, v in op.kwargs]
        call = f"{callable_name(op.target)}({', '.join(args)})"
        fresh = [t for t in op.outputs if t not in self.resident]
        self.resident.update(op.outputs)
        if not _returns_tuple(op.target):
            return [f"{self.var[op.outputs[0]]} = {call}" if fresh else call]
        lines = [f"_r = {call}"]
        lines += [f"{self.var[t]} = _r[{self.tensors[t].index}]" for t in fresh]
        return lines + ["del _r"]

    def _delete(self, tensor: str) -> list[str]:
        self.resident.discard(tensor)
        return [f"del {self.var[tensor]}"]

    def _offload(self, tensor: str) -> list[str]:
        self.host.add(tensor)
        return [f"{self.names.host(tensor)}, {self.names.event(tensor)} = _offload({self.var[tensor]})"]

    def _prefetch(self, tensor: str) -> list[str]:
        self.resident.add(tensor)
        return [f"{self.var[tensor]}, {self.names.event(tensor)} = _prefetch({self.names.host(tensor)})"]

    def _wait(self, tensor: str) -> list[str]:
        return [f"_wait({self.names.event(tensor)})"]

    # --- forward/backward boundary ---------------------------------------

    def _saved(self) -> tuple[list[str], list[str]]:
        """(names, pack expressions) of what crosses from forward to backward.

        Model outputs are saved as detached aliases, so ctx holds no reference cycle.
        """
        outputs = set(refs_in(self.plan.graph.outputs))
        names, packs = [], []
        for t in self.plan.graph.tensors:
            if t.name in self.resident:
                names.append(self.var[t.name])
                packs.append(self.var[t.name] + (".detach()" if t.name in outputs else ""))
        for t in self.plan.graph.tensors:
            if t.name in self.host:
                names += [self.names.host(t.name), self.names.event(t.name)]
        names += sorted(self.rng)
        return names, packs + names[len(packs):]

    def _watched(self, saved: list[str]) -> list[tuple[str, str]]:
        """(name, variable) of every tensor the backward section reads that exists when the
        forward ends: checked against in-place changes between forward and backward."""
        read: set[str] = set()
        for ins in self.plan.backward:
            if ins.verb in ("compute", "recompute"):
                read.update(ref.name for ref in ir.op_refs(self.ops[ins.target]))
        graph = self.plan.graph
        values = [v.name for v in (*graph.inputs, *graph.parameters, *graph.buffers)]
        tensors = [t.name for t in graph.tensors if self.var[t.name] in saved]
        return [(name, self.var[name]) for name in (*values, *tensors) if name in read]

    def _non_differentiable(self, flat: list[ir.Arg]) -> list[str]:
        lines = []
        for i, arg in enumerate(flat):
            if not _is_float(self._dtype(arg)):
                lines.append(f"ctx.mark_non_differentiable(out_{i})")
        return lines

    def _forward_tail(self, flat: list[ir.Arg]) -> list[str]:
        return [f"out_{i} = {render_arg(a, self.var)}" for i, a in enumerate(flat)]

    def _tangent_args(self, flat: list[ir.Arg]) -> list[str]:
        tangents = {v.name: self.var[v.name] for v in self.plan.graph.tangents}
        return [tangents.get(f"grad_output.{i}", f"_unused_grad_{i}") for i in range(len(flat))]

    def _backward_return(self) -> str:
        grads = {g.parameter: render_arg(g.value, self.var) for g in self.plan.graph.gradients}
        items = ["None"] + ["None"] * len(self.plan.graph.inputs) + [grads.get(p.name, "None") for p in self.plan.graph.parameters]
        return "(" + ", ".join(items) + ")"

    def _dtype(self, arg: ir.Arg) -> str:
        base = refs_in(arg)[0]
        return self.tensors[base].dtype if base in self.tensors else "float32"


def _flatten(arg: ir.Arg) -> list[ir.Arg]:
    if isinstance(arg, (ir.TupleArg, ir.ListArg)):
        return [x for a in arg.items for x in _flatten(a)]
    return [arg]


def _rebuild(arg: ir.Arg, count: int) -> str:
    index = iter(range(count))

    def build(a):
        if isinstance(a, ir.TupleArg):
            items = [build(x) for x in a.items]
            return "(" + ", ".join(items) + ("," if len(items) == 1 else "") + ")"
        if isinstance(a, ir.ListArg):
            return "[" + ", ".join(build(x) for x in a.items) + "]"
        return f"outputs[{next(index)}]"

    return build(arg)


def _unpack(names: list[str], source: str) -> str:
    if not names:
        return ""
    return f"({', '.join(names)},) = {source}"


def _is_float(dtype: str) -> bool:
    return dtype.startswith(("float", "bfloat", "complex"))
