"""Measure every operation of a captured training step on the model's device.

For each FX node that calls an operator we record what it returns (allocations with their
exact storage sizes, or views of existing storage), its temporary memory and its duration:

* sizes: `untyped_storage().nbytes()` of each output (shape x dtype for contiguous ones);
* aliasing: an output that shares storage with an argument is a view, it allocates nothing;
* temporary memory: one pass under the PyTorch profiler with a `record_function` range per
  node; the allocator's `[memory]` events inside a range give the node's own peak above
  its outputs (on CPU the raw allocator events give an exact, repeatable peak:
  docs/measured-notes.md, "Capture probe");
* duration: the least of its timed runs (microseconds): one warm-up, then `repeats` runs
  split over passes over the whole graph, more passes until two agree (NOTE: [Robust
  timing]); with
  `measure_time=False` no op is timed and every duration is 0 (sizes, aliasing and
  temporary memory still come from the one real run).

NOTE: [Robust timing]
Another job on the machine only ever slows an op down, and on a loaded 2-core machine it
can do so for whole milliseconds: one U-Net op measured 72 ms in one run and 1.2 ms in
another (issue 13), and a median of 5 runs back to back does not help when all 5 fall in
the same stall.  So each op's time is the least of its runs (the estimate of its
undisturbed time, as `timeit` advises), taken in PASSES passes over the whole graph (the
`repeats` runs split between them, so timing costs what one pass of `repeats` did): the
passes are a whole graph's timing apart, so one stall spoils at most one of them.  An op
whose two least pass minima disagree by more than SPREAD_LIMIT (and by more than
SPREAD_FLOOR_US, the timer's jitter on tiny ops) is timed again, in at most MAX_PASSES
passes in all; an op still unsettled then is listed in `StepProfile.unsettled`, which
`remat plan` and `remat profile` report, so a plan made on a busy machine says so.
The clock counts the op's own work where it can: on the GPU, CUDA events (the device's
clock); on the CPU with one torch thread, the thread's CPU time (`time.thread_time_ns`:
time another process takes from the core is not counted); with several torch threads,
wall time (the calling thread's CPU time would miss the work of the others).  Even so
a measured profile is this machine's, at this load: plans are the same everywhere only
with costs from a device description (NOTE: [Load-independent costs] in pipeline.py).

Identical calls are timed once: the calls of one operator on arguments alike in
everything its kernel sees (each tensor's shape, strides, storage offset, dtype and
device, which arguments share storage, every other argument's value) run the same code on
the same amount of data, so the least of their runs is one number.  A decoder's layers
repeat their ops, so its layers are timed as one (the 4-layer Llama of bench/models times
66 calls for its 445 ops, the GPT-2 example 89 for 310); each group is timed through its
first call, and its time, settled or not, is every member's.  A call with an integer
tensor argument (an index, a gather's positions) is timed alone, as its time may depend
on the values; so is a call with an argument of another kind than those listed.

With a device model (`remat_dsl.capture.cost.DeviceModel`, `remat plan --device`) nothing
is timed or profiled: each op's duration and temporary memory are predicted from its
shapes (roofline), so the graph may run on real tensors or on fake ones (NOTE: [Fake
capture] in pipeline.py).  Sizes and aliasing come from shapes and storage identity,
which fake tensors have too.

The RNG state is restored afterwards, so profiling draws nothing from the user's stream.
"""

from __future__ import annotations

import functools
import operator
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable

import torch
import torch.fx as fx
import torch.utils._pytree as pytree
from torch.profiler import record_function

from remat_dsl.capture.fx import DATA_READ_HINT, Captured, model_line
from remat_dsl.plan.errors import RematError
from remat_dsl.capture.measure import memory_events, memory_profiler
from remat_dsl.capture.recurrent import call_op
from remat_dsl.plan.operators import GRAD_MODE_OPS, is_view

if TYPE_CHECKING:
    from remat_dsl.capture.cost import DeviceModel


@dataclass
class OutputInfo:
    """One output of a node: an allocation (`alias` False) or a view of an argument."""

    shape: tuple[int, ...]
    dtype: str
    nbytes: int
    alias: bool


@dataclass
class NodeProfile:
    """What one FX call node did when it ran: outputs (None where it returned None)."""

    outputs: list[OutputInfo | None]
    multi: bool
    time_us: int = 0
    temp_bytes: int = 0
    random: bool = False

    @property
    def allocates(self) -> bool:
        """Whether an output is an allocation (not only views or None): what is timed."""
        return not all(o is None or o.alias for o in self.outputs)


@dataclass
class StepProfile:
    """Profiles of the forward and backward nodes, keyed by FX node."""

    forward: dict[fx.Node, NodeProfile] = field(default_factory=dict)
    backward: dict[fx.Node, NodeProfile] = field(default_factory=dict)
    unsettled: list[fx.Node] = field(default_factory=list)  # ops whose timing passes never agreed
    # the traced step's values on the sample inputs, first runs (NOTE: [Eager agreement] in
    # capture/agreement.py): the forward's model outputs, and the backward's outputs (one per
    # forward placeholder, None where it computes none); not cached
    outputs: list = field(default_factory=list, repr=False)
    gradients: list = field(default_factory=list, repr=False)
    eager: tuple[str, ...] = ()  # NOTE: [Eager agreement]'s comment lines (cached with the profile)

    @property
    def noisy(self) -> int:
        """How many ops' timing passes never agreed (NOTE: [Robust timing])."""
        return len(self.unsettled)


PASSES = 2  # timing passes over every op (NOTE: [Robust timing])
MAX_PASSES = 4  # passes in all for an op whose passes disagree
SPREAD_LIMIT = 1.5  # two pass minima further apart than this ratio disagree ...
SPREAD_FLOOR_US = 20  # ... when they also differ by more than this many microseconds


def timing_passes(measure_time: bool, device_model) -> int:
    """Progress steps per op of `profile_step`: PASSES when ops are timed, else 1."""
    return PASSES if measure_time and device_model is None else 1


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def is_call(node: fx.Node) -> bool:
    return node.op == "call_function" and node.target is not operator.getitem


def is_random(node: fx.Node) -> bool:
    target = node.target
    return isinstance(target, torch._ops.OpOverload) and torch.Tag.nondeterministic_seeded in target.tags


def _schema_is_view(node: fx.Node) -> bool:
    return isinstance(node.target, torch._ops.OpOverload) and is_view(node.target)


def profile_step(
    captured: Captured,
    inputs_by_primal: list[torch.Tensor],
    repeats: int = 5,
    progress=None,
    measure_time: bool = True,
    device_model=None,
    time_model=None,
) -> StepProfile:
    """Run the forward then the backward graph node by node and measure each node.

    inputs_by_primal: the tensors for the forward placeholders, in order (real, or fake
    with a device model).
    progress: optional callable(advance: int) for a progress bar; it advances
    `timing_passes(measure_time, device_model)` times per call node.
    measure_time: False skips the timing loop (every time_us stays 0).
    device_model: a `cost.DeviceModel`: every op's time (microseconds) and temporary bytes
    are predicted for that device instead of measured here.
    time_model: a `cost.DeviceModel` of this device: every op's time is predicted for it,
    its sizes and temporary bytes are measured here (NOTE: [Load-independent costs] in
    pipeline.py); nothing is timed.
    """
    result = StepProfile()
    devices = sorted({t.device.index or 0 for t in inputs_by_primal if t.is_cuda})
    run = _Run(repeats, progress, measure_time and time_model is None, device_model, time_model)
    with torch.random.fork_rng(devices=devices), torch.no_grad():
        env = run.graph(captured.forward, inputs_by_primal, result.forward)
        result.outputs = _model_outputs(captured, env)
        bw_inputs = _backward_inputs(captured, env, result.outputs)
        del env
        bw_env = run.graph(captured.backward, bw_inputs, result.backward)
        gradients = captured.backward.graph.output_node().args[0]
        assert isinstance(gradients, (tuple, list))  # fx: the output node's one argument holds the returned values
        result.gradients = [bw_env[n.name] if isinstance(n, fx.Node) else n for n in gradients]
    result.unsettled = run.unsettled
    return result


def _model_outputs(captured: Captured, fw_env: dict[str, object]) -> list:
    """The forward graph's model outputs (after its buffer updates), as run in `fw_env`."""
    first = len(captured.mutated)
    returned = captured.forward.graph.output_node().args[0]
    assert isinstance(returned, (tuple, list))  # fx: the output node's one argument holds the returned values
    nodes = list(returned)[first : first + captured.num_outputs]
    return [fw_env[n.name] if isinstance(n, fx.Node) else n for n in nodes]


def _backward_inputs(captured: Captured, fw_env: dict[str, object], model_outputs: list) -> list[object]:
    values: list[object] = []
    tangent_index = 0
    for node in captured.backward.graph.nodes:
        if node.op != "placeholder":
            continue
        if node.name.startswith("tangents_"):
            values.append(torch.ones_like(model_outputs[captured.tangent_of[tangent_index]]))
            tangent_index += 1
        else:
            values.append(fw_env[node.name])
    return values


@dataclass
class _Run:
    repeats: int
    progress: Callable[[int], object] | None
    measure_time: bool
    device_model: DeviceModel | None
    time_model: DeviceModel | None = None
    unsettled: list[fx.Node] = field(default_factory=list)

    def graph(self, gm: fx.GraphModule, args: list, profiles: dict) -> dict[str, object]:
        """Interpret `gm` on `args`, filling `profiles`; returns name -> value."""
        if self.device_model is not None:
            return self._predicted(gm, args, profiles)
        env: dict[str, object] = {}
        calls = []
        with memory_profiler() as prof:
            for node, fn_args, fn_kwargs, value in _interpret(gm, args, env):
                calls.append((node, fn_args, fn_kwargs))
                profiles[node] = _describe(node, value, fn_args, fn_kwargs)
        _attribute_temp(prof, [node for node, _, _ in calls], profiles)
        if self.time_model is not None:
            from remat_dsl.capture.cost import op_time_us

            for node, fn_args, fn_kwargs in calls:
                if profiles[node].allocates:
                    value = env[node.name]
                    profiles[node].time_us = op_time_us(self.time_model, node.target, fn_args, fn_kwargs, value)
        if not self.measure_time:
            if self.progress:
                self.progress(len(calls))
            return env
        groups: dict[object, list[fx.Node]] = {}  # identical calls, timed through the first
        for node, fn_args, fn_kwargs in calls:
            if profiles[node].allocates:
                groups.setdefault(_timing_key(node, fn_args, fn_kwargs) or node, []).append(node)
        firsts = {members[0] for members in groups.values()}
        timed = [c for c in calls if c[0] in firsts]
        minima: dict[fx.Node, list[int]] = {node: [] for node, _, _ in timed}
        runs = -(-self.repeats // PASSES)  # `repeats` runs in all, split over the passes
        for number in range(PASSES):  # every op, a whole graph's timing apart
            for node, fn_args, fn_kwargs in calls:
                if node in minima:
                    minima[node].append(_least_ns(node, fn_args, fn_kwargs, runs, warm_up=number == 0))
                if self.progress:
                    self.progress(1)
        for _ in range(MAX_PASSES - PASSES):  # the ops whose passes disagreed, again
            for node, fn_args, fn_kwargs in [c for c in timed if not _settled(minima[c[0]])]:
                minima[node].append(_least_ns(node, fn_args, fn_kwargs, runs, warm_up=False))
        for members in groups.values():
            samples = minima[members[0]]
            for node in members:
                profiles[node].time_us = max(1, round(min(samples) / 1000))
            if not _settled(samples):
                self.unsettled.extend(members)
        return env

    def _predicted(self, gm: fx.GraphModule, args: list, profiles: dict) -> dict[str, object]:
        from remat_dsl.capture.cost import op_temp_bytes, op_time_us

        device_model = self.device_model
        assert device_model is not None  # graph() predicts only with a device model
        env: dict[str, object] = {}
        for node, fn_args, fn_kwargs, value in _interpret(gm, args, env):
            info = profiles[node] = _describe(node, value, fn_args, fn_kwargs)
            if info.allocates:
                info.time_us = op_time_us(device_model, node.target, fn_args, fn_kwargs, value)
                info.temp_bytes = op_temp_bytes(device_model, node.target, fn_args, fn_kwargs, value)
            if self.progress:
                self.progress(1)
        return env


def _interpret(gm: fx.GraphModule, args: list, env: dict[str, object]):
    """Run `gm` node by node on `args`, filling `env`; yields (node, args, kwargs, value)
    per call node, each run inside its `record_function` range `remat::K` (K counts the
    calls)."""
    placeholders = iter(args)
    count = 0
    for node in gm.graph.nodes:
        if node.op == "placeholder":
            env[node.name] = next(placeholders)
        elif node.op == "call_function":
            fn_args, fn_kwargs = _materialize(node, env)
            if is_call(node):
                with record_function(f"remat::{count}"):
                    value = _first_run(node, fn_args, fn_kwargs)
                count += 1
                env[node.name] = value
                yield node, fn_args, fn_kwargs, value
            else:
                assert callable(node.target)  # a call_function node's target is the function it calls
                env[node.name] = node.target(*fn_args, **fn_kwargs)


def _first_run(node: fx.Node, args, kwargs):
    """The node's call on the sample inputs' values.  Raises RematError, at the model's line
    that made the op, when it fails: the first run of the captured ops on real values is
    here (NOTE: [Capture without running] in capture/fx.py), so a value that is wrong for
    the model (a token id out of the vocabulary) shows here."""
    assert callable(node.target)  # a call_function node's target is the function it calls
    try:
        return call_op(node.target, args, kwargs)
    except Exception as exc:
        lines = [line.strip() for line in str(exc).strip().splitlines() if line.strip()]
        for arg, value in zip(node.args, args):
            traced = arg.meta.get("val") if isinstance(arg, fx.Node) else None
            if not (isinstance(arg, fx.Node) and isinstance(value, torch.Tensor) and isinstance(traced, torch.Tensor)):
                continue
            if value.stride() != traced.stride():
                raise RematError(
                    f"{model_line(node)}error: operation {node.target} fails:"
                    f" {lines[0].rstrip('.') if lines else type(exc).__name__}; its input {arg.target}"
                    f" ({model_line(arg).rstrip(': ') or 'the graph'}) has strides {tuple(value.stride())}, where"
                    f" torch.compile's trace expected {tuple(traced.stride())}",
                    hint=(
                        "torch.compile's trace of this model disagrees with what the operators compute (a PyTorch bug:"
                        " torch.compile(model, backend='aot_eager', fullgraph=True) fails on it too); remat-dsl plans"
                        " the traced graph, so it cannot plan this model with this version of torch"
                    ),
                ) from None
        raise RematError(
            f"{model_line(node)}error: operation {node.target} fails on the sample inputs:"
            f" {lines[0] if lines else type(exc).__name__}",
            hint=(
                "the model's forward and backward must run in eager PyTorch on sample_inputs() (token ids within the"
                " vocabulary, matching shapes)"
            ),
        ) from None


def _materialize(node: fx.Node, env: dict[str, object]):
    def load(a):
        return env[a.name] if isinstance(a, fx.Node) else a

    return pytree.tree_map(load, node.args), pytree.tree_map(load, node.kwargs)


def _storage_id(t: torch.Tensor) -> int:
    """The identity of a tensor's storage (its StorageImpl): shared by views, and defined on
    the meta device too, where every data pointer is 0."""
    return t.untyped_storage()._cdata


def _storages(args, kwargs) -> set[int]:
    leaves = pytree.tree_leaves((args, kwargs))
    return {_storage_id(t) for t in leaves if isinstance(t, torch.Tensor) and t.untyped_storage().nbytes() > 0}


def _describe(node: fx.Node, value, args, kwargs) -> NodeProfile:
    view = _schema_is_view(node)
    inputs = _storages(args, kwargs)
    multi = isinstance(value, (tuple, list))
    outputs: list[OutputInfo | None] = []
    read = {user.args[1] for user in node.users if user.target is operator.getitem} if multi else {0}
    for index, item in enumerate(value if multi else [value]):
        if item is None or (index not in read and not isinstance(item, torch.Tensor)):
            # a number no op reads: flash attention's `max_q` and `max_k`, which the
            # trace passes on as constants (NOTE: [Fused attention] in capture/attention.py)
            outputs.append(None)
            continue
        if not isinstance(item, torch.Tensor):
            raise RematError(
                f"{model_line(node)}error: operation {node.target} returns a {type(item).__name__}, which remat-dsl"
                " cannot schedule",
                hint=DATA_READ_HINT,
            )
        storage = item.untyped_storage()
        alias = view or (storage.nbytes() > 0 and _storage_id(item) in inputs)
        outputs.append(OutputInfo(tuple(item.shape), dtype_name(item.dtype), 0 if alias else storage.nbytes(), alias))
    return NodeProfile(outputs=outputs, multi=multi, random=is_random(node))


def _attribute_temp(prof, calls: list[fx.Node], profiles: dict) -> None:
    """Temporary bytes of each call: its peak inside its profiler range above its outputs."""
    ranges = {}
    for e in prof.profiler.kineto_results.events():
        if e.name().startswith("remat::"):
            ranges[int(e.name()[7:])] = (e.start_ns(), e.start_ns() + e.duration_ns())
    memory = memory_events(prof)
    position = 0
    for index, node in enumerate(calls):
        if index not in ranges:
            continue
        start, end = ranges[index]
        while position < len(memory) and memory[position][0] < start:
            position += 1
        current = peak = 0
        while position < len(memory) and memory[position][0] <= end:
            current += memory[position][1]
            peak = max(peak, current)
            position += 1
        allocated = sum(o.nbytes for o in profiles[node].outputs if o is not None)
        profiles[node].temp_bytes = max(0, peak - allocated)


_PLAIN = (bool, int, float, str, type(None), torch.dtype, torch.device, torch.layout, torch.memory_format)


def _timing_key(node: fx.Node, args, kwargs) -> tuple | None:
    """What the call's time depends on: its operator and, per argument, a tensor's shape,
    strides, storage offset, dtype, device and the first argument sharing its storage, or
    another argument's type and value.  None (time it alone) when an argument is an
    integer tensor or of another kind (NOTE: [Robust timing], identical calls)."""
    leaves, spec = pytree.tree_flatten((args, kwargs))
    first_of: dict[int, int] = {}
    parts: list[tuple] = []
    for index, leaf in enumerate(leaves):
        if isinstance(leaf, torch.Tensor):
            if leaf.layout != torch.strided or not (
                leaf.is_floating_point() or leaf.is_complex() or leaf.dtype == torch.bool
            ):
                return None
            storage = first_of.setdefault(_storage_id(leaf), index)
            parts.append(
                (tuple(leaf.shape), leaf.stride(), leaf.storage_offset(), leaf.dtype, str(leaf.device), storage)
            )
        elif isinstance(leaf, _PLAIN):
            parts.append((type(leaf).__name__, repr(leaf)))
        else:
            return None
    return (node.target, repr(spec), tuple(parts))


def _settled(minima: list[int]) -> bool:
    """Whether the two least pass minima (ns) agree (NOTE: [Robust timing])."""
    if len(minima) < 2:
        return False
    first, second = sorted(minima)[:2]
    return second <= first * SPREAD_LIMIT or second - first <= SPREAD_FLOOR_US * 1000


def _least_ns(node: fx.Node, args, kwargs, repeats: int, warm_up: bool = True) -> int:
    """The least of `repeats` timed runs of the node's call (nanoseconds), after a warm-up
    run when `warm_up`, on the clock NOTE: [Robust timing] names."""
    target = node.target
    assert callable(target)  # a call_function node's target is the function it calls
    on_cuda = any(isinstance(t, torch.Tensor) and t.is_cuda for t in pytree.tree_leaves(args))
    if str(target) in GRAD_MODE_OPS:  # NOTE: [oneDNN workspace] in remat_dsl/plan/operators.py
        target, args, kwargs = functools.partial(call_op, target, args, kwargs), (), {}
    if warm_up:
        target(*args, **kwargs)
    if on_cuda:
        return _least_cuda_ns(target, args, kwargs, repeats)
    clock = time.thread_time_ns if torch.get_num_threads() == 1 else time.perf_counter_ns
    samples = []
    for _ in range(repeats):
        start = clock()
        target(*args, **kwargs)
        samples.append(clock() - start)
    return min(samples)


def _least_cuda_ns(target, args, kwargs, repeats: int) -> int:
    """The least of `repeats` runs timed on the GPU with CUDA events (the kernels' time on
    the device's own clock, whatever the host does meanwhile)."""
    samples = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        target(*args, **kwargs)
        end.record()
        end.synchronize()
        samples.append(round(start.elapsed_time(end) * 1e6))  # milliseconds -> nanoseconds
    return min(samples)
