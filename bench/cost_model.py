"""Cost model against measurements: predicted op times on the CPU vs measured ones.

For each example (gpt2, transformer, resnet, unet), in ONE run, this captures the training
step (`remat_dsl.capture.fx.capture`), measures every operation with
`remat_dsl.capture.profile.profile_step` (the time_us the planner would use) and predicts
it with `remat_dsl.capture.cost.op_time_us(load_device("cpu"), ...)` on the same nodes,
their arguments and outputs taken from an interpretation of the FX graphs.  It prints:

* per example and over all, the median and 90th percentile of predicted/measured per
  operation and the median per-op error |predicted/measured - 1| (goal: within 25%),
  every operation weighted alike; views (measured time 0) are left out.  "Measured" is
  the op's time in a step (`in_step_us`): the captured forward and backward graphs run op
  after op on fresh inputs, as a generated module runs them, each op timed once per run.
  (profile_step's time, which times each op again and again on inputs it has just used,
  is 1.2 to 2.2 times shorter on these examples: warm caches; its sum is the "profiled"
  column, what a plan from measured costs predicts.)
* the whole-step error: the predicted sum of the step's op times (views left out, as a
  plan counts them) against the measured time of an eager training step
  (`remat_dsl.capture.measure.step_seconds`), goal within 15%; beside it the in-step
  sum, the profiled sum and one call of the captured forward and backward GraphModules
  ("graph", no autograd).

Measurements are repeated `--rounds` times, interleaved: every round profiles each
example's ops and times its eager step, one example after the other, so that this noisy
machine's load hits all alike.  Within a round each op's time is the median of
`--repeats` runs (profile_step) and so is the step's (step_seconds); over the rounds we
keep the smallest, ops and steps alike: another job on this 2-core machine only ever
slows a round down (two threads stall at every barrier while it holds a core).

`--fit` fits the cpu.toml figures that the measurements determine (matmul and vector
FLOP/s for float32, the convolution efficiency, the memory bandwidth, the launch
latency) by least absolute deviations of log(predicted/measured) over every operation
(coordinate descent on a log grid), prints them as cpu.toml lines, and reports the
figures above with the fitted device as well as with the shipped one.  It also measures
host-to-device and device-to-host bandwidth as the copy rate of a 64 MiB tensor (both
are host memory on a CPU), the host update rate as the bytes of a 64 MiB float32 parameter
that one step of torch.optim.AdamW (PyTorch's default implementation on CPU tensors)
updates a second, and the host update overhead as such a step's time on a 1-element
parameter.

Threads: torch's default (2 on this 2-core machine) unless `--threads N`: cpu.toml
describes the device as PyTorch runs it by default.  Another process holding a core
stalls two threads at every barrier, so check the machine is idle before timing.

`--leave-one-out` fits the same figures on every example but one and reports the one left
out: how well the roofline's form predicts ops it was not fitted on, in the same run, apart
from how much this machine's speed changes from one run to the next (30-40% here).

It measures the captured graphs' ops one by one (remat_dsl.capture.fx and .profile), which
the API does not expose.  Writes its section of docs/measurements.md (bench/_common.py),
unless `--no-write`.

Usage: python bench/cost_model.py [--fit] [--leave-one-out] [--rounds 3] [--repeats 10] [--threads N] [--no-write]
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import os
import statistics
import sys
import time
from collections import defaultdict
from pathlib import Path

import torch
import torch.fx as fx
import torch.utils._pytree as pytree

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import ROOT, Report, add_write_flag  # noqa: E402

from remat_dsl.capture.cost import DeviceModel, Work, load_device, op_work, roofline_seconds  # noqa: E402
from remat_dsl.capture.fx import Captured, capture  # noqa: E402
from remat_dsl.capture.measure import step_seconds  # noqa: E402
import remat_dsl  # noqa: E402
from remat_dsl.capture.profile import is_call, profile_step  # noqa: E402

EXAMPLES = ["examples/gpt2.py", "examples/transformer.py", "examples/resnet.py", "examples/unet.py"]
ABOUT = """The CPU roofline model (remat_dsl/capture/devices/cpu.toml) against measured op times
on the examples: per op, predicted over measured (median, 90th percentile, median error
|predicted/measured - 1|, goal within 25%); per step, the predicted sum against an eager
training step timed in the same rounds (goal within 15%).  The machine's own speed moves
30-40% between runs: calibrate (`--fit`) on an idle machine."""
FITTED = ("matmul_flops", "vector_flops", "conv_efficiency", "memory_bandwidth", "launch_latency")


@dataclasses.dataclass
class Op:
    """One timed operation: where it is, what it does and its measured microseconds."""

    example: str
    name: str
    op: str
    work: Work
    measured_us: list[float]  # in a step: once per step run, median per round (see in_step_us)
    profiled_us: list[int] = dataclasses.field(default_factory=list)  # profile_step's, per round


@dataclasses.dataclass
class Example:
    name: str
    model: torch.nn.Module
    inputs: object
    captured: Captured
    ops: dict[fx.Node, Op]
    eager_s: list[float]
    graph_s: list[float]


# ---------------------------------------------------------------------------
# Measuring
# ---------------------------------------------------------------------------


def load_example(path: str) -> Example:
    """Capture one example and compute the work of every op that allocates (views aside)."""
    model_file = remat_dsl.model_of(str(ROOT / path))
    model, inputs = model_file.build_model(), model_file.sample_inputs()
    captured = capture(model, inputs)
    step = profile_step(captured, captured.example_primals, repeats=1, measure_time=False)
    allocating = {n for profiles in (step.forward, step.backward) for n, p in profiles.items() if p.allocates}
    name = Path(path).stem
    ops = {}
    for node, args, kwargs, value in interpret(captured):
        if node in allocating:
            ops[node] = Op(name, node.name, str(node.target), op_work(node.target, args, kwargs, value), [])
    return Example(name, model, inputs, captured, ops, [], [])


def interpret(captured: Captured, timed: dict | None = None):
    """(node, args, kwargs, output) of every call of the forward then the backward graph,
    run on real tensors as profile_step runs them (unit output gradients).  timed: filled
    with each call node's wall time (seconds) in this run."""
    calls = []
    with torch.random.fork_rng(), torch.no_grad():
        forward = _run(captured.forward, captured.example_primals, calls, timed)
        outputs = list(captured.forward.graph.output_node().args[0])
        first = len(captured.mutated)
        model_outputs = [forward[n.name] for n in outputs[first : first + captured.num_outputs]]
        inputs, tangent = [], 0
        for node in captured.backward.graph.nodes:
            if node.op != "placeholder":
                continue
            if node.name.startswith("tangents_"):
                inputs.append(torch.ones_like(model_outputs[captured.tangent_of[tangent]]))
                tangent += 1
            else:
                inputs.append(forward[node.name])
        _run(captured.backward, inputs, calls, timed)
    return calls


def _run(gm: fx.GraphModule, args: list, calls: list, timed: dict | None = None) -> dict[str, object]:
    env: dict[str, object] = {}
    placeholders = iter(args)
    for node in gm.graph.nodes:
        if node.op == "placeholder":
            env[node.name] = next(placeholders)
        elif node.op == "call_function":
            fn_args, fn_kwargs = pytree.tree_map(
                lambda a: env[a.name] if isinstance(a, fx.Node) else a, (node.args, node.kwargs)
            )
            start = time.perf_counter()
            env[node.name] = node.target(*fn_args, **fn_kwargs)
            if timed is not None:
                timed[node] = time.perf_counter() - start
            if is_call(node):
                calls.append((node, fn_args, fn_kwargs, env[node.name]))
    return env


def in_step_us(captured: Captured, repeats: int) -> dict[fx.Node, float]:
    """Each call node's time (us) as a step runs it: the forward then the backward graph op
    after op, each op timed once per run on inputs made earlier in the run (as a
    generated module runs them), median over `repeats` runs after one warm-up run."""
    samples: dict[fx.Node, list[float]] = defaultdict(list)
    for index in range(repeats + 1):
        timed: dict[fx.Node, float] = {}
        interpret(captured, timed)
        if index:
            for node, seconds in timed.items():
                samples[node].append(seconds * 1e6)
    return {node: statistics.median(values) for node, values in samples.items()}


def measure(examples: list[Example], rounds: int, repeats: int) -> None:
    """Fill every op's measured times (in a step, and profile_step's) and every example's
    eager step times, interleaved."""
    for round_index in range(rounds):
        for example in examples:
            for node, us in in_step_us(example.captured, repeats).items():
                if node in example.ops:
                    example.ops[node].measured_us.append(us)
            step = profile_step(example.captured, example.captured.example_primals, repeats=repeats)
            for node, profile in (*step.forward.items(), *step.backward.items()):
                if node in example.ops:
                    example.ops[node].profiled_us.append(profile.time_us)
            example.eager_s.append(step_seconds(example.model, example.inputs, repeats=repeats))
            example.graph_s.append(graph_seconds(example.captured, repeats))
        print(f"round {round_index + 1}/{rounds} done", file=sys.stderr)


def graph_seconds(captured: Captured, repeats: int) -> float:
    """Median wall time (seconds) of one call of the forward GraphModule and one of the
    backward (their generated Python code, op after op, no autograd), after one warm-up."""
    names = [n.name for n in captured.forward.graph.output_node().args[0]]
    first = len(captured.mutated)
    placeholders = [n for n in captured.backward.graph.nodes if n.op == "placeholder"]

    def step() -> None:
        outputs = dict(zip(names, captured.forward(*captured.example_primals)))
        model_outputs = [outputs[name] for name in names[first : first + captured.num_outputs]]
        tangents = iter(captured.tangent_of)
        inputs = [
            torch.ones_like(model_outputs[next(tangents)]) if n.name.startswith("tangents_") else outputs[n.name]
            for n in placeholders
        ]
        captured.backward(*inputs)

    samples = []
    with torch.random.fork_rng(), torch.no_grad():
        for index in range(repeats + 1):
            start = time.perf_counter()
            step()
            if index:
                samples.append(time.perf_counter() - start)
    return statistics.median(samples)


def copy_bandwidth(nbytes: int = 64 << 20, repeats: int = 10) -> float:
    """Bytes/s of copying a `nbytes` float32 tensor into another (median of `repeats`)."""
    source, target = torch.randn(nbytes // 4), torch.empty(nbytes // 4)
    target.copy_(source)
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        target.copy_(source)
        samples.append(time.perf_counter() - start)
    return nbytes / statistics.median(samples)


def host_update_rate(nbytes: int = 64 << 20, repeats: int = 10) -> float:
    """Bytes/s of float32 parameters that torch.optim.AdamW, as PyTorch runs it on CPU
    tensors by default, updates: one step of a `nbytes` parameter with its gradient and two
    optimizer states (median of `repeats`, after the step that creates the states)."""
    parameter = torch.nn.Parameter(torch.randn(nbytes // 4))
    parameter.grad = torch.randn(nbytes // 4)
    optimizer = torch.optim.AdamW([parameter], lr=1e-3)
    optimizer.step()
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        optimizer.step()
        samples.append(time.perf_counter() - start)
    return nbytes / statistics.median(samples)


def host_update_overhead(repeats: int = 2000) -> float:
    """Seconds of one default AdamW step on a 1-element parameter: what a host update
    costs beyond its bytes (median of `repeats`, after 100 warm-up steps)."""
    parameter = torch.nn.Parameter(torch.randn(1))
    parameter.grad = torch.randn(1)
    optimizer = torch.optim.AdamW([parameter], lr=1e-3)
    for _ in range(100):
        optimizer.step()
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        optimizer.step()
        samples.append(time.perf_counter() - start)
    return statistics.median(samples)


# ---------------------------------------------------------------------------
# Comparing
# ---------------------------------------------------------------------------


def predicted_us(device: DeviceModel, op: Op) -> int:
    """What op_time_us returns for the op (the same rounding)."""
    return max(1, round(roofline_seconds(device, op.work) * 1e6))


def measured(op: Op) -> float:
    """The op's time in a step (us): the smallest of its rounds' medians."""
    return min(op.measured_us)


def profiled(op: Op) -> float:
    """The op's time as profile_step measures it for plans (us): the smallest of its rounds'."""
    return min(op.profiled_us)


def quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    position = q * (len(ordered) - 1)
    low, high = math.floor(position), math.ceil(position)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def report(device: DeviceModel, examples: list[Example]) -> None:
    print(f"device {device.name}: per-op predicted/measured (views left out), whole step vs eager")
    print(
        f"{'example':<12} {'ops':>5} {'median':>7} {'p90':>7} {'med err':>8} {'predicted':>10} {'in-step':>10} "
        f"{'profiled':>10} {'graph':>10} {'eager':>10} {'vs eager':>9} {'vs in-step':>10}"
    )
    everything = []
    for example in examples:
        ops = list(example.ops.values())
        everything += ops
        ratios = [predicted_us(device, op) / measured(op) for op in ops]
        predicted_ms = sum(predicted_us(device, op) for op in ops) / 1000
        in_step_ms = sum(measured(op) for op in ops) / 1000
        op_sum_ms = sum(profiled(op) for op in ops) / 1000
        eager_ms, graph_ms = min(example.eager_s) * 1000, min(example.graph_s) * 1000
        print(
            f"{example.name:<12} {len(ops):>5} {statistics.median(ratios):>7.3f} {quantile(ratios, 0.9):>7.3f} "
            f"{statistics.median(abs(r - 1) for r in ratios):>7.1%} {predicted_ms:>7.2f} ms {in_step_ms:>7.2f} ms "
            f"{op_sum_ms:>7.2f} ms {graph_ms:>7.2f} ms {eager_ms:>7.2f} ms "
            f"{predicted_ms / eager_ms - 1:>+8.1%} {predicted_ms / in_step_ms - 1:>+9.1%}"
        )
    ratios = [predicted_us(device, op) / measured(op) for op in everything]
    print(
        f"{'all':<12} {len(everything):>5} {statistics.median(ratios):>7.3f} {quantile(ratios, 0.9):>7.3f} "
        f"{statistics.median(abs(r - 1) for r in ratios):>7.1%}"
    )
    by_op = defaultdict(list)
    for op, ratio in zip(everything, ratios):
        by_op[op.op].append(ratio)
    worst = sorted(by_op.items(), key=lambda item: -sum(abs(math.log(r)) for r in item[1]))[:8]
    print(
        "largest total |log error| by operator: "
        + ", ".join(f"{name.removeprefix('aten.')} x{len(r)} median {statistics.median(r):.2f}" for name, r in worst)
    )


# ---------------------------------------------------------------------------
# Fitting
# ---------------------------------------------------------------------------


def loss(device: DeviceModel, ops: list[Op]) -> float:
    """Sum of |log(predicted/measured)| over the ops (unrounded predictions): least
    absolute deviations, which aim at the median as the goal does, and which the few ops
    a burst of load slowed in every round pull less than squares would."""
    return sum(abs(math.log(roofline_seconds(device, op.work) * 1e6 / measured(op))) for op in ops)


def with_value(device: DeviceModel, key: str, value: float) -> DeviceModel:
    if key in ("matmul_flops", "vector_flops"):
        return dataclasses.replace(device, **{key: {**getattr(device, key), "float32": value}})
    return dataclasses.replace(device, **{key: value})


def value_of(device: DeviceModel, key: str) -> float:
    return getattr(device, key)["float32"] if key in ("matmul_flops", "vector_flops") else getattr(device, key)


def fit(device: DeviceModel, ops: list[Op], sweeps: int = 10) -> DeviceModel:
    """Coordinate descent on a log grid: each sweep scans every figure over 41 values from
    1/e^span to e^span times its value (the efficiency capped at 1), keeps the best, and
    halves the span (2 at first: the shipped figures may be 7 times off)."""
    best = loss(device, ops)
    span = 2.0
    for _ in range(sweeps):
        for key in FITTED:
            start = value_of(device, key)
            for step in range(-20, 21):
                value = start * math.exp(span * step / 20)
                if key == "conv_efficiency":
                    value = min(value, 1.0)
                candidate = with_value(device, key, value)
                score = loss(candidate, ops)
                if score < best:
                    best, device = score, candidate
        span /= 2
    return device


def cpu_toml_lines(device: DeviceModel) -> str:
    return "\n".join(
        [
            f"memory_bandwidth = {device.memory_bandwidth:.3g}",
            f"host_to_device = {device.host_to_device:.3g}",
            f"device_to_host = {device.device_to_host:.3g}",
            f"host_update = {device.host_update:.3g}",
            f"host_update_overhead = {device.host_update_overhead:.3g}",
            f"launch_latency = {device.launch_latency:.3g}",
            f"conv_efficiency = {device.conv_efficiency:.3g}",
            f"matmul_flops.float32 = {device.matmul_flops['float32']:.3g}",
            f"vector_flops.float32 = {device.vector_flops['float32']:.3g}",
            f"memory = {os.sysconf('SC_PAGE_SIZE') * os.sysconf('SC_PHYS_PAGES'):.3g}",
        ]
    )


def main() -> int:
    parser = add_write_flag(argparse.ArgumentParser(description=__doc__.splitlines()[0]))
    parser.add_argument("--fit", action="store_true", help="fit the cpu.toml figures and print them")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved measuring rounds (default 3)")
    parser.add_argument(
        "--repeats", type=int, default=10, help="timed runs per op and per eager step in a round (default 10)"
    )
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's default)")
    parser.add_argument(
        "--leave-one-out",
        action="store_true",
        help="also fit on all examples but one and report the one left out: the model's error apart from the "
        "machine's speed changing between runs",
    )
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    report = Report("bench/cost_model.py", "The CPU cost model against measured op times", ABOUT)
    with report.tee():
        run(args)
    report.write(args)
    return 0


def run(args: argparse.Namespace) -> None:
    print(
        f"torch {torch.__version__}, {torch.get_num_threads()} threads, {os.cpu_count()} cores, "
        f"load average {os.getloadavg()[0]:.2f}"
    )
    examples = [load_example(path) for path in EXAMPLES]
    measure(examples, args.rounds, args.repeats)
    shipped = load_device("cpu")
    report(shipped, examples)
    if args.fit:
        ops = [op for example in examples for op in example.ops.values()]
        fitted = fit(shipped, ops)
        rate = copy_bandwidth()
        fitted = dataclasses.replace(
            fitted,
            name="cpu (fitted)",
            host_to_device=rate,
            device_to_host=rate,
            host_update=host_update_rate(),
            host_update_overhead=host_update_overhead(),
        )
        print(
            f"\nfitted (least absolute log error over {len(ops)} ops; paste into remat_dsl/capture/devices/cpu.toml):"
        )
        print(cpu_toml_lines(fitted))
        report(fitted, examples)
    if args.leave_one_out:
        print("\nleave one example out: each example predicted with figures fitted in this run on the others only")
        for held in examples:
            rest = [op for example in examples if example is not held for op in example.ops.values()]
            report(dataclasses.replace(fit(shipped, rest), name=f"cpu (fitted without {held.name})"), [held])
    print(f"load average at the end {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    sys.exit(main())
