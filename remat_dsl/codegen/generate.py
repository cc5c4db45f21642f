"""Render a verified plan as a standalone PyTorch module (Jinja2 template, black-formatted).

The module imports torch only, and only its public API (`torch.ops.aten.NAME.OVERLOAD`,
bound once at the top).  Every instruction becomes one statement that names the plan line
it comes from (`# g.plan:1094`, or `# forward:12` for a plan made in code): `compute` and
`recompute` call the aten operator (views are inlined where they are used; recomputes
say so), consecutive `delete`s are one `del`, `offload`/`prefetch`/`wait` call three
small helpers (NOTE: [Streams] in runtime.py); every offloaded tensor has a fixed offset
in the step's host buffer (`host_layout`).  Random operations that the plan
recomputes save the RNG state at their first run and replay it.  An exception raised
inside the module gets a note with the plan line it was running.  The module runs the
plan's ops with autocast off (a plan captured under autocast holds its casts as ops) and
refuses a call under another autocast state than the plan's; it uses nothing that
torch.compile(fullgraph=True) cannot trace (NOTE: [Compiled] in runtime.py).  The
forward section is the function `_forward`, the backward section the generator
`_backward`, run by the autograd nodes of NOTE: [Autograd nodes] in the template.

Everything the module needs to know about residency (which outputs are new, which RNG
states are kept or freed, what crosses from forward to backward) comes from the plan's
simulation (NOTE: [Step events] in remat_dsl.check.replay): nothing is replayed here.

NOTE: [Plan text as data]
A plan is untrusted input: a reviewed plan must not be able to make the module run
anything but the plan's aten operators and the data containers its outputs are built of.
So nothing read from a plan reaches the module's source except as data: names as Python
identifiers this module makes (`_Namespace`, NOTE: [Generated names]), strings and numbers
as Python literals (`literal`: repr of a str, int, float, bool or None), dtypes, layouts
and memory formats as `torch.NAME` only after checking that torch defines that constant,
operators as `aten_NAME_OVERLOAD` only for the aten operators the verifier resolved, and
the model's output classes as strings that the module resolves among the modules already
imported, to data containers only (`_output_type` in runtime.py).  The template writes
no plan text itself: every value it prints comes from `_Renderer.context`, rendered here,
and the docstring carries only what this module formats (sizes, times) or checked against
a closed set (`_checked_text`).  The plan file's name appears in comments reduced to
letters, digits and `._+-` (`source_label`).
"""

from __future__ import annotations

import ast
import builtins
import functools
import keyword
import math
import re
from pathlib import Path

from remat_dsl.plan import ir
from remat_dsl.plan.hostmem import PINNED_ALIGN, host_copies
from remat_dsl.plan.inplace import INPLACE_OUT, whole_tensor
from remat_dsl.plan.operators import GRAD_MODE_OPS, torch_constants
from remat_dsl.plan.ir import refs_in
from remat_dsl.plan.liveness import live_intervals, op_steps
from remat_dsl.plan.optimizer import KINDS, parse_optimizer
from remat_dsl.plan.resources import data_path
from remat_dsl.plan.units import format_bytes, format_duration

TEMPLATES = data_path("templates")
TEMPLATE = "module.py.jinja"
RUNTIME = Path(__file__).with_name("runtime.py")  # NOTE: [Runtime]
RUNTIME_BEGIN = "# --- remat-dsl runtime: remat_dsl/codegen/runtime.py, inlined (edit it there) ---"
RUNTIME_END = "# --- end of the remat-dsl runtime ---"
LINE_LENGTH = 120
LABEL_CHARS = 80  # characters of the plan file's name kept in the module's comments


def generate(verified, source: str = "a plan") -> str:
    """Python source of the module that runs a VerifiedPlan (remat_dsl.check.verify).

    source: the plan file's name, for the comments that tie statements to plan lines
    (reduced to `source_label`).  Raises ValueError when the plan holds a value the module
    cannot write as data (NOTE: [Plan text as data]; the verifier refuses such plans first).
    """
    import black
    import jinja2

    plan = verified.plan
    names = _Namespace(plan.graph)
    renderer = _Renderer(verified, names, source_label(source))
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(TEMPLATES), keep_trailing_newline=True, autoescape=False)
    text = env.get_template(TEMPLATE).render(runtime=runtime_source(), **renderer.context())
    text = black.format_str(text, mode=black.Mode(line_length=LINE_LENGTH))
    check_namespace(text, names)
    return text


# NOTE: [Runtime]
# What the module runs that does not depend on the plan (the stream helpers, the RNG replay,
# the checks of the model and its arguments, ...) is a Python module of its own,
# remat_dsl/codegen/runtime.py, linted and unit-tested as such (tests/test_runtime.py).  It
# imports torch and the standard library only, and takes the plan's values as arguments, so
# its source is inlined as it is, between RUNTIME_BEGIN and RUNTIME_END, below the module's
# docstring: the generated module imports nothing of remat-dsl.  Its global names are
# reserved (RESERVED: NOTE: [Generated names]).


@functools.cache
def runtime_source() -> str:
    """The runtime's source as the module holds it: without its docstring, between the
    RUNTIME_BEGIN and RUNTIME_END markers (NOTE: [Runtime])."""
    text = RUNTIME.read_text(encoding="utf-8")
    first = ast.parse(text).body[0]
    docstring = (
        isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) and isinstance(first.value.value, str)
    )
    body = "\n".join(text.splitlines()[first.end_lineno if docstring else 0 :]).strip("\n")
    return f"{RUNTIME_BEGIN}\n{body}\n\n\n{RUNTIME_END}"


def runtime_globals() -> frozenset[str]:
    """Every name the runtime binds at module level: its functions, classes, assignments and
    imports (NOTE: [Runtime])."""
    found: set[str] = set()
    for node in ast.parse(RUNTIME.read_text(encoding="utf-8")).body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            found.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            found |= {n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name)}
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            found |= {(a.asname or a.name).partition(".")[0] for a in node.names}
    return frozenset(found)


MAX_RELEASES = 16  # gradient releases per backward (NOTE: [Gradient release] in templates/module.py.jinja)


def source_label(source: str) -> str:
    """The plan file's name as the module's comments write it: letters, digits and `._+-`
    kept, anything else `_`, at most LABEL_CHARS characters (NOTE: [Plan text as data])."""
    label = re.sub(r"[^A-Za-z0-9._+\-]", "_", source)[:LABEL_CHARS]
    return label or "plan"


def literal(value) -> str:
    """A Python literal of a plan constant: str, int, float (`float("inf")` for the
    non-finite), bool or None.  Raises ValueError for anything else (NOTE: [Plan text as data])."""
    if value is None or isinstance(value, (bool, int, str)):
        return repr(value)
    if isinstance(value, float):
        return repr(value) if math.isfinite(value) else f'float("{value}")'
    raise ValueError(f"a plan constant of type {type(value).__name__} cannot be written as a Python literal")


def _hyper(value) -> str:
    """A hyper-parameter literal: a number, a bool, or a tuple of numbers (Adam's betas)."""
    if isinstance(value, tuple):
        return "(" + "".join(f"{literal(v)}, " for v in value) + ")"
    return literal(value)


_TEXT = re.compile(r"[A-Za-z0-9 ._:%()+\-]*")


def _checked_text(text: str) -> str:
    """`text` for the module's docstring, which only this module writes: letters, digits,
    spaces and `._:%()+-` (sizes, times, `backward:12`, a device kind).  Raises ValueError."""
    if not _TEXT.fullmatch(text):
        raise ValueError(f"cannot write {text!r} into the generated module's docstring")
    return text


# NOTE: [Generated names]
# The module's own names and the plan's never meet.  A plan name becomes a Python name
# (`transformer.h.0.ln_1` -> `transformer_h_0_ln_1`, `fc1:1` -> `fc1_1`) that is never a
# keyword, never a builtin (`len`, `float`), never a name the template defines at module
# level (`torch`, `operator`, `INPUTS`, `FastModel`, ...: RESERVED, read from its text),
# never a global of the runtime it inlines (`re`, `sys`, ...: NOTE: [Runtime]) and
# never starts with `_` or with a prefix the generator gives names it derives
# (DERIVED_PREFIXES: the aten bindings, host copies, transfer events, RNG states, absent
# gradients); such a name gets `v_` in front, and two plan names that would read the same
# get `_1`, `_2`, ...  Everything the module names itself inside the plan's functions
# starts with `_` (`_s`, `_p`, `_device`, `_pool`, ...).  A submodule called `out`, `where`
# or `torch`, or a top-level `torch.where`, thus cannot shadow what the generated code
# reads.  `check_namespace` verifies it on the module's source before it is written.
DERIVED_PREFIXES = ("aten_", "host_", "event_", "rng_", "absent_", "dev_")


def _template_globals() -> frozenset[str]:
    """The names the template defines at module level (functions, classes, constants,
    imports): what a local of the plan's functions could shadow."""
    text = (TEMPLATES / TEMPLATE).read_text(encoding="utf-8")
    names = re.findall(r"^(?:def|class)\s+([A-Za-z_]\w*)|^([A-Za-z_]\w*)\s*=|^import\s+([A-Za-z_]\w*)", text, re.M)
    return frozenset(name for groups in names for name in groups if name)


RESERVED = (
    frozenset(keyword.kwlist)
    | frozenset(keyword.softkwlist)
    | frozenset(dir(builtins))
    | _template_globals()
    | runtime_globals()
)


class _Namespace:
    """Readable Python names for every value of the plan (NOTE: [Generated names]):
    inputs and intermediate tensors are locals of `_forward` and `_backward`, parameters
    and buffers attributes of `_p` and `_b` (`_p.fc1_weight`), so the long lists of
    parameters are written once."""

    def __init__(self, graph: ir.Graph):
        self.used: set[str] = set()
        self.attrs: set[str] = set()
        self.var: dict[str, str] = {}
        named: tuple[ir.ValueDecl | ir.TensorDecl, ...] = (*graph.inputs, *graph.tangents, *graph.tensors)
        for value in named:
            self.var[value.name] = self._fresh(value.name, self.used)
        for prefix, group in (("_p", graph.parameters), ("_b", graph.buffers)):
            for value in group:
                self.var[value.name] = f"{prefix}.{self._fresh(value.name, self.attrs)}"

    @staticmethod
    def _fresh(name: str, used: set[str]) -> str:
        base = re.sub(r"\W", "_", name, flags=re.ASCII) or "v"
        if base[0].isdigit() or base.startswith("_") or base in RESERVED or base.startswith(DERIVED_PREFIXES):
            base = "v_" + base
        candidate, k = base, 1
        while candidate in used or candidate in RESERVED:
            candidate, k = f"{base}_{k}", k + 1
        used.add(candidate)
        return candidate

    def locals(self) -> set[str]:
        """The Python names plan values take inside the plan's functions."""
        return {v for v in self.var.values() if "." not in v}

    def attr(self, name: str) -> str:
        """The attribute of a parameter or buffer: `fc1_weight` for `_p.fc1_weight`."""
        return self.var[name].partition(".")[2]

    def host(self, tensor: str) -> str:
        return f"host_{self.var[tensor]}"

    def event(self, tensor: str) -> str:
        return f"event_{self.var[tensor]}"

    def rng(self, op: ir.Op) -> str:
        """The RNG state a random op's first run starts from: named after its first output."""
        return f"rng_{self.var[op.outputs[0]]}"

    def absent(self, tangent: str) -> str:
        """Whether the caller gave no gradient for a model output (NOTE: [Absent output gradients])."""
        return f"absent_{self.var[tangent]}"


def check_namespace(source: str, names: _Namespace) -> None:
    """Raise ValueError unless, in the plan's functions of `source` (`_forward`,
    `_backward`), every name a statement binds is a plan value's (or derived from one:
    DERIVED_PREFIXES) or starts with `_`, and no plan value's name is one the module
    defines or Python provides (NOTE: [Generated names])."""
    tree = ast.parse(source)
    module_names = {n.name for n in tree.body if isinstance(n, (ast.FunctionDef, ast.ClassDef))}
    module_names |= {t.id for n in tree.body if isinstance(n, ast.Assign) for t in n.targets if isinstance(t, ast.Name)}
    module_names |= {
        a.asname or a.name for n in tree.body if isinstance(n, (ast.Import, ast.ImportFrom)) for a in n.names
    }
    plan = names.locals()
    clash = plan & (module_names | set(dir(builtins)) | set(keyword.kwlist))
    if clash:
        raise ValueError(f"generated names clash with the module's own: {sorted(clash)[:5]}")
    for function in (n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name in ("_forward", "_backward")):
        bound = {a.arg for a in function.args.args}
        bound |= {
            n.id for n in ast.walk(function) if isinstance(n, ast.Name) and isinstance(n.ctx, (ast.Store, ast.Del))
        }
        stray = {n for n in bound if not n.startswith("_") and n not in plan and not n.startswith(DERIVED_PREFIXES)}
        if stray:
            raise ValueError(f"{function.name} binds names outside the plan's namespace: {sorted(stray)[:5]}")


def render_arg(arg: ir.Arg, var: dict[str, str]) -> str:
    """Python expression of an IR argument (NOTE: [Plan text as data]).  Raises ValueError
    for a constant, symbol or call the module cannot write as data."""
    if isinstance(arg, ir.Ref):
        return var[arg.name]
    if isinstance(arg, ir.Sym):
        return torch_constant(arg.name)
    if isinstance(arg, ir.Call):
        return _render_call(arg, var)
    if isinstance(arg, ir.ListArg):
        return "[" + ", ".join(render_arg(a, var) for a in arg.items) + "]"
    if isinstance(arg, ir.TupleArg):
        items = [render_arg(a, var) for a in arg.items]
        return "(" + ", ".join(items) + ("," if len(items) == 1 else "") + ")"
    if isinstance(arg, ir.SizeExpr):
        return render_size(arg)
    return literal(arg)


def size_var(symbol: str) -> str:
    """The generated module's variable of size symbol `symbol` (`_size_B`), bound from its
    inputs' sizes at each call; raises ValueError for a symbol that is not an identifier."""
    if not symbol.isidentifier() or keyword.iskeyword(symbol):
        raise ValueError(f"`{symbol[:80]}` is not a size symbol")
    return f"_size_{symbol}"


def render_size(expr: ir.SizeExpr) -> str:
    """A size expression (NOTE: [Size expressions] in remat_dsl/plan/ir.py) as Python
    arithmetic over ints, rendered from its terms (never from text): `(4 * _size_B * _size_S - 1)`,
    `_size_S`."""
    parts = []
    for symbols, coefficient in expr.terms:
        if type(coefficient) is not int:
            raise ValueError(f"size expression coefficient {coefficient!r} is not an integer")
        factors = [repr(abs(coefficient))] if abs(coefficient) != 1 or not symbols else []
        term = " * ".join(factors + [size_var(s) for s in symbols])
        parts.append(("- " if coefficient < 0 else "+ ") + term)
    text = " ".join(parts).removeprefix("+ ") or "0"
    return text if text.isidentifier() else f"({text})"


def torch_constant(name: str) -> str:
    """`name` (`torch.float32`) when it is one of `torch_constants()`; raises ValueError."""
    if name not in torch_constants():
        raise ValueError(f"`{name[:80]}` is not a torch dtype, layout or memory format")
    return name


def _render_call(call: ir.Call, var) -> str:
    args = [render_arg(a, var) for a in call.args] + [f"{_keyword(k)}={render_arg(v, var)}" for k, v in call.kwargs]
    if call.target == "operator.getitem" and len(call.args) == 2 and not call.kwargs:
        return f"{args[0]}[{args[1]}]"
    if call.target == "torch.device" and len(call.args) == 1 and isinstance(call.args[0], str) and not call.kwargs:
        return f"_on(_device, {args[0]})"  # the device the step runs on, when of this kind
    return f"{callable_name(call.target)}({', '.join(args)})"


def _keyword(name: str) -> str:
    if not name.isidentifier() or keyword.iskeyword(name):
        raise ValueError(f"`{name[:80]}` is not a keyword argument name")
    return name


_ATEN = re.compile(r"aten\.[A-Za-z_][A-Za-z0-9_]*\.[A-Za-z_][A-Za-z0-9_]*")


def callable_name(target: str) -> str:
    """`aten.addmm.default` -> `aten_addmm_default`, bound once at the top of the module.
    Raises ValueError for a target that is not an aten operator's name."""
    if not _ATEN.fullmatch(target):
        raise ValueError(f"`{target[:80]}` is not an aten operator")
    return target.replace(".", "_")


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


def _returns(target: str) -> int | None:
    """How many values `target` returns: 1, n for a tuple, None for a list (Tensor[])."""
    import torch

    _, name, overload = target.split(".")
    returns = getattr(getattr(torch.ops.aten, name), overload)._schema.returns
    if len(returns) == 1 and str(returns[0].type).endswith("[]"):
        return None
    return len(returns)


def _input_shape(decl: ir.ValueDecl) -> str:
    """An input's shape as INPUTS holds it: each size an int, or (symbol, bound) where it
    varies (NOTE: [Sizes that vary] in remat_dsl/plan/ir.py)."""
    fixed = _shape(decl.shape)
    if not decl.dims:
        return fixed
    sizes = [size if sym is None else (sym, size) for size, sym in zip(decl.shape, decl.dims, strict=True)]
    return repr(tuple(sizes))


def _shape(shape: tuple[int, ...]) -> str:
    """A shape as a tuple literal; raises ValueError unless every size is an int."""
    if not all(isinstance(d, int) and not isinstance(d, bool) for d in shape):
        raise ValueError("a shape holds a size that is not an integer")
    return repr(tuple(shape))


def _dtype(name: str) -> str:
    """`torch.NAME` of a dtype the plan declares; raises ValueError for another name."""
    return torch_constant(f"torch.{name}")


class _Renderer:
    """Emits one statement per instruction (consecutive deletes: one), each with its plan line."""

    def __init__(self, verified, names: _Namespace, source: str):
        self.plan, self.sim = verified.plan, verified.simulation
        self.names, self.var, self.source = names, names.var, source
        self.ops = self.plan.graph.op_by_name
        self.tensors = self.plan.graph.tensor_by_name
        self.tangent_names = {t.name for t in self.plan.graph.tangents}
        self._tangent_sources: dict[str, set[str]] | None = None  # tensor -> the tangents it is computed from
        self._readers: dict[str, list[tuple[ir.Op, list[str]]]] | None = None
        self.updates = {u.tensor: u.buffer for u in self.plan.graph.updates}
        self.host = host_copies(self.plan)  # NOTE: [Pinned host memory] in remat_dsl/plan/hostmem.py
        header = self.plan.header
        self.optimizer = parse_optimizer(header.optimizer) if header.optimizer is not None else None
        self.param_index = {p.name: k for k, p in enumerate(self.plan.graph.parameters)}
        # NOTE: [Parameters on the host]: a prefetched parameter's device copy is a local
        self.streamed = sorted(
            {i.target for i in (*self.plan.forward, *self.plan.backward) if i.verb == "prefetch"}
            & self.param_index.keys(),
            key=self.param_index.__getitem__,
        )
        self.param_attr = {name: self.var[name] for name in self.streamed}
        # NOTE: [Paged optimizer states] in remat_dsl/plan/optimizer.py
        self.paged = {i.target for i in self.plan.backward if i.verb == "prefetch_states"}
        self.var = {**self.var, **{name: f"dev_{names.attr(name)}" for name in self.streamed}}

    def context(self) -> dict:
        """The template's values, each already Python source or checked text (NOTE: [Plan
        text as data])."""
        graph, header = self.plan.graph, self.plan.header
        steps = iter(self.sim.timeline)
        uses, gathers = self._parameter_uses()
        forward_body = self._body(self.plan.forward, steps, before=gathers[0])
        releases = self._releases()
        backward_body = self._body(self.plan.backward, steps, {at: lines for at, _, lines in releases}, gathers[1])
        flat = _flatten(graph.outputs)
        saved, saved_pack = self._saved()
        trainable = {g.parameter for g in graph.gradients}  # NOTE: [Frozen and unused parameters] in remat_dsl.plan.ir
        device_kind = _checked_text(header.device.split(":")[0])
        autocast = torch_constant(f"torch.{graph.autocast.dtype}") if graph.autocast else None
        return dict(
            source_label=self.source,
            device_kind=device_kind,
            device_literal=literal(device_kind),
            autocast=autocast,
            status=_checked_text(header.status),
            peak_at=_checked_text(header.peak_at),
            budget=_checked_text(format_bytes(header.budget)),
            peak=_checked_text(format_bytes(header.peak_bytes)),
            time=_checked_text(format_duration(header.time_us)),
            plan_literal=literal(self.source),
            model_literal=literal(header.model),
            solver_literal=literal(header.solver),
            operators=[
                (callable_name(t), t, t in GRAD_MODE_OPS)
                for t in sorted({*aten_targets(self.plan), *self._inplace_targets()})
            ],
            inputs=[(literal(v.name), _input_shape(v), _dtype(v.dtype)) for v in graph.inputs],
            input_vars=[self.var[v.name] for v in graph.inputs],
            size_bindings=self._size_bindings(),
            parameters=[
                (
                    literal(p.name),
                    literal(self.names.attr(p.name)),
                    _shape(p.shape),
                    _dtype(p.dtype),
                    literal(p.name in trainable),
                )
                for p in graph.parameters
            ],
            buffers=[
                (literal(b.name), literal(self.names.attr(b.name)), _shape(b.shape), _dtype(b.dtype))
                for b in graph.buffers
            ],
            watched=[(literal(name), var) for name, var in self._watched()],
            forward_body=forward_body,
            saved=saved,
            saved_pack=saved_pack,
            outputs=[f"{render_arg(a, self.var)},  # {self._section_where('outputs', 1)}" for a in flat],
            tangent_args=self._tangent_args(flat),
            tangent_prologue=self._tangent_prologue(),
            backward_body=backward_body,
            final_gradients=self._final_gradients({i for _, group, _ in releases for i in group}),
            gradients_where=self._gradients_where(),
            releases=[repr(tuple(group)) for _, group, _ in releases],
            parameter_uses=[repr(use) for use in uses],
            rebuild=_rebuild(graph.outputs, flat),
            output_types=[literal(path) for path in output_types(graph.outputs)],
            outputs_where=literal(self._section_where("outputs", 1)),
            constants=[(literal(c.name), render_arg(c.value, self.var)) for c in graph.constants],
            offloads=bool(self.host.pool.slots),
            pool_groups=repr(self.host.pool.sizes),
            pool_align=repr(PINNED_ALIGN),
            optimizer_literal=self._optimizer_literal(),
            streamed=repr(tuple(self.param_index[p] for p in self.streamed)),
            streamed_groups=repr(self.host.streamed.sizes),
            streamed_slots=repr(tuple(self.host.streamed.slots[p] for p in self.streamed)),
            paged_groups=repr(self.host.paged.sizes),
            paged_slots=repr({self.param_index[p]: self.host.paged.slots[p] for p in self._in_order(self.paged)}),
            first_resident=repr(self._first_resident()),
        )

    def _in_order(self, params) -> list[str]:
        """`params` in the order of PARAMETERS."""
        return sorted(params, key=self.param_index.__getitem__)

    def _first_resident(self) -> int:
        """The index of the first parameter on the device (NOTE: [Parameters on the host])."""
        streamed = {self.param_index[p] for p in self.streamed}
        return next((k for k in range(len(self.param_index)) if k not in streamed), 0)

    def _optimizer_literal(self) -> str:
        """(torch.optim class name, keyword arguments) of the plan's optimizer as a literal,
        or None (NOTE: [Optimizer in the step])."""
        if self.optimizer is None:
            return "None"
        name = KINDS[self.optimizer.kind][0]
        kwargs = self.optimizer.torch_kwargs()
        items = [f"{literal(k)}: {_hyper(v)}" for k, v in kwargs.items()]
        return f"({literal(name)}, {{{', '.join(items)}}})"

    # --- instructions -----------------------------------------------------

    def _where(self, ins: ir.Instruction, section: str, index: int) -> str:
        return f"{self.source}:{ins.span.line}" if ins.span else f"{section}:{index}"

    def _section_where(self, section: str, offset: int = 0) -> str:
        """`g.plan:LINE (SECTION)`: the line `offset` lines below the section's name."""
        span = self.plan.section_span(section)
        return f"{self.source}:{span.line + offset} ({section})" if span else f"the plan's {section}"

    def _gradients_where(self) -> str:
        """The plan lines of the `gradients` section (`g.plan:120-126 (gradients)`)."""
        lines = [g.span.line for g in self.plan.graph.gradients if g.span]
        if not lines:
            return self._section_where("gradients", 1)
        first, last = min(lines), max(lines)
        return f"{self.source}:{first}{'' if first == last else f'-{last}'} (gradients)"

    def _body(self, instructions, steps, after=None, before=None) -> list[str]:
        """The statements of a section, each instruction's from EMITTERS; `after` and
        `before`: more lines after or before the instruction at a 1-based index (the
        gradient releases of the backward, the FSDP2 gathers and frees of both)."""
        after, before = after or {}, before or {}
        lines: list[str] = []
        self._pending_deletes: list[tuple[str, str]] = []
        for index, ins in enumerate(instructions, 1):
            step = next(steps)
            where = self._where(ins, step.section, index)
            if index in before:
                lines += self._deletes() + before[index]
            code = EMITTERS[ins.verb](self, ins.target, step, where) + after.get(index, [])
            if code:
                lines += self._deletes() + code
        return lines + self._deletes()

    def _deletes(self) -> list[str]:
        """One `del` for the consecutive deletes pending, with the range of plan lines
        (`g.plan:40-42`); none pending after it."""
        deletes, self._pending_deletes = self._pending_deletes, []
        if not deletes:
            return []
        first, last = deletes[0][1], deletes[-1][1]
        (where, _, _), (last_where, _, last_line) = first.rpartition(":"), last.rpartition(":")
        span = first if first == last else f"{first}-{last_line}" if where == last_where else f"{first}, {last}"
        return [f"del {', '.join(var for var, _ in deletes)}  # {span}"]

    # Each emitter takes (instruction target, its simulation Step, its plan line) and returns
    # the statements, each with its plan line as a comment (EMITTERS).

    def _compute(self, name: str, step, where: str) -> list[str]:
        op = self.ops[name]
        saves_rng = any(key == f"rng state of {name}" for key, _ in step.added)
        rng = self.names.rng(op)
        lines = [f"{rng} = _rng_state(_device)"] if saves_rng else []
        lines += [self._call(op, step, (lambda call, _: f"_first_draw({rng}, {call})") if saves_rng else None)]
        lines += [
            f"{self.var[self.updates[t]]}.copy_({self.var[t]})"
            for t in op.outputs
            if t in self.updates and op.phase == ir.FORWARD
        ]
        return [f"{code}  # {where}" for code in lines]

    def _recompute(self, name: str, step, where: str) -> list[str]:
        op = self.ops[name]
        if not op.random:
            return [f"{self._call(op, step)}  # {where} (recompute)"]
        rng = self.names.rng(op)
        lines = [
            self._call(
                op, step, lambda _, args: f"_replay({rng}, _device, {', '.join([callable_name(op.target), *args])})"
            )
        ]
        if any(key == f"rng state of {name}" for key, _ in step.removed):
            lines.append(f"del {rng}")
        return [f"{code}  # {where} (recompute)" for code in lines]

    def _delete(self, tensor: str, step, where: str) -> list[str]:
        """Nothing yet: consecutive deletes become one `del` (`_deletes`), written before
        the next statement."""
        self._pending_deletes.append((self.var[tensor], where))
        return []

    def _call(self, op: ir.Op, step, wrap=None) -> str:
        """`OUTPUTS = aten_X(ARGS)`, assigning the outputs the step makes resident; `wrap(call,
        args)`, if given, is the expression that stands for the call (the RNG helpers)."""
        args = [render_arg(a, self.var) for a in op.args] + [
            f"{_keyword(k)}={render_arg(v, self.var)}" for k, v in op.kwargs
        ]
        absent = [self._absent(a) for a in op.args]
        if op.target == "aten.add.Tensor" and len(op.args) == 2 and not op.kwargs and absent != ["False", "False"]:
            any_layout = self._any_layout(op.outputs[0])  # NOTE: [Absent output gradients]
            call = f"_add_gradients({', '.join(args)}, {', '.join(absent)}, {any_layout}, _device)"
        elif step.into:  # NOTE: [In-place outputs] in remat_dsl.plan.inplace
            call = self._into(op, step.into, args)
        else:
            args = [self._real(a) for a in op.args] + [f"{_keyword(k)}={self._real(v)}" for k, v in op.kwargs]
            call = f"{callable_name(op.target)}({', '.join(args)})"
        if wrap is not None:
            call = wrap(call, args)
        fresh = {key for key, _ in step.added}
        returns = _returns(op.target)
        if returns == 1:
            return f"{self.var[op.outputs[0]]} = {call}" if op.outputs[0] in fresh else call
        by_index = {self.tensors[t].index: self.var[t] for t in op.outputs if t in fresh}
        if not by_index:
            return call
        if returns is not None and len(by_index) == returns:
            return ", ".join(by_index[i] for i in range(returns)) + f" = {call}"
        # the outputs it does not keep (already resident, or never read) are dropped with the
        # call's result, as the simulation frees them: a `_` target would hold one until
        # the next `_` (a recomputed layer norm's output, 48 KiB above the predicted peak)
        kept = sorted(by_index)
        if len(kept) == 1:
            return f"{by_index[kept[0]]} = {call}[{kept[0]}]"
        return ", ".join(by_index[i] for i in kept) + f" = operator.itemgetter({', '.join(map(str, kept))})({call})"

    def _into(self, op: ir.Op, tensor: str, args: list[str]) -> str:
        """`_into(_s, OVERLOAD, OP, KEYWORD, INTO, ARGS)`: `op` with its output written into
        `tensor`, as the argument that reads it whole reads it (NOTE: [In-place outputs])."""
        reads = next(
            a for a in (*op.args, *(v for _, v in op.kwargs)) if (whole_tensor(a, self.tensors) or ("",))[0] == tensor
        )
        out, keyword = INPLACE_OUT[op.target]
        return (
            f"_into(_s, {callable_name(out)}, {callable_name(op.target)}, {literal(keyword)},"
            f" {render_arg(reads, self.var)}, {', '.join(args)})"
        )

    def _inplace_targets(self) -> set[str]:
        """The overloads the in-place steps call (NOTE: [In-place outputs])."""
        return {INPLACE_OUT[self.ops[step.instruction.target].target][0] for step in self.sim.timeline if step.into}

    def _offload(self, tensor: str, step, where: str) -> list[str]:
        """`host_T, event_T = _offload(T, _pool, (GROUP, OFFSET))`: into T's slot of the step's
        host groups (NOTE: [Pinned host memory] in remat_dsl/plan/hostmem.py).  A
        parameter kept on the host: `event_dev_P = _write_back(_p.P, dev_P)`, its updated device
        copy into its host copy (NOTE: [Parameters on the host] in remat_dsl/check/replay.py)."""
        if tensor in self.param_attr:
            dev = self.var[tensor]
            return [f"event_{dev} = _write_back({self.param_attr[tensor]}, {dev})  # {where}"]
        host, event, slot = self.names.host(tensor), self.names.event(tensor), self.host.pool.slots[tensor]
        return [f"{host}, {event} = _offload({self.var[tensor]}, _pool, {slot!r})  # {where}"]

    def _prefetch(self, tensor: str, step, where: str) -> list[str]:
        """`T, event_T = _prefetch(host_T, event_T, _device)`: the copy waits for event_T, the
        offload's (or an earlier prefetch's) event, then event_T is the prefetch's.  A
        parameter kept on the host: `dev_P, event_dev_P = _prefetch(_p.P, None, _device)`."""
        if tensor in self.param_attr:
            dev = self.var[tensor]
            return [f"{dev}, event_{dev} = _prefetch({self.param_attr[tensor]}, None, _device)  # {where}"]
        event = self.names.event(tensor)
        return [f"{self.var[tensor]}, {event} = _prefetch({self.names.host(tensor)}, {event}, _device)  # {where}"]

    def _wait(self, tensor: str, step, where: str) -> list[str]:
        event = f"event_{self.var[tensor]}" if tensor in self.param_attr else self.names.event(tensor)
        return [f"_wait({event}, _device)  # {where}"]

    def _update(self, param: str, step, where: str) -> list[str]:
        """`_s.optimizers.update(K, GRAD)`: parameter K's update from its gradient (NOTE:
        [Optimizer in the step])."""
        value = self._reached(self._gradient(param))
        paged = ", paged=True" if param in self.paged else ""
        paged += f", target={self.var[param]}" if param in self.param_attr else ""  # the device copy
        return [f"_s.optimizers.update({self.param_index[param]}, {value}{paged})  # {where}"]

    def _prefetch_states(self, param: str, step, where: str) -> list[str]:
        """`_s.optimizers.prefetch_states(K, _device)`: P's paged states copied to the device
        on the h2d stream (NOTE: [Paged optimizer states] in remat_dsl/plan/optimizer.py)."""
        return [f"_s.optimizers.prefetch_states({self.param_index[param]}, _device)  # {where}"]

    def _offload_states(self, param: str, step, where: str) -> list[str]:
        """`_s.optimizers.offload_states(K, _device)`: P's new states copied to host memory on d2h."""
        return [f"_s.optimizers.offload_states({self.param_index[param]}, _device)  # {where}"]

    def _wait_states(self, param: str, step, where: str) -> list[str]:
        """`_s.optimizers.wait_states(K, _device)`: the compute stream waits for P's states'
        copy; after their offload, their device copy is dropped."""
        return [f"_s.optimizers.wait_states({self.param_index[param]}, _device)  # {where}"]

    def _host_update(self, param: str, step, where: str) -> list[str]:
        """`_s.optimizers.host_update(K, HOST GRAD, (EVENTS,), _device)`: the update on the
        host, from the host copies of the gradient's tensors."""
        value = self._gradient(param)
        names = [r for r in refs_in(value) if r in self.tensors]
        host_var = {**self.var, **{r: self.names.host(r) for r in names}}
        rendered = render_arg(value, host_var)
        found = sorted(self._tangents_of(refs_in(value)))
        if found:
            rendered = f"(None if {' and '.join(self.names.absent(t) for t in found)} else {rendered})"
        events = "".join(f"{self.names.event(r)}, " for r in names)
        on_host = ", on_host=True" if param in self.param_attr else ""
        index = self.param_index[param]
        return [f"_s.optimizers.host_update({index}, {rendered}, ({events}), _device{on_host})  # {where}"]

    def _gradient(self, param: str) -> ir.Arg:
        return next(g.value for g in self.plan.graph.gradients if g.parameter == param)

    # --- forward/backward boundary ---------------------------------------

    def _saved(self) -> tuple[list[str], list[str]]:
        """(names, pack expressions) of what crosses from forward to backward (the
        simulation's Crossing).  Model outputs are saved as detached aliases, so the step
        holds no reference cycle."""
        crossing = self.sim.crossing
        outputs = set(refs_in(self.plan.graph.outputs))
        names = [self.var[t] for t in crossing.resident]
        packs = [self.var[t] + (".detach()" if t in outputs else "") for t in crossing.resident]
        for t in crossing.host:
            names += [self.names.host(t), self.names.event(t)]
        names += [self.names.rng(self.ops[op]) for op in crossing.rng]
        if self.host.pool.slots:
            names.append("_pool")  # last: dropped first if autograd drops the step (NOTE: [Streams] 4)
        return names, packs + names[len(packs) :]

    def _watched(self) -> list[tuple[str, str]]:
        """(name, expression) of what the backward reads of the forward: the values it
        reads and the saved tensors it needs (Crossing.needed), checked against in-place
        changes between forward and backward."""
        read: set[str] = set()
        for ins in self.plan.backward:
            if ins.runs_op:
                read.update(ref.name for ref in ir.op_refs(self.ops[ins.target]))
        graph = self.plan.graph
        values = [
            v.name
            for v in (*graph.inputs, *graph.parameters, *graph.buffers)
            if v.name in read and v.name not in self.param_attr
        ]
        needed = [t for t in self.sim.crossing.needed if t in self.sim.crossing.resident]
        return [(name, self.var[name]) for name in (*values, *needed)]

    def _tangent_args(self, flat: list[ir.Arg]) -> list[str]:
        tangents = {v.name: self.var[v.name] for v in self.plan.graph.tangents}
        return [tangents.get(f"grad_output.{i}", f"_unused_grad_{i}") for i in range(len(flat))]

    def _tangent_prologue(self) -> list[str]:
        """Each model output's gradient as the backward reads it: where the caller gave none,
        the shape and layout of autograd's zeros on the meta device (no memory: the ops that
        read it make the zeros) and whether it did (NOTE: [Absent output gradients]); where
        an op reads it through a view that needs the layout it was traced with, in that
        layout (NOTE: [Output gradient layouts] in runtime.py)."""
        lines = []
        for i, tangent in enumerate(self.plan.graph.tangents):
            var, absent, where = (
                self.var[tangent.name],
                self.names.absent(tangent.name),
                self._section_where("tangents", i + 1),
            )
            zeros = f"torch.empty({self._tangent_shape(tangent)}, dtype={_dtype(tangent.dtype)}, device='meta')"
            given = var
            if not self._any_layout(tangent.name):
                leaf = int(tangent.name.rpartition(".")[2])
                given = f"_as_traced({var}, _s.layouts[{leaf}])"
            lines += [f"{absent} = {var} is None  # {where}", f"{var} = {zeros} if {absent} else {given}  # {where}"]
        return lines

    def _size_bindings(self) -> list[str]:
        """`_size_B = ...`: each size symbol the inputs declare, bound to the size of its first
        input dim at this call (NOTE: [Size expressions] in remat_dsl/plan/ir.py)."""
        declared: dict[str, tuple[int, int]] = {}
        for i, decl in enumerate(self.plan.graph.inputs):
            for dim, sym in enumerate(decl.dims):
                if sym is not None:
                    declared.setdefault(sym, (i, dim))
        return [f"{size_var(sym)} = _tensors[_where[{i}]].shape[{dim}]" for sym, (i, dim) in declared.items()]

    def _tangent_shape(self, tangent: ir.ValueDecl) -> str:
        """A tangent's shape as Python: its sizes, and for a size symbol the size of the
        input dim that declares it at this call (NOTE: [Sizes that vary] in
        remat_dsl/plan/ir.py)."""
        if not tangent.dims:
            return _shape(tangent.shape)
        declared = {
            sym: (i, dim) for i, v in enumerate(self.plan.graph.inputs) for dim, sym in enumerate(v.dims) if sym
        }
        parts = [
            str(size) if sym is None else f"_tensors[_where[{declared[sym][0]}]].shape[{declared[sym][1]}]"
            for size, sym in zip(tangent.shape, tangent.dims, strict=True)
        ]
        return "(" + ", ".join(parts) + ("," if len(parts) == 1 else "") + ")"

    def _real(self, arg: ir.Arg) -> str:
        """`arg` rendered, wrapped in `_zeros_if_absent` where it is a model output's gradient
        or a view of it, which is a shape on the meta device when the caller gave none
        (NOTE: [Absent output gradients]); a list or tuple of arguments item by item."""
        if isinstance(arg, ir.ListArg):
            return "[" + ", ".join(self._real(a) for a in arg.items) + "]"
        if isinstance(arg, ir.TupleArg):
            items = [self._real(a) for a in arg.items]
            return "(" + ", ".join(items) + ("," if len(items) == 1 else "") + ")"
        rendered = render_arg(arg, self.var)
        if isinstance(arg, (ir.Ref, ir.Call)) and set(refs_in(arg)) & self.tangent_names:
            return f"_zeros_if_absent({rendered}, _device)"
        return rendered

    def _absent(self, arg: ir.Arg) -> str:
        """`absent_X` when `arg` is a model output's gradient or a view of it (NOTE: [Absent
        output gradients]), else "False"."""
        while isinstance(arg, ir.Call) and arg.args:  # inline calls are views (fbgraph.py)
            arg = arg.args[0]
        if isinstance(arg, ir.Ref) and arg.name in self.tangent_names:
            return self.names.absent(arg.name)
        return "False"

    def _reached(self, value: ir.Arg) -> str:
        """A parameter's gradient `value`, or None when the caller gave no gradient for any
        model output it is computed from: autograd's engine then does not reach the
        parameter, and leaves its `.grad` None (NOTE: [Absent output gradients])."""
        rendered = render_arg(value, self.var)
        found = sorted(self._tangents_of(refs_in(value))) if value is not None else []
        if not found:
            return rendered
        return f"(None if {' and '.join(self.names.absent(t) for t in found)} else {rendered})"

    def _tangents_of(self, names) -> set[str]:
        """The model output gradients (tangents) the tensors `names` are computed from."""
        if self._tangent_sources is None:
            self._tangent_sources = {}
            for op in self.plan.graph.ops:
                found = self._tangents_of(ref.name for ref in ir.op_refs(op))
                self._tangent_sources.update((out, found) for out in op.outputs)
        return set().union(*(self._tangent_sources.get(n, {n} & self.tangent_names) for n in names))

    def _any_layout(self, tensor: str) -> bool:
        """Whether every op that reads `tensor`, or what is computed from it up to a matrix
        product or a full sum, would compute the same values from it in any layout: none
        takes a `view` or `as_strided` of it, which need the strides it was traced with
        (NOTE: [Absent output gradients])."""
        if self._readers is None:  # tensor -> (op reading it, the inline calls around it there)
            self._readers = {}
            for op in self.plan.graph.ops:
                for arg in (*op.args, *(v for _, v in op.kwargs)):
                    for name, path in _refs_with_calls(arg, []):
                        self._readers.setdefault(name, []).append((op, path))
        readers, seen, todo = self._readers, {tensor}, [tensor]
        while todo:
            for op, path in readers.get(todo.pop(), ()):
                if any(target in STRIDED_VIEWS for target in (*path, op.target)):
                    return False
                if op.target in FRESH_LAYOUT:
                    continue
                for out in op.outputs:
                    if out not in seen:
                        seen.add(out)
                        todo.append(out)
        return True

    def _final_gradients(self, released: set[int]) -> str:
        """Each parameter's gradient, in PARAMETERS order, as the backward's end hands them
        over: None for the released ones (NOTE: [Gradient release]: handed over earlier), for
        frozen parameters and for those the loss does not reach."""
        if self.optimizer is not None:  # NOTE: [Optimizer in the step]: the updates took them
            return "(" + "None, " * len(self.plan.graph.parameters) + ")"
        grads = {g.parameter: self._reached(g.value) for g in self.plan.graph.gradients}
        params = [
            "None" if i in released else grads.get(p.name, "None") for i, p in enumerate(self.plan.graph.parameters)
        ]
        return "(" + "".join(f"{g}, " for g in params) + ")"

    def _parameter_uses(self) -> tuple[list[tuple], tuple[dict[int, list[str]], dict[int, list[str]]]]:
        """NOTE: [FSDP2] in runtime.py: for each parameter, the first and last
        instruction of the forward and of the backward that read it (numbered through both
        sections: the backward's first is len(forward) + 1; None where none reads it), and
        per section the lines `_shards(sharded, N)` before instruction N (1-based in that
        section) where some parameter's first read is N or its last read was N - 1: there a
        sharded model gathers and frees its blocks' parameters."""
        index = {p.name: k for k, p in enumerate(self.plan.graph.parameters)}
        uses: list[list[int | None]] = [[None] * 4 for _ in index]
        points: tuple[dict[int, list[str]], dict[int, list[str]]] = ({}, {})
        offset = 0
        for section, instructions in enumerate((self.plan.forward, self.plan.backward)):
            for number, ins in enumerate(instructions, 1):
                if not ins.runs_op:
                    continue
                for ref in ir.op_refs(self.ops[ins.target]):
                    if ref.name in index:
                        use = uses[index[ref.name]]
                        if use[2 * section] is None:
                            use[2 * section] = offset + number
                        use[2 * section + 1] = offset + number
            marks = {use[2 * section] for use in uses} | {end + 1 for use in uses if (end := use[2 * section + 1])}
            for mark in sorted(m for m in marks if m is not None and m - offset <= len(instructions)):
                points[section][mark - offset] = [f"_shards(_sharded, {mark})  # NOTE: [FSDP2]"]
            offset += len(instructions)
        return [tuple(use) for use in uses], points

    def _releases(self) -> list[tuple[int, list[int], list[str]]]:
        """NOTE: [Gradient release]: (backward instruction index, parameter indices, lines)
        for each group of parameter gradients handed to autograd before the backward ends
        (the lines leave them in `_s.pending` and suspend `_backward`):
        those finished by the same instruction (the last that makes or reads their
        tensors), at most MAX_RELEASES groups (neighbours merged, the later index kept);
        gradients finished by the last instruction leave with the return."""
        instructions = self.plan.backward
        runs = [i for i, ins in enumerate(instructions, 1) if ins.runs_op]
        if not runs or self.optimizer is not None:  # NOTE: [Optimizer in the step]: no gradient leaves
            return []
        steps = op_steps(self.plan.graph, (instructions[i - 1].target for i in runs))
        last_use: dict[str, int] = {}  # tensor -> the last run that makes or reads it (NOTE: [Liveness])
        for iv in live_intervals(steps, resident=self.tensors):
            if iv.end is not None and iv.end >= 0:  # None: never freed (nothing is pinned here)
                last_use[iv.tensor] = max(last_use.get(iv.tensor, 0), runs[iv.end])
        index = {p.name: k for k, p in enumerate(self.plan.graph.parameters)}
        finished: dict[int, list[tuple[int, ir.Gradient]]] = {}
        for g in self.plan.graph.gradients:
            refs = refs_in(g.value) if g.value is not None else []
            if not refs or any(r not in last_use for r in refs):
                continue
            at = max(last_use[r] for r in refs)
            if at < runs[-1]:
                finished.setdefault(at, []).append((index[g.parameter], g))
        points = sorted(finished)
        while len(points) > MAX_RELEASES:  # merge the closest neighbours into the later one
            k = min(range(len(points) - 1), key=lambda j: (points[j + 1] - points[j], j))
            finished[points[k + 1]] = finished.pop(points[k]) + finished[points[k + 1]]
            del points[k]
        result = []
        for number, at in enumerate(points):
            group = sorted(finished[at], key=lambda item: item[0])
            values = [self._reached(g.value) for _, g in group]
            names = sorted({self.var[r] for _, g in group for r in refs_in(g.value)})
            lines = [
                f"_s.pending = ({', '.join(values)},)  # NOTE: [Gradient release] {number}",
                f"del {', '.join(names)}  # NOTE: [Gradient release] {number}",
                f"yield  # NOTE: [Gradient release] {number}",
            ]
            result.append((at, [k for k, _ in group], lines))
        return result


# The statements of each verb of ir.INSTRUCTIONS (tests/test_instructions.py checks that it
# has every verb and no other).
EMITTERS = {
    "compute": _Renderer._compute,
    "recompute": _Renderer._recompute,
    "delete": _Renderer._delete,
    "offload": _Renderer._offload,
    "prefetch": _Renderer._prefetch,
    "wait": _Renderer._wait,
    "update": _Renderer._update,
    "host_update": _Renderer._host_update,
    "prefetch_states": _Renderer._prefetch_states,
    "offload_states": _Renderer._offload_states,
    "wait_states": _Renderer._wait_states,
}


# NOTE: [Absent output gradients]: views that need their input's traced strides, and ops
# whose output layout does not follow their inputs' (so what reads it is not affected)
STRIDED_VIEWS = frozenset(
    {"aten.view.default", "aten._unsafe_view.default", "aten.as_strided.default", "aten.as_strided_scatter.default"}
)
FRESH_LAYOUT = frozenset(
    {"aten.mm.default", "aten.bmm.default", "aten.addmm.default", "aten.baddbmm.default", "aten.sum.default"}
)


def _refs_with_calls(arg: ir.Arg, path: list[str]):
    """(tensor name, targets of the inline calls around it) for each reference in `arg`."""
    if isinstance(arg, ir.Ref):
        yield arg.name, path
    elif isinstance(arg, ir.Call):
        for a in (*arg.args, *(v for _, v in arg.kwargs)):
            yield from _refs_with_calls(a, [*path, arg.target])
    elif isinstance(arg, (ir.ListArg, ir.TupleArg)):
        for a in arg.items:
            yield from _refs_with_calls(a, path)


def _flatten(arg: ir.Arg) -> list[ir.Arg]:
    """The output's distinct tensor leaves, in the order of their first leaf (pytree
    order; None is not a leaf of the graph): model output k is `grad_output.k`'s (one
    tensor may stand at several leaves: NOTE: [Output order] in remat_dsl/capture/fx.py)."""
    return list(dict.fromkeys(_leaves(arg)))


def _leaves(arg: ir.Arg) -> list[ir.Arg]:
    """The output's tensor leaves in pytree order."""
    if isinstance(arg, (ir.TupleArg, ir.ListArg)):
        return [x for a in arg.items for x in _leaves(a)]
    if isinstance(arg, ir.Call) and ir.is_structure(arg):
        return [x for _, a in arg.kwargs for x in _leaves(a)]
    return [] if arg is None else [arg]


def output_types(arg: ir.Arg) -> list[str]:
    """The classes (dotted paths) the model's output is built of, in order of first use."""
    found: list[str] = []

    def walk(a):
        if isinstance(a, (ir.TupleArg, ir.ListArg)):
            for x in a.items:
                walk(x)
        elif ir.is_structure(a):
            if a.target != "dict" and a.target not in found:
                found.append(a.target)
            for _, x in a.kwargs:
                walk(x)

    walk(arg)
    return found


def _rebuild(arg: ir.Arg, flat: list[ir.Arg]) -> str:
    """Python that rebuilds the model's output from `outputs` (the distinct tensor leaves
    `flat`, each at every leaf that is it)."""
    index = {leaf: k for k, leaf in reversed(list(enumerate(flat)))}
    types = output_types(arg)

    def build(a):
        if isinstance(a, ir.TupleArg):
            items = [build(x) for x in a.items]
            return "(" + ", ".join(items) + ("," if len(items) == 1 else "") + ")"
        if isinstance(a, ir.ListArg):
            return "[" + ", ".join(build(x) for x in a.items) + "]"
        if ir.is_structure(a):
            fields = "{" + ", ".join(f"{literal(key)}: {build(x)}" for key, x in a.kwargs) + "}"
            return fields if a.target == "dict" else f"self._output_types[{types.index(a.target)}](**{fields})"
        if a is None:
            return "None"
        return f"outputs[{index[a]}]"

    return build(arg)
