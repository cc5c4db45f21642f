"""Paged optimizer states (NOTE: [Paged optimizer states] in remat_dsl/plan/optimizer.py):
the tiny MLP's whole-step plan with every device update's states kept in host memory and
copied to the device around the update, trained 3 steps by the generated module beside
eager torch.optim, bit for bit, with the measured peak of a step equal to the predicted
one; edited plans that misplace a states transfer refused by `remat check`."""

from __future__ import annotations

import copy
import dataclasses
import math
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from remat_dsl import generate_module, load_module, plan_model, plan_text
from remat_dsl.capture.measure import peak_bytes, training_step
from remat_dsl.capture.model_file import Inputs, load_model_file
from remat_dsl.check.replay import simulate, with_predictions
from remat_dsl.plan.ir import with_gradient_zeros
from remat_dsl.plan.optimizer import parse_optimizer
from remat_dsl.plan.parser import parse
from remat_dsl.solve.lowering import add_paged_states, add_parameter_streaming, add_updates

ROOT = Path(__file__).resolve().parents[1]
OPTIMIZERS = {
    "adamw": ("adamw lr=0.01 weight_decay=0.1", lambda params: torch.optim.AdamW(params, lr=0.01, weight_decay=0.1)),
    "sgd": ("sgd lr=0.05 momentum=0.9", lambda params: torch.optim.SGD(params, lr=0.05, momentum=0.9)),
}


def _tiny():
    model_file = load_model_file(str(ROOT / "tests" / "models" / "tiny_mlp.py"))
    return model_file.build(), model_file.inputs()


def _paged_plan(kind: str):
    """The tiny MLP's whole-step plan with ample memory (every update on the device), its
    device updates then paged."""
    model, inputs = _tiny()
    plan = plan_model(model, inputs, 10**9, optimizer=OPTIMIZERS[kind][0])
    updated = {i.target for i in plan.backward if i.verb == "update"}
    assert updated, "the ample budget updates on the device"
    paged = add_paged_states(plan, updated)
    return with_predictions(paged, simulate(paged)), plan, model, inputs


def _train_beside(fast, eager, eager_opt, inputs, steps: int = 3) -> None:
    """`steps` training steps of the generated module (its updates in the backward) and of
    eager with its optimizer, from the same seeds (the same dropout masks)."""
    for step in range(steps):
        torch.manual_seed(step)
        eager(*inputs).square().mean().backward()
        eager_opt.step()
        eager_opt.zero_grad()
        torch.manual_seed(step)
        fast(*inputs).square().mean().backward()


def _checked_generated_and_trained(plan, kind, eager, inputs, tmp_path, marker):
    """`plan` accepted by `remat check`, its module (which calls `marker`) trained 3 steps
    beside eager with the optimizer `kind`: parameters, buffers and optimizer states equal
    eager's after.  Returns (the FastModel, its model)."""
    path = tmp_path / "step.plan"
    path.write_text(plan_text(plan))
    checked = subprocess.run([sys.executable, "-m", "remat_dsl", "check", str(path)], capture_output=True, text=True)
    assert checked.returncode == 0, checked.stderr
    source = tmp_path / "fast_step.py"
    source.write_text(generate_module(path))
    assert marker in source.read_text()
    make = OPTIMIZERS[kind][1]
    ours = copy.deepcopy(eager)
    fast = load_module(source).FastModel(ours, optimizer=make(ours.parameters()))
    eager_opt = make(eager.parameters())
    _train_beside(fast, eager, eager_opt, inputs)
    for (name, a), b in zip(eager.state_dict().items(), ours.state_dict().values()):
        assert torch.equal(a, b), name
    theirs, kept = eager_opt.state_dict()["state"], fast.optimizer.state_dict()["state"]
    assert theirs.keys() == kept.keys()
    for index, a in theirs.items():  # the host copies are eager's states
        assert a.keys() == kept[index].keys() and all(torch.equal(a[k], kept[index][k]) for k in a), index
    return fast, ours


@pytest.mark.parametrize("kind", list(OPTIMIZERS))
def test_paged_states_train_bit_exactly_with_the_predicted_peak(kind, tmp_path):
    plan, unpaged, eager, inputs = _paged_plan(kind)
    verbs = [i.verb for i in plan.backward]
    assert {"prefetch_states", "offload_states", "wait_states"} <= set(verbs)
    optimizer = parse_optimizer(plan.header.optimizer)
    states = sum(optimizer.state_bytes(p.numel() * p.element_size()) for p in eager.parameters())
    sim, before = simulate(plan), simulate(unpaged)
    assert sim.host_peak_bytes == before.host_peak_bytes + states  # the states live in host memory
    assert sim.peak_bytes < before.peak_bytes  # only one update's states at a time on the device
    assert sim.time_us > before.time_us  # the copies the step waits for

    fast, ours = _checked_generated_and_trained(plan, kind, eager, inputs, tmp_path, "_s.optimizers.prefetch_states(")

    # the states' host copies, like the parameters, are held before the step measured
    step = training_step(fast, Inputs(args=tuple(inputs)))
    step()
    resident = sum(p.numel() * p.element_size() for p in ours.parameters())
    given = simulate(dataclasses.replace(plan, graph=with_gradient_zeros(plan.graph, -1))).peak_bytes
    assert peak_bytes(step) + resident == given


def _trained_on_emulated_streams(module, kind, eager, inputs):
    """The generated `module` trained 3 steps beside eager with the optimizer `kind` on the
    stream emulation (tests/stream_emulation.py): no access unordered with a copy, no copy
    left unwaited, eager's parameters after.  Returns the emulation."""
    from stream_emulation import Emulation

    make = OPTIMIZERS[kind][1]
    ours = copy.deepcopy(eager)
    fast = module.FastModel(ours, optimizer=make(ours.parameters()))
    eager_opt = make(eager.parameters())
    emulation = Emulation()
    with emulation.running(module):
        _train_beside(fast, eager, eager_opt, inputs)
    assert emulation.problems == []
    assert emulation.unwaited == []
    for (name, a), b in zip(eager.named_parameters(), ours.parameters()):
        assert torch.equal(a, b), name
    return emulation


def test_paged_states_on_emulated_streams_are_ordered_and_exact(tmp_path):
    """The CUDA path of the states' copies (NOTE: [Streams] in remat_dsl/codegen/runtime.py)
    on the stream emulation (tests/stream_emulation.py): no access unordered with a copy, no
    copy left unwaited, and the same parameters as eager after 3 SGD-momentum steps."""

    plan, _, eager, inputs = _paged_plan("sgd")
    path = tmp_path / "paged.plan"
    path.write_text(plan_text(plan))
    source = tmp_path / "fast_paged.py"
    source.write_text(generate_module(path))
    emulation = _trained_on_emulated_streams(load_module(source), "sgd", eager, inputs)
    names = {emulation.name(c.stream) for c in emulation.history}
    assert names == {"d2h", "h2d"}


def test_an_update_not_ordered_after_its_states_prefetch_is_caught_by_the_emulation(tmp_path):
    """The emulation can fail the test above: without the first `wait_states` the update
    writes states the h2d copy has not finished."""
    from stream_emulation import Emulation

    plan, _, eager, inputs = _paged_plan("sgd")
    path = tmp_path / "paged.plan"
    path.write_text(plan_text(plan))
    lines = generate_module(path).splitlines(keepends=True)
    first = next(i for i, line in enumerate(lines) if "_s.optimizers.wait_states(" in line)
    source = tmp_path / "fast_unordered.py"
    source.write_text("".join(lines[:first] + lines[first + 1 :]))
    module = load_module(source)
    fast = module.FastModel(eager, optimizer=OPTIMIZERS["sgd"][1](eager.parameters()))
    emulation = Emulation()
    with emulation.running(module):
        for _ in range(2):  # the first step has no states to prefetch
            fast(*inputs).square().mean().backward()
    assert any("of the h2d copy at" in p and "with no wait for it" in p for p in emulation.problems), emulation.problems


def _edit(text: str, edit) -> str:
    lines = text.splitlines(keepends=True)
    return "".join(edit(lines))


def _drop_first(verb):
    def edit(lines):
        at = next(i for i, line in enumerate(lines) if line.split()[:1] == [verb])
        return lines[:at] + lines[at + 1 :]

    return edit


def _move_update_before_its_prefetch(lines):
    at = next(i for i, line in enumerate(lines) if line.split()[:1] == ["update"])
    target = lines[at].split()[1]
    start = next(i for i, line in enumerate(lines) if line.split()[:2] == ["prefetch_states", target])
    return lines[:start] + [lines[at]] + lines[start:at] + lines[at + 1 :]


def _drop_paged_update(lines):
    target = next(line.split()[1] for line in lines if line.split()[:1] == ["update"])
    verbs = ("update", "prefetch_states", "wait_states", "offload_states")
    return [line for line in lines if not (line.split()[:1] and line.split()[0] in verbs and line.split()[1] == target)]


def _repeat_first_update(lines):
    at = next(i for i, line in enumerate(lines) if line.split()[:1] == ["update"])
    return lines[: at + 1] + [lines[at]] + lines[at + 1 :]


@pytest.mark.parametrize(
    "edit, words",
    [
        (_drop_first("wait_states"), "the prefetch of its optimizer states"),
        (_drop_first("offload_states"), "nothing to wait for: the optimizer states of"),
        (_drop_first("prefetch_states"), "optimizer states are not paged"),
        (_move_update_before_its_prefetch, "its paged optimizer states are not on the device"),
        (_drop_first("update"), "before its update: the update's new states would not reach host memory"),
        (_repeat_first_update, "is updated twice"),
        (_drop_paged_update, "is never updated"),
    ],
    ids=[
        "unwaited",
        "never-offloaded",
        "never-prefetched",
        "update-first",
        "dropped-update",
        "repeated-update",
        "dropped-paged-update",
    ],
)
def test_misplaced_states_transfers_are_refused(edit, words, tmp_path):
    plan, _, _, _ = _paged_plan("adamw")
    path = tmp_path / "edited.plan"
    path.write_text(_edit(plan_text(plan), edit))
    result = subprocess.run([sys.executable, "-m", "remat_dsl", "check", str(path)], capture_output=True, text=True)
    assert result.returncode == 2, result.stderr
    assert words in result.stderr, result.stderr
    assert "hint:" in result.stderr and "Traceback" not in result.stderr


def test_the_planner_pages_the_states_when_that_is_the_fastest_plan_that_fits(tmp_path):
    """On an RTX 3060 a budget below the tiny MLP's parameters, gradients and states held on
    the device: every host update costs the host's management time per step (thesis eq.
    4.23's H, 50 ms), paging the states costs microseconds of copies, so the planner keeps
    the paged plan (NOTE: [Optimizer placement] in remat_dsl/solve/driver.py)."""
    model, _ = _tiny()
    params = sum(p.numel() * p.element_size() for p in model.parameters())
    budget = int(1.2 * 4 * params)  # parameters, gradients and AdamW's two states: 4 x the parameters
    path = tmp_path / "tiny.plan"
    made = subprocess.run(
        [sys.executable, "-m", "remat_dsl", "plan", "tests/models/tiny_mlp.py", "--device", "rtx3060",
         "--optimizer", "adamw lr=0.01", "--budget", f"{budget}B", "-o", str(path)],
        capture_output=True, text=True, cwd=ROOT,
    )  # fmt: skip
    assert made.returncode == 0, made.stderr
    checked = subprocess.run([sys.executable, "-m", "remat_dsl", "check", str(path)], capture_output=True, text=True)
    assert checked.returncode == 0, checked.stderr
    plan = parse(path.read_text())
    verbs = [i.verb for i in plan.backward]
    trainable = {p.name for p in plan.graph.parameters}
    # the search pages every update's states; the placement LP (NOTE: [Placement candidate])
    # pages some and streams the others, faster: either way no host update
    assert set() < {i.target for i in plan.backward if i.verb == "prefetch_states"} <= trainable
    assert "host_update" not in verbs
    assert plan.header.peak_bytes <= budget
    held = [i for i in plan.backward if not i.verb.endswith("_states")]  # the same plan, its states on the device
    assert simulate(dataclasses.replace(plan, backward=tuple(held))).peak_bytes > budget
    assert plan.header.time_us < plan.header.host_update_overhead_us  # below what any host update costs


# ---------------------------------------------------------------------------
# Streamed parameters updated on the device (NOTE: [Parameters on the host] in
# remat_dsl/check/replay.py): prefetched, updated with their states paged, written back
# ---------------------------------------------------------------------------


def _streamed_plan(kind: str):
    """The tiny MLP's whole-step plan with every parameter but the smallest (the generated
    module finds its device by it) kept in host memory, each updated on the device with its
    states paged and written back to its host copy."""
    model, inputs = _tiny()
    plan = plan_model(model, inputs, 10**9, optimizer=OPTIMIZERS[kind][0])
    smallest = min(plan.graph.parameters, key=lambda p: math.prod(p.shape)).name
    streamed = [p.name for p in plan.graph.parameters if p.name != smallest]
    updated = {i.target for i in plan.backward if i.verb == "update"}
    edited = add_paged_states(add_parameter_streaming(plan, streamed), updated)
    return with_predictions(edited, simulate(edited)), plan, model, inputs, set(streamed)


def _mixed_plan(kind: str, lead: int = 8):
    """The streamed plan of `_streamed_plan` placed as the planner's mixed attempts place it
    (NOTE: [Optimizer placement] in remat_dsl/solve/driver.py): head.weight, whose gradient
    is complete first, updated on the host where it lives, the others on the device with
    paged states, every copy `lead` ops ahead of its use or after its update."""
    model, inputs = _tiny()
    plan = plan_model(model, inputs, 10**9, optimizer=OPTIMIZERS[kind][0])
    header = plan.header
    solved = dataclasses.replace(plan, backward=tuple(i for i in plan.backward if i.verb != "update"))
    speeds = (header.device_update, header.host_update, header.host_update_overhead_us)
    smallest = min(plan.graph.parameters, key=lambda p: math.prod(p.shape)).name
    streamed = [p.name for p in plan.graph.parameters if p.name != smallest]
    mixed = add_updates(solved, header.optimizer, {"head.weight"}, speeds, lag=lead)
    mixed = add_parameter_streaming(mixed, streamed, lead)
    mixed = add_paged_states(mixed, {p.name for p in plan.graph.parameters} - {"head.weight"}, lead)
    return with_predictions(mixed, simulate(mixed)), model, inputs


@pytest.mark.parametrize("kind", list(OPTIMIZERS))
def test_streamed_parameters_updated_on_the_device_train_bit_exactly_with_the_predicted_peak(kind, tmp_path):
    plan, held, eager, inputs, streamed = _streamed_plan(kind)
    written = {i.target for i in plan.backward if i.verb == "offload"}
    assert written == streamed and {i.target for i in plan.backward if i.verb == "update"} >= streamed
    assert "host_update" not in {i.verb for i in plan.backward}
    sim, before = simulate(plan), simulate(held)
    assert sim.peak_bytes < before.peak_bytes  # parameters and states on the device only around their use
    assert sim.time_us > before.time_us  # the copies the step waits for

    fast, ours = _checked_generated_and_trained(plan, kind, eager, inputs, tmp_path, "_write_back(")

    # the parameters' and states' host copies are held before the step measured; the device
    # copies of the streamed parameters are made in it
    step = training_step(fast, Inputs(args=tuple(inputs)))
    step()
    resident = sum(p.numel() * p.element_size() for n, p in ours.named_parameters() if n not in streamed)
    given = simulate(dataclasses.replace(plan, graph=with_gradient_zeros(plan.graph, -1))).peak_bytes
    assert peak_bytes(step) + resident == given


def test_a_mixed_placement_with_long_leads_trains_bit_exactly():
    """A streamed parameter updated on the host beside others updated on the device and
    written back, the copies 8 ops ahead (the gradient's wait and the host update 8 ops
    after its offload): 3 AdamW steps equal eager's."""
    plan, eager, inputs = _mixed_plan("adamw")
    verbs = [(i.verb, i.target) for i in plan.backward]
    assert ("host_update", "head.weight") in verbs and ("offload", "fc2.weight") in verbs
    offload = verbs.index(("offload", "head.bwd.mm_1"))  # head.weight's gradient
    waited = verbs.index(("wait", "head.bwd.mm_1"))
    assert sum(1 for i in plan.backward[offload:waited] if i.runs_op) == 8
    module = _module_of(plan)
    make = OPTIMIZERS["adamw"][1]
    ours = copy.deepcopy(eager)
    fast = module.FastModel(ours, optimizer=make(ours.parameters()))
    _train_beside(fast, eager, make(eager.parameters()), inputs)
    for (name, a), b in zip(eager.named_parameters(), ours.parameters()):
        assert torch.equal(a, b), name


def test_streamed_device_updates_on_emulated_streams_are_ordered_and_exact():
    """The CUDA path of the parameters' prefetches and write-backs and the states' copies
    (NOTE: [Streams] in remat_dsl/codegen/runtime.py) on the stream emulation: no access
    unordered with a copy, no copy left unwaited, eager's parameters after 3 steps."""

    plan, _, eager, inputs, _ = _streamed_plan("adamw")
    _trained_on_emulated_streams(_module_of(plan), "adamw", eager, inputs)


def test_a_delete_not_ordered_after_the_write_back_is_caught_by_the_emulation():
    """The emulation can fail the test above: without the write-back's wait, the next
    step's prefetch of the parameter is not ordered after the write-back of its host copy."""
    from stream_emulation import Emulation

    plan, _, eager, inputs, _ = _streamed_plan("adamw")
    unwaited = "_wait(event_dev_fc2_weight"
    module = _module_of(plan, drop=lambda line: line.lstrip().startswith(unwaited), after="_write_back(_p.fc2_weight")
    fast = module.FastModel(eager, optimizer=OPTIMIZERS["adamw"][1](eager.parameters()))
    emulation = Emulation()
    with emulation.running(module):
        for _ in range(2):
            fast(*inputs).square().mean().backward()
    assert emulation.problems or emulation.unwaited


def _module_of(plan, drop=None, after: str = ""):
    """The generated module of `plan`, without the first line `drop` accepts after the line
    containing `after`."""
    import tempfile

    folder = Path(tempfile.mkdtemp())
    path = folder / "streamed.plan"
    path.write_text(plan_text(plan))
    lines = generate_module(path).splitlines(keepends=True)
    if drop is not None:
        start = next(i for i, line in enumerate(lines) if after in line)
        at = next(i for i in range(start, len(lines)) if drop(lines[i]))
        lines = lines[:at] + lines[at + 1 :]
    source = folder / "fast_streamed.py"
    source.write_text("".join(lines))
    return load_module(source)


def _lines_of(lines, verb: str, target: str) -> list[int]:
    return [i for i, line in enumerate(lines) if line.split()[:2] == [verb, target]]


def _drop_write_back(lines):
    """`offload P` and the `wait P` after it gone: P updated on the device, never written back."""
    offload = _lines_of(lines, "offload", "fc2.weight")[0]
    wait = next(i for i in _lines_of(lines, "wait", "fc2.weight") if i > offload)
    return [line for i, line in enumerate(lines) if i not in (offload, wait)]


def _delete_before_the_write_back_is_waited_for(lines):
    offload = _lines_of(lines, "offload", "fc2.weight")[0]
    wait = next(i for i in _lines_of(lines, "wait", "fc2.weight") if i > offload)
    delete = _lines_of(lines, "delete", "fc2.weight")[-1]
    lines = list(lines)
    lines[wait], lines[delete] = lines[delete], lines[wait]
    return lines


def _write_back_before_the_update(lines):
    offload = _lines_of(lines, "offload", "fc2.weight")[0]
    update = _lines_of(lines, "update", "fc2.weight")[0]
    moved = lines[offload]
    rest = lines[:offload] + lines[offload + 1 :]
    return rest[:update] + [moved] + rest[update:]


def _write_back_only(lines):
    """The `offload P` gone, its `wait P` left: the wait names the missing write-back."""
    offload = _lines_of(lines, "offload", "fc2.weight")[0]
    return lines[:offload] + lines[offload + 1 :]


def _drop_streamed_update(lines):
    """fc2.weight's update, its states' copies and its write-back gone (the digest does not
    seal the schedule: the replay names the parameter)."""
    lines = _drop_write_back(lines)
    verbs = ("update", "prefetch_states", "wait_states", "offload_states")
    return [
        line
        for line in lines
        if not (line.split()[:1] and line.split()[0] in verbs and line.split()[1:2] == ["fc2.weight"])
    ]


@pytest.mark.parametrize(
    "edit, words",
    [
        (_drop_write_back, "its device copy is not written back to its host copy"),
        (_delete_before_the_write_back_is_waited_for, "while its write-back"),
        (_write_back_before_the_update, "cannot offload parameter 'fc2.weight' before its update"),
        (_write_back_only, "was updated on the device (line"),
        (_repeat_first_update, "is updated twice"),
        (_drop_streamed_update, "parameter 'fc2.weight' is never updated"),
    ],
    ids=["no-write-back", "delete-first", "write-back-first", "wait-without-write-back", "repeated", "dropped"],
)
def test_misplaced_write_backs_are_refused_at_their_line(edit, words, tmp_path):
    plan, _, _, _, _ = _streamed_plan("adamw")
    path = tmp_path / "edited.plan"
    path.write_text(_edit(plan_text(plan), edit))
    result = subprocess.run([sys.executable, "-m", "remat_dsl", "check", str(path)], capture_output=True, text=True)
    assert result.returncode == 2, result.stderr
    assert words in result.stderr, result.stderr
    assert re.search(r"edited\.plan:\d+:\d+", result.stderr), result.stderr
    assert "hint:" in result.stderr and "Traceback" not in result.stderr
