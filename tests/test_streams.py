"""Issue 11, parts 3 and 4: the generated module's stream path (NOTE: [Streams] in
remat_dsl/codegen/runtime.py), run on CPU tensors by the stream emulation
(tests/stream_emulation.py: a thread per side stream, copies that complete late, an exact
check that every access is ordered), the step's host buffer, and the CPU peak.

The plan: tests/models/tiny_mlp.py planned by `remat plan --solver autograd` with offload
constraints, so that four activations (one of them a bool mask) go to the host in the
forward and come back in the backward.  Every ordering the stream code relies on is
removed in turn from the generated source to show that the emulation catches its absence.
"""

from __future__ import annotations

import ast
import dataclasses
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from remat_dsl.capture.measure import memory_profiler, training_step, unit_output_gradients
from remat_dsl.capture.model_file import load_model_file
from remat_dsl.check.replay import simulate, with_predictions
from remat_dsl.check.verify import verify
from remat_dsl.codegen.compare import compare_training, load_generated
from remat_dsl.codegen.generate import generate
from remat_dsl.plan.hostmem import PINNED_ALIGN, aligned, host_copies
from remat_dsl.plan.parser import parse, parse_file
from remat_dsl.plan.printer import print_plan
from stream_emulation import Emulation

ROOT = Path(__file__).resolve().parent.parent
TINY = ROOT / "tests" / "models" / "tiny_mlp.py"
OFFLOADS = 'offload "relu*"\noffload "drop*"\n'


def remat(*args: str) -> None:
    result = subprocess.run([sys.executable, "-m", "remat_dsl", *args], capture_output=True, text=True, cwd=ROOT)
    assert result.returncode == 0, result.stderr


@pytest.fixture(scope="module")
def planned(tmp_path_factory):
    """(model file, plan, generated source) of the tiny MLP with four offloads."""
    folder = tmp_path_factory.mktemp("streams")
    (folder / "offload.constraints").write_text(OFFLOADS)
    plan_path, module_path = folder / "tiny.plan", folder / "fast_tiny.py"
    remat(
        "plan",
        str(TINY),
        "--solver",
        "autograd",
        "--constraints",
        str(folder / "offload.constraints"),
        "--repeats",
        "1",
        "-o",
        str(plan_path),
    )
    remat("codegen", str(plan_path), "-o", str(module_path))
    plan = parse_file(str(plan_path))
    assert sorted(i.target for i in plan.forward if i.verb == "offload") == ["drop", "drop:1", "relu", "relu_1"]
    return load_model_file(str(TINY)), plan, module_path.read_text()


def load(tmp_path: Path, source: str, name: str = "fast"):
    path = tmp_path / f"{name}.py"
    path.write_text(source)
    return load_generated(path)


def emulated(module, model_file, steps: int = 3):
    """(Comparison with eager, Emulation) of `steps` SGD steps on the emulated streams."""
    emulation = Emulation()
    with emulation.running(module):
        comparison = compare_training(model_file, module, steps=steps)
    return comparison, emulation


def without(source: str, *lines: str) -> str:
    """`source` without each of `lines` (each must be there)."""
    for line in lines:
        assert line in source, line
        source = source.replace(line, "")
    return source


def plan_waits(source: str, section: str) -> list[str]:
    """The `_wait(...)` statements of the forward or backward section, with their newline."""
    forward, _, backward = source[source.index("\ndef _forward(") :].partition("\ndef _backward(")
    backward = backward.partition("\n\n\n")[0]
    return sorted(
        {
            line + "\n"
            for line in (forward if section == "forward" else backward).splitlines()
            if line.strip().startswith("_wait(")
        }
    )


# --- the emulated streams -----------------------------------------------------------------


def test_emulated_streams_train_exactly_like_eager(planned, tmp_path):
    model_file, plan, source = planned
    comparison, emulation = emulated(load(tmp_path, source), model_file)
    assert comparison.identical, comparison.mismatched
    assert emulation.problems == []
    assert emulation.unwaited == []  # every copy was due because something waited for it
    names = {emulation.name(c.stream) for c in emulation.history}
    assert names == {"d2h", "h2d"} and len(emulation.history) == 3 * 2 * 4  # steps x (offload, prefetch) x tensors


def test_a_prefetch_not_ordered_after_its_offload_fails(planned, tmp_path):
    """The race of the issue: the host-to-device copy reads the host buffer before the
    device-to-host copy wrote it.  The prefetch orders itself after the offload's event;
    without that and without the plan's `wait` after each offload (which orders it through
    the compute stream), the copy reads poison and the training differs from eager."""
    model_file, plan, source = planned
    edited = without(
        source,
        "    if written is not None:  # a parameter kept on the host has no offload to wait for\n",
        "        h2d.wait_event(written)\n",
        *plan_waits(source, "forward"),
    )
    comparison, emulation = emulated(load(tmp_path, edited), model_file, steps=1)
    assert not comparison.identical
    assert any(
        "h2d copy at tiny.plan:" in p and "of a host group that the d2h copy at tiny.plan:" in p
        for p in emulation.problems
    ), emulation.problems
    assert any("touched the same bytes at the same time" in p for p in emulation.problems), emulation.problems


SEPARATELY_NEEDED = {
    "the offload after the compute stream": (
        ["    d2h.wait_stream(_cuda.current_stream(tensor.device))\n"],
        "reads a tensor the compute stream wrote",
    ),
    "the prefetch after its allocation": (["    h2d.wait_stream(compute)\n"], "writes memory the compute stream used"),
    "the compute stream after a prefetch": (["backward"], "with no wait for it"),
    "a delete after its offload": (["forward"], "before the compute stream waited for it"),
}


@pytest.mark.parametrize("removed", SEPARATELY_NEEDED)
def test_each_ordering_is_needed(planned, tmp_path, removed):
    model_file, plan, source = planned
    lines, problem = SEPARATELY_NEEDED[removed]
    if lines in (["forward"], ["backward"]):  # the plan's `wait`s of that section
        lines = plan_waits(source, lines[0])
    _, emulation = emulated(load(tmp_path, without(source, *lines)), model_file, steps=1)
    assert any(problem in p for p in emulation.problems), emulation.problems


def test_a_prefetch_target_allocated_on_the_side_stream_is_reported(planned, tmp_path):
    """Allocated inside `with _cuda.stream(h2d)`, its block would join that stream's pool."""
    model_file, plan, source = planned
    allocation = "    tensor = torch.empty_strided(host.shape, host.stride(), dtype=host.dtype, device=device)\n"
    inside = "    with _cuda.stream(h2d):\n"
    edited = without(source, allocation).replace(inside, inside + "    " + allocation)
    _, emulation = emulated(load(tmp_path, edited), model_file, steps=1)
    assert any(
        "aten.empty_strided.default runs inside `with stream(h2d)`" in p for p in emulation.problems
    ), emulation.problems


# --- the host buffer ----------------------------------------------------------------------


def accumulate(module_or_model, model_file, inputs, backward_order=(1, 0)):
    """Two forwards, then their backwards in `backward_order`: the parameters' gradients."""
    losses = []
    for k in range(2):
        torch.manual_seed(100 + k)
        losses.append(model_file.loss_fn(module_or_model(*(x * (k + 1) for x in inputs))))
    for k in backward_order:
        losses[k].backward()


def test_host_buffers_are_never_written_while_being_read(planned, tmp_path):
    """Sequential steps, then gradient accumulation with the backwards in both orders: no
    copy into a host buffer is unordered with a copy out of it, and none overlapped one
    in time (the emulation checks both, per byte range)."""
    model_file, plan, source = planned
    module = load(tmp_path, source)
    emulation = Emulation()
    inputs = model_file.sample_inputs().args
    with emulation.running(module):
        assert compare_training(model_file, module, steps=2).identical
        fast = module.FastModel(model_file.build_model())
        for order in ((1, 0), (0, 1), (1, 0)):
            accumulate(fast, model_file, inputs, order)
    assert emulation.problems == []
    offloads = [c for c in emulation.history if emulation.name(c.stream) == "d2h"]
    assert len(offloads) == (2 + 3 * 2) * 4  # forwards x offloaded tensors: all were checked


def test_the_host_buffer_is_allocated_once_and_reused(planned, tmp_path):
    """One buffer for sequential steps; two forwards before their backwards take a second
    one, and both are reused; the accumulated gradients equal eager's exactly."""
    model_file, plan, source = planned
    module = load(tmp_path, source)
    device = torch.device("cpu")
    inputs = model_file.sample_inputs().args
    assert compare_training(model_file, module, steps=3).identical
    (first,) = module._FREE_BUFFERS[device]
    assert tuple(g.numel() for g in first) == module.POOL_GROUPS
    compare_training(model_file, module, steps=2)
    assert [b[0].data_ptr() for b in module._FREE_BUFFERS[device]] == [first[0].data_ptr()]
    eager, twin = model_file.build_model(), model_file.build_model()
    fast = module.FastModel(twin)
    for order in ((1, 0), (0, 1)):
        for m in (eager, twin):
            m.zero_grad(set_to_none=True)
        accumulate(eager, model_file, inputs, order)
        with Emulation().running(module) as emulation:
            accumulate(fast, model_file, inputs, order)
        assert emulation.problems == []
        assert all(torch.equal(a.grad, b.grad) for a, b in zip(eager.parameters(), twin.parameters()))
        buffers = {b[0].data_ptr() for b in module._FREE_BUFFERS[device]}
        assert first[0].data_ptr() in buffers and len(buffers) == 2


def test_one_buffer_for_two_steps_in_flight_gives_wrong_gradients(planned, tmp_path):
    """The test above can fail: a forward that took the free buffer without removing it
    from the free list shares it with the next forward, whose offloads overwrite it."""
    model_file, plan, source = planned
    edited = source.replace("self.groups = free.pop() if free else None", "self.groups = free[-1] if free else None")
    assert edited != source
    module = load(tmp_path, edited)
    inputs = model_file.sample_inputs().args
    eager, twin = model_file.build_model(), model_file.build_model()
    fast = module.FastModel(twin)
    accumulate(fast, model_file, inputs)  # a first step: the buffer is in the free list
    for m in (eager, twin):
        m.zero_grad(set_to_none=True)
    accumulate(eager, model_file, inputs)
    accumulate(fast, model_file, inputs)
    assert not all(torch.equal(a.grad, b.grad) for a, b in zip(eager.parameters(), twin.parameters()))


def test_host_layout_fits_the_host_peak(planned):
    """Every offloaded tensor has its own slot in the step's host groups, aligned, none
    overlapping; the groups hold the simulation's host peak (a CPU plan: the copies' bytes)
    with each copy rounded up to the alignment (NOTE: [Pinned host memory])."""
    model_file, plan, source = planned
    assert plan.header.device == "cpu"
    pool = host_copies(plan).pool
    sizes = {t.name: t.nbytes for t in plan.graph.tensors}
    assert set(pool.slots) == {i.target for i in plan.forward if i.verb == "offload"}
    assert all(offset % PINNED_ALIGN == 0 for _, offset in pool.slots.values())
    ends = sorted((group, offset, offset + sizes[name]) for name, (group, offset) in pool.slots.items())
    assert all(a[0] < b[0] or a[2] <= b[1] for a, b in zip(ends, ends[1:]))
    assert all(end <= pool.sizes[group] for group, _, end in ends)
    assert sum(sizes[name] for name in pool.slots) == simulate(plan).host_peak_bytes <= pool.nbytes
    assert pool.nbytes == sum(aligned(sizes[name]) for name in pool.slots)
    assert f"POOL_GROUPS = {pool.sizes!r}\n" in source
    for name, slot in pool.slots.items():
        var = name.replace(":", "_")
        assert f"_offload({var}, _pool, {slot!r})" in source


def test_the_generated_module_imports_torch_and_the_standard_library_only(planned):
    model_file, plan, source = planned
    tree = ast.parse(source)
    modules = {a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    modules |= {n.module.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
    assert "torch" in modules and modules <= {"torch", *sys.stdlib_module_names}


# --- the CPU peak -------------------------------------------------------------------------


def peak_without(prof, addresses: set[int]) -> int:
    """Peak of the profiler's allocator events, leaving out the blocks at `addresses`."""
    events = []

    def walk(nodes):
        for node in nodes:
            fields = node.extra_fields
            if type(fields).__name__ == "_ExtraFields_Allocation" and fields.ptr not in addresses:
                events.append((node.start_time_ns, fields.alloc_size))
            walk(node.children)

    walk(prof.profiler.kineto_results.experimental_event_tree())
    current = peak = 0
    for _, nbytes in sorted(events):
        current += nbytes
        peak = max(peak, current)
    return peak


def measured(fast, model_file) -> tuple[int, int]:
    """(peak, peak without the host buffers) of one training step on CPU (bytes), its output
    gradients made before it from an eager forward (the caller's: not counted)."""
    module = sys.modules[type(fast).__module__]
    with torch.random.fork_rng():
        grads = unit_output_gradients(model_file.build_model(), model_file.sample_inputs())
    step = training_step(fast, model_file.sample_inputs(), grads)
    fast.zero_grad(set_to_none=True)
    with torch.random.fork_rng(), memory_profiler() as prof:
        step()
    fast.zero_grad(set_to_none=True)
    buffers = {g.data_ptr() for sets in module._FREE_BUFFERS.values() for groups in sets for g in groups}
    return peak_without(prof, set()), peak_without(prof, buffers)


def test_cpu_peak_without_the_host_buffer_equals_the_prediction(planned, tmp_path):
    """The first step allocates the host buffer: left out by its address, the peak is the
    prediction; the next steps reuse it and allocate no host memory at all."""
    model_file, plan, source = planned
    module = load(tmp_path, source)
    fast = module.FastModel(model_file.build_model())
    first, first_device = measured(fast, model_file)
    assert first_device == plan.header.peak_bytes
    assert first == first_device + sum(module.POOL_GROUPS)
    assert measured(fast, model_file) == (plan.header.peak_bytes, plan.header.peak_bytes)


# --- CUDA ---------------------------------------------------------------------------------


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_streams_train_exactly_like_eager(planned, tmp_path):
    """The same plan made for CUDA trains bit for bit like eager on the GPU, the host
    buffer pinned; with gradient accumulation too."""
    from remat_dsl.capture.pipeline import capture_graph
    from remat_dsl.plan.constraints import read_constraints
    from remat_dsl.solve.driver import make_plan

    model_file, _, _ = planned
    (tmp_path / "c.constraints").write_text(OFFLOADS)
    captured = capture_graph(model_file, repeats=1)
    constraints = read_constraints(str(tmp_path / "c.constraints"))
    plan = make_plan(
        captured.graph, model=model_file.spec, device="cuda", budget=10**9, solver="autograd", constraints=constraints
    )
    module = load(tmp_path, generate(verify(plan), "tiny_cuda.plan"), "fast_cuda")
    eager, twin = model_file.build_model().cuda(), model_file.build_model().cuda()
    fast = module.FastModel(twin)
    inputs = tuple(x.cuda() for x in model_file.sample_inputs().args)
    optimizers = [torch.optim.SGD(m.parameters(), lr=0.1) for m in (eager, twin)]
    for step in range(3):
        for m, optimizer in zip((eager, fast), optimizers):
            optimizer.zero_grad(set_to_none=True)
            accumulate(m, model_file, inputs, (1, 0) if step % 2 else (0, 1))
        torch.cuda.synchronize()
        assert all(torch.equal(a.grad, b.grad) for a, b in zip(eager.parameters(), twin.parameters())), step
        for optimizer in optimizers:
            optimizer.step()
    assert all(torch.equal(a, b) for a, b in zip(eager.parameters(), twin.parameters()))
    buffers = module._FREE_BUFFERS[next(twin.parameters()).device]
    assert len(buffers) == 2 and all(b.is_pinned() for b in buffers)


def test_a_step_whose_backward_never_runs_orders_its_transfers_before_its_frees(planned, tmp_path):
    """NOTE: [Streams] 4: when autograd drops a forward's ctx without its backward, the host
    buffer (last in ctx.saved, so dropped first) makes the compute stream wait for the side
    streams before the saved tensors are freed.  The plan, edited: relu_1's offload is waited
    for and relu_1 deleted only in the backward, so the forward ends with it in flight."""
    model_file, plan, source = planned
    moved = [i for i in plan.forward if i.target == "relu_1" and i.verb in ("wait", "delete")]
    forward = tuple(i for i in plan.forward if i not in moved)
    edited = parse(print_plan(dataclasses.replace(plan, forward=forward, backward=(*moved, *plan.backward))))
    edited = with_predictions(edited, simulate(edited))
    module = load(tmp_path, generate(verify(edited, within_budget=False), "edited.plan"))
    with Emulation().running(module) as emulation:
        fast = module.FastModel(model_file.build_model())
        fast(*model_file.sample_inputs().args)  # its output dropped: no backward
        assert len(module._FREE_BUFFERS[torch.device("cpu")]) == 1  # given back by the dropped step
        assert compare_training(model_file, module, steps=1).identical
    assert emulation.problems == []
