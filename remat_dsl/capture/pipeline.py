"""From a model file to a profiled FB-graph: capture, measure, name."""

from __future__ import annotations

import contextlib
import functools
import warnings
from dataclasses import dataclass, replace
from pathlib import Path

import torch
import torch.utils._pytree as pytree

from remat_dsl.plan import ir
from remat_dsl.capture.fx import Recalled, capture, tensor_attributes
from remat_dsl.capture.fbgraph import build_graph, op_names
from remat_dsl.capture.keys import NotStatic, node_key, primal_keys
from remat_dsl.capture.model_file import Inputs, ModelFile
from remat_dsl.capture.profile import NodeProfile, OutputInfo, StepProfile, is_call, profile_step, timing_passes


@dataclass(frozen=True)
class Captured:
    """The profiled FB-graph of a model file and the device kind it is planned for.

    costs: None when every op was measured here; else what predicted the costs, as the
    plan's header says it (`roofline h100-sxm`, `roofline cpu, fake tensors`).
    noisy: the names of the ops whose timing passes never agreed (NOTE: [Robust timing]
    in remat_dsl.capture.profile), in graph order: the machine was busy while they were
    measured.
    """

    graph: ir.Graph
    device: str
    costs: str | None = None
    noisy: tuple[str, ...] = ()
    cached: bool = False  # the step profile from the cache (NOTE: [Profile key])
    eager: tuple[str, ...] = ()  # NOTE: [Eager agreement]: comment lines where eager computes other bits


def device_of(inputs, model: torch.nn.Module) -> str:
    """The device kind of the model's first parameter (or first input): `cpu`, `cuda`.
    A plan names the kind, not an index: it runs on any device of that kind."""
    leaves = inputs.leaves() if isinstance(inputs, Inputs) else inputs
    for tensor in (*model.parameters(), *pytree.tree_leaves(leaves)):
        if isinstance(tensor, torch.Tensor):
            return tensor.device.type
    return "cpu"


# NOTE: [Fake capture]
# A model too large for this machine (a Llama-2-7B in bf16 is 13.5 GB of weights, and the
# real capture also holds its gradients and activations) is captured without data: the
# model is built on the meta device (libraries skip weight initialisation there), its
# parameters and buffers then become fake cpu tensors of a FakeTensorMode, the sample
# inputs are converted to fake tensors, and torch.compile/AOTAutograd trace it as usual.
# Fake tensors keep the device they would have (cpu), their shapes, dtypes, strides and
# storages, but hold no bytes; unlike the meta device they dispatch as the real device
# does (on meta, nll_loss has no autograd kernel and the loss's backward is lost).
# Sizes and aliasing come from their storages, so the graph and its tensor table are the ones a real capture gives
# (tests/test_fake_capture.py); the costs come from a device model (capture/cost.py),
# since nothing can be timed.  `remat plan --fake` asks for it; without it the model is
# first built on the meta device, which costs no memory, and a model whose parameters and
# buffers would take more than FAKE_FRACTION of the host's available memory is captured
# fake (the tool says so).

FAKE_FRACTION = 0.4
FAKE_COSTS = ", fake tensors"  # the end of a plan's `costs` header after a fake capture
MEASURED_TEMPORARIES = ", temporaries measured"  # ... after NOTE: [Load-independent costs]

# NOTE: [Load-independent costs]
# A plan is what a team reviews, so the same model, inputs, device and budget must give
# the same plan on any machine, at any load.  Op times measured here cannot: on a busy
# 2-core machine a profile came out 100 times slower than idle and the schedules differed.
# So by default (`remat plan` without --device, --profile or --measure) each op's time is
# predicted from its shapes by the device description of the device the model runs on
# (the `cpu` one here; a GPU's by its name: remat_dsl/capture/gpus.py), while its sizes
# and temporary bytes are measured in one run (the allocator's events: exact, and the same
# at any load).  The plan's header says so: `costs "roofline cpu, temporaries measured"`.
# A GPU without a shipped description is measured (CUDA events), and the tool says so.
# The temporaries are this machine's kernels': oneDNN's convolutions take other workspaces
# with another number of threads (tests/models/tiny_cnn.py peaks at 89,040 B with torch's
# 2 threads and 62,128 B with OMP_NUM_THREADS=1), so such a model's plan follows the
# thread count, as its real peak does; `--device cpu` predicts the temporaries from shapes
# too and gives the same plan on every machine.
# `--measure` times every op here instead (NOTE: [Robust timing] in profile.py).


def host_available_bytes() -> int | None:
    """MemAvailable of /proc/meminfo in bytes, None where there is none."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def state_bytes(model: torch.nn.Module) -> int:
    """Bytes of the model's parameters and buffers (each storage once: tied weights once)."""
    seen, total = set(), 0
    for t in (*model.parameters(), *model.buffers()):
        key = t.untyped_storage()._cdata
        if key not in seen:
            seen.add(key)
            total += t.untyped_storage().nbytes()
    return total


def too_large_for_host(model_file: ModelFile) -> tuple[int, int] | None:
    """(state bytes, available bytes) when the model, built on meta, would take more than
    FAKE_FRACTION of the host's available memory; None when it fits, or when building it
    on meta fails (the real build then reports the user's error)."""
    available = host_available_bytes()
    if available is None:
        return None
    try:
        with torch.device("meta"):
            model = model_file.build_model()
    except Exception:  # the model file may not build on meta: capture it for real
        return None
    size = state_bytes(model)
    return (size, available) if size > FAKE_FRACTION * available else None


def _fake_mode():
    from torch._subclasses.fake_tensor import FakeTensorMode

    return FakeTensorMode(allow_non_fake_inputs=True)


@contextlib.contextmanager
def _fake_warnings_silenced():
    """PyTorch warns when fake tensors' data pointers are touched (deepcopy, storage
    checks); we never read them."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*data pointer of FakeTensor")
        yield


def _fake_state(model: torch.nn.Module, mode) -> None:
    """Replace every parameter, buffer and tensor attribute (NOTE: [Tensor attributes]) of
    `model` by an empty fake tensor of `mode` on the cpu (same shape, strides, dtype,
    requires_grad); a tensor shared by several modules (tied weights) stays shared."""
    made: dict[int, torch.Tensor] = {}

    def fake(t: torch.Tensor) -> torch.Tensor:
        if id(t) not in made:
            with mode, _fake_warnings_silenced():
                empty = torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device="cpu")
            made[id(t)] = torch.nn.Parameter(empty, t.requires_grad) if isinstance(t, torch.nn.Parameter) else empty
        return made[id(t)]

    for module in model.modules():
        for table in (module._parameters, module._buffers):
            for name, t in table.items():
                if t is not None:
                    table[name] = fake(t)  # type: ignore[assignment]  # fake() keeps a Parameter a Parameter
    for path, t in tensor_attributes(model):  # NOTE: [Tensor attributes]
        owner, _, name = path.rpartition(".")
        setattr(model.get_submodule(owner), name, fake(t))


def build_fake(model_file: ModelFile, mode):
    """(model, inputs) as fake tensors of `mode` (NOTE: [Fake capture]): the model is built
    on the meta device (libraries skip weight initialisation there, which would read
    values), then its parameters and buffers become fake cpu tensors; the inputs are made
    for real (they are small), then converted.  Raises RematError."""
    with torch.device("meta"):
        model = model_file.build_model()
    _fake_state(model, mode)
    inputs = model_file.sample_inputs()
    convert = lambda v: mode.from_tensor(v) if isinstance(v, torch.Tensor) else v  # noqa: E731
    return model, Inputs(tuple(map(convert, inputs.args)), {k: convert(v) for k, v in inputs.kwargs.items()})


def capture_graph(
    model_file: ModelFile,
    repeats: int = 5,
    progress=None,
    measure_time: bool = True,
    device_model=None,
    fake: bool = False,
    kind: str | None = None,
    cache=None,
    check_eager: bool = False,
    local_model: bool = False,
) -> Captured:
    """Build the model, capture its training step and measure (or predict) every op.

    progress: optional object with `start(total)` and `advance(n)` (a rich progress bar).
    measure_time: False skips the timing loop: every op's time_us is 0 (sizes, aliasing
    and temporary memory are still measured), for plans made from a profile file.
    device_model: a `cost.DeviceModel`: op times and temporaries are predicted for it, and
    the plan names its kind.  fake: capture with fake tensors (NOTE: [Fake capture]);
    needs a device model (the caller passes the `cpu` one for this machine).  kind: the
    device kind the plan is for (default: the device model's, else the model's).
    cache: a remat_dsl.plan.cache.Cache: the step profile (every op's sizes, temporary
    bytes and measured time) is taken from it, without running any op, when this graph
    was profiled here before, and stored in it otherwise (NOTE: [Solution cache], NOTE:
    [Profile key]); `Captured.cached` says which.
    check_eager: after profiling, run the step eagerly and compare (NOTE: [Eager agreement]
    in capture/agreement.py; `Captured.eager`); the cache keeps the result, so a caller that
    passes a cache passes True (as `remat plan` does).
    The model file's `autocast` (torch.bfloat16, torch.float16, None) is the autocast
    state it is captured under (NOTE: [Autocast] in capture/fx.py); `dataclasses.replace`
    the ModelFile to override it.
    local_model: without a device model, predict op times with the description of the
    device the model is captured on, measuring sizes and temporaries here (NOTE:
    [Load-independent costs]); a GPU without a shipped description is timed instead.
    Raises RematError (the model file's errors, capture failures).
    """
    if fake and device_model is None:
        raise ValueError("a fake capture needs a device model: nothing can be timed on fake tensors")
    phase = getattr(progress, "phase", None) or (lambda what: None)  # NOTE: [Progress] in plan/progress.py
    phase("building the model")
    mode = _fake_mode() if fake else contextlib.nullcontext()
    model, inputs = build_fake(model_file, mode) if fake else (model_file.build_model(), model_file.sample_inputs())
    # dynamo finds the fake mode in the inputs; outside it, constants the forward makes
    # (T5's `torch.tensor(0)`) stay real values
    captured_on = device_of(inputs, model)
    kind = kind or (device_model.kind if device_model is not None else captured_on)
    if kind == "cuda" and captured_on != "cuda" and not fake:
        # the fused CUDA attention kernels a CUDA plan holds (NOTE: [Fused attention] in
        # capture/attention.py) have no kernel here to run on real tensors
        from remat_dsl.capture.cost import load_device

        fake, mode, device_model = True, _fake_mode(), device_model or load_device("cpu")
        model, inputs = build_fake(model_file, mode)
        captured_on = device_of(inputs, model)
    portable = kind if kind != captured_on else None
    autocast = model_file.autocast
    device_kinds = {captured_on: kind}
    time_model = local_device_model(captured_on) if local_model and device_model is None and measure_time else None
    use_cache = cache is not None and cache.enabled and measure_time and device_model is None
    timing = repeats if time_model is None else ("roofline", repr(time_model))  # what the op times depend on
    costs = None
    if device_model is not None:
        costs = f"roofline {device_model.name}" + (FAKE_COSTS if fake else "")
    elif time_model is not None:
        costs = f"roofline {time_model.name}{MEASURED_TEMPORARIES}"

    def recall(parts: tuple):  # NOTE: [Capture key]
        return cache.get("graphs", _graph_cache_key(parts, device_kinds, timing))

    phase("tracing the training step with torch.compile")
    with _fake_warnings_silenced():
        # the model was built for this capture alone: no copy of it
        captured = capture(
            model, inputs, portable, autocast, copy_model=False, recall=recall if use_cache else None
        )
    if isinstance(captured, Recalled):
        recalled = _graph_of(captured)
        if recalled is not None:
            graph, noisy, eager = recalled
            if progress:  # nothing runs, nothing is traced further
                progress.start(len(graph.ops))
                progress.advance(len(graph.ops))
            return Captured(graph, kind, costs, noisy, cached=True, eager=eager)
        with _fake_warnings_silenced():  # the output's structure changed: capture it all, and store it anew
            captured = capture(
                model, inputs, portable, autocast, copy_model=False, recall=lambda parts: None
            )
    assert not isinstance(captured, Recalled)  # recall gave nothing: the capture traced the whole step
    calls = sum(1 for g in (captured.forward, captured.backward) for n in g.graph.nodes if is_call(n))
    key = _profile_key(captured, device_kinds, timing) if use_cache else None  # NOTE: [Profile key]
    step = _step_of(cache.get("profiles", key), captured) if key is not None else None
    cached = step is not None
    if cached:
        if progress:  # no op runs: sizes, temporaries and times all come from the cache
            progress.start(calls)
            progress.advance(calls)
    else:
        phase("measuring op costs")
        if progress:
            progress.start(calls * timing_passes(measure_time, device_model or time_model))
        with mode, _fake_warnings_silenced():
            step = profile_step(
                captured, captured.example_primals, repeats, progress.advance if progress else None,
                measure_time, device_model, time_model,
            )  # fmt: skip
    assert step is not None  # from the cache when `cached`, else just profiled
    graph = build_graph(captured, step, inputs, device_kinds)
    noisy = ()
    if step.unsettled:  # their plan names, for the warning
        names = op_names(captured, step)
        noisy = tuple(dict.fromkeys(names[node] for node in step.unsettled if node in names))
    if not cached:
        if check_eager and not fake and kind == captured_on:  # NOTE: [Eager agreement]
            from remat_dsl.capture.agreement import disagreement

            phase("comparing the step with eager PyTorch")
            step.eager = disagreement(model, inputs, captured, step.outputs, step.gradients, autocast)
        step.outputs, step.gradients = [], []
        if key is not None:
            cache.put("profiles", key, _step_entry(step))
    if autocast is not None:
        graph = replace(graph, autocast=ir.Autocast(str(autocast).removeprefix("torch.")))
    if use_cache and captured.graph_key is not None:
        _keep_graph(
            cache, _graph_cache_key(captured.graph_key, device_kinds, timing), graph, noisy, captured, step.eager
        )
    return Captured(graph, kind, costs, noisy, cached, step.eager)


def local_device_model(kind: str):
    """The device description that predicts op times on this machine's device of `kind`
    (NOTE: [Load-independent costs]): `cpu`, or the shipped description of the current
    GPU; None for a GPU without one."""
    from remat_dsl.capture.cost import load_device

    if kind == "cpu":
        return load_device("cpu")
    if kind == "cuda" and torch.cuda.is_available():
        from remat_dsl.capture.gpus import device_for_gpu

        name = device_for_gpu(torch.cuda.get_device_name())
        return load_device(name) if name is not None else None
    return None


def _graph_cache_key(parts: tuple, device_kinds: dict[str, str], repeats: object) -> str:
    """NOTE: [Capture key]: fx's key of dynamo's graph, with what the profiled FB-graph
    also depends on: torch, its AOTAutograd settings and the flags that choose kernels,
    this machine and `repeats` (op times), the device kinds, and the source of this
    package's capture code."""
    from remat_dsl.plan.cache import Cache

    dispatch = (
        torch.are_deterministic_algorithms_enabled(), torch.backends.cuda.flash_sdp_enabled(),
        torch.backends.cuda.mem_efficient_sdp_enabled(), torch.backends.cuda.math_sdp_enabled(),
        torch.backends.cuda.cudnn_sdp_enabled(), torch.backends.mkldnn.is_available(),
    )  # fmt: skip  # which kernels AOTAutograd's dispatch picks (scaled-dot-product attention's)
    settings = (torch.__version__, _functorch_settings(), dispatch)
    return Cache.key(
        "profiled graph", settings, _machine(), repeats, sorted(device_kinds.items()), _code_digest(), parts
    )


def _keep_graph(cache, key: str, graph: ir.Graph, noisy: tuple[str, ...], captured, eager: tuple[str, ...]) -> None:
    """Store the profiled graph under NOTE: [Capture key], with the output structure to
    compare on a hit; a graph whose JSON does not read back equal is not stored."""
    from remat_dsl.plan.cache import decode_ir, encode_ir

    encoded = encode_ir(graph)
    if decode_ir(encoded) != graph:
        return
    cache.put("graphs", key, {
        "graph": encoded, "noisy": list(noisy), "out_spec": repr(captured.out_spec),
        "none_leaves": captured.none_leaves, "order": captured.order, "eager": list(eager),
    })  # fmt: skip


def _graph_of(recalled: Recalled) -> tuple[ir.Graph, tuple[str, ...], tuple[str, ...]] | None:
    """(graph, noisy, NOTE: [Eager agreement]'s lines) of a cache entry found by NOTE:
    [Capture key], or None when the entry is not one or the model's output is now built into
    another structure (or from the graph's outputs in another order: NOTE: [Output order]
    in fx.py)."""
    from remat_dsl.plan.cache import decode_ir

    entry = recalled.value
    try:
        if (entry["out_spec"], entry["none_leaves"], entry["order"]) != (
            recalled.out_spec,
            recalled.none_leaves,
            recalled.order,
        ):
            return None
        graph = decode_ir(entry["graph"])
        eager = tuple(str(line) for line in entry["eager"])
        noisy = tuple(str(name) for name in entry["noisy"])
        return (graph, noisy, eager) if isinstance(graph, ir.Graph) else None
    except (KeyError, TypeError, ValueError):
        return None


@functools.cache
def _code_digest() -> str:
    """SHA-256 of the source of remat_dsl.capture and remat_dsl.plan.ir: what turns the
    traced graphs into the FB-graph (NOTE: [Capture key])."""
    import hashlib

    here = Path(__file__).resolve().parent
    files = sorted(here.glob("*.py")) + [here.parent / "plan" / "ir.py"]
    digest = hashlib.sha256()
    for path in files:
        digest.update(path.name.encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()


def _functorch_settings() -> tuple:
    """AOTAutograd's settings that are plain values (a model file may patch them)."""
    import torch._functorch.config as config

    plain = (bool, int, float, str, type(None))
    return tuple(sorted((k, v) for k, v in config.get_config_copy().items() if isinstance(v, plain)))


def _machine() -> tuple:
    """What op times depend on of this machine: architecture, processor, cores, torch threads."""
    import os
    import platform

    return (platform.machine(), platform.processor(), _cpu_model(), os.cpu_count(), torch.get_num_threads())


# NOTE: [Profile key]
# The key of a cached profile is made from the captured FX graphs without running any op
# (the graph of an untimed run, every op run once under the memory profiler, would cost a
# training step under the profiler, seconds on a Llama decoder, in every warm `remat
# plan`), and the entry holds the whole step profile (each call node's outputs with their
# sizes and aliasing, temporary bytes, time, randomness), so a hit runs nothing and builds
# the same graph as the run that filled it.  What a profile depends on is in the key:
# every node of both graphs (name, op, target, arguments, the module stacks the op names
# come from, the shape, strides, dtype, device and storage offset of its value), the
# example primals' shapes, strides, dtypes, devices and shared storages, the rest of
# `Captured` that build_graph reads, the device kinds it renames, and torch, this machine
# and `repeats`.  Values are in it only for integer and bool primals (token ids, labels,
# masks): kernels take their branches and index their allocations from those, while a
# static-shape op's sizes and temporaries do not depend on floating values (nor do op
# times), and hashing weights would cost time and make the cache miss for every model file
# whose weights are not seeded.  A graph with a size that is not a number (dynamic or
# data-dependent shapes) gets no key and is measured every time.


def _profile_key(captured, device_kinds: dict[str, str], repeats: object) -> str | None:
    """NOTE: [Profile key]: the cache key of the step profile of `captured`, or None when a
    shape in its graphs is not a number (nothing is cached then)."""
    from remat_dsl.plan.cache import Cache

    try:
        nodes = [tuple(node_key(node) for node in gm.graph.nodes) for gm in (captured.forward, captured.backward)]
        primals = primal_keys(captured.example_primals)
    except NotStatic:
        return None
    structure = (
        captured.primal_names, captured.mutated, captured.num_outputs, captured.tangent_of, repr(captured.out_spec),
        repr(captured.constants), captured.none_leaves, sorted(device_kinds.items()),
    )  # fmt: skip
    return Cache.key("step profile", torch.__version__, _machine(), repeats, structure, primals, nodes)


def _step_entry(step) -> dict:
    """A StepProfile as JSON: per phase, each call node's [name, outputs, multi, time_us,
    temp_bytes, random] in graph order; an output is [shape, dtype, nbytes, alias] or None."""
    return {
        phase: [
            [
                node.name,
                [None if o is None else [list(o.shape), o.dtype, o.nbytes, o.alias] for o in info.outputs],
                info.multi,
                info.time_us,
                info.temp_bytes,
                info.random,
            ]
            for node, info in profiles.items()
        ]
        for phase, profiles in (("forward", step.forward), ("backward", step.backward))
    } | {"eager": list(step.eager)}


def _step_of(entry, captured) -> StepProfile | None:
    """The StepProfile of a `_step_entry` for `captured`'s call nodes, or None when the entry
    is missing or does not name those nodes in their order."""
    if not isinstance(entry, dict):
        return None
    step = StepProfile()
    try:
        for phase, gm, profiles in (
            ("forward", captured.forward, step.forward),
            ("backward", captured.backward, step.backward),
        ):
            nodes, rows = [n for n in gm.graph.nodes if is_call(n)], entry[phase]
            if len(nodes) != len(rows):
                return None
            for node, (name, outputs, multi, time_us, temp_bytes, random) in zip(nodes, rows):
                if name != node.name:
                    return None
                described = [
                    None if o is None else OutputInfo(tuple(int(n) for n in o[0]), str(o[1]), int(o[2]), bool(o[3]))
                    for o in outputs
                ]
                profiles[node] = NodeProfile(described, bool(multi), int(time_us), int(temp_bytes), bool(random))
        step.eager = tuple(str(line) for line in entry["eager"])
    except (KeyError, TypeError, ValueError, IndexError):
        return None
    return step


def _cpu_model() -> str:
    """The processor's name from /proc/cpuinfo (empty where there is none)."""
    try:
        with open("/proc/cpuinfo") as handle:
            return next((line.split(":", 1)[1].strip() for line in handle if line.startswith("model name")), "")
    except OSError:
        return ""


def check_plan_matches(plan, model_file: ModelFile) -> None:
    """Raise PlanError at the first line of `plan`'s graph sections that the model file
    contradicts: its inputs and parameters first (another model, other shapes), then
    every item of a fresh capture of its graph (op times and temporaries aside)."""
    import torch

    from remat_dsl.capture.fx import named_inputs
    from remat_dsl.plan.errors import PlanError

    fake = (plan.header.costs or "").endswith(FAKE_COSTS) or too_large_for_host(model_file) is not None
    model, sample = (
        build_fake(model_file, _fake_mode()) if fake else (model_file.build_model(), model_file.sample_inputs())
    )
    inputs = {name: t for name, t in named_inputs(model, sample) if isinstance(t, torch.Tensor)}
    hint = f"plan again for this model: remat plan {model_file.spec} --budget ..."
    if sorted(inputs) != sorted(d.name for d in plan.graph.inputs):
        first = plan.graph.inputs[0].span if plan.graph.inputs else None
        theirs = ", ".join(inputs) or "none"
        raise PlanError(
            f"the plan takes the inputs {', '.join(d.name for d in plan.graph.inputs)} but {model_file.spec} gives"
            f" {theirs}",
            span=first,
            hint=hint,
        )
    for decl in plan.graph.inputs:
        _check_value(decl, inputs[decl.name], "input", model_file.spec, hint)
    params = dict(model.named_parameters())
    for decl in plan.graph.parameters:
        if decl.name not in params:
            raise PlanError(
                f"the plan is for another model: {model_file.spec} has no parameter '{decl.name}'",
                span=decl.span,
                hint=hint,
                length=len(decl.name),
            )
        _check_value(decl, params[decl.name], "parameter", model_file.spec, hint)
    _check_graph(plan, model_file, hint, fake)


def _check_graph(plan, model_file: ModelFile, hint: str, fake: bool) -> None:
    from remat_dsl.capture.cost import load_device
    from remat_dsl.plan import digest
    from remat_dsl.plan.errors import PlanError
    from remat_dsl.plan.ir import Span

    device_model = load_device("cpu") if fake else None  # costs are not compared, only the graph
    autocast = getattr(torch, plan.graph.autocast.dtype) if plan.graph.autocast else None
    model_file = replace(model_file, autocast=autocast)  # the plan's autocast state, whatever the file says
    captured = capture_graph(
        model_file, measure_time=False, device_model=device_model, fake=fake, kind=plan.header.device
    ).graph
    if any(d.dims for d in plan.graph.inputs):  # NOTE: [Size probe] in remat_dsl/capture/shapes.py
        from remat_dsl.capture.shapes import dynamic_of, probe_sizes, with_sizes

        captured = with_sizes(captured, probe_sizes(model_file, dynamic_of(plan.graph.inputs), autocast))
    outputs = plan.section_span("outputs")
    ours = digest.items(plan.graph, outputs and Span(outputs.line + 1, 3), costs=False)
    theirs = digest.items(captured, costs=False)
    for index, item in enumerate(ours):
        if index >= len(theirs) or (theirs[index].section, theirs[index].text) != (item.section, item.text):
            got = theirs[index].text if index < len(theirs) else "nothing"
            raise PlanError(
                f"the model captured now differs here: {model_file.spec} gives `{got}`",
                span=item.span or plan.section_span(item.section), hint=hint,
            )
    if len(theirs) > len(ours):
        raise PlanError(
            f"the model captured now has {len(theirs) - len(ours)} more graph line(s) than the plan",
            span=plan.section_span("forward"),
            hint=hint,
        )


def _check_value(decl, tensor, what: str, spec: str, hint: str) -> None:
    from remat_dsl.plan.errors import PlanError

    actual = f"{str(tensor.dtype).removeprefix('torch.')}{list(tensor.shape)}"
    expected = f"{decl.dtype}{list(decl.shape)}"
    if actual != expected:
        raise PlanError(
            f"the plan was made for {what} '{decl.name}' {expected}, but {spec} gives {actual}",
            span=decl.span, hint=hint, length=len(decl.name),
        )
