"""Host copies grouped as the thesis' section 4.7.2 groups them (NOTE: [Pinned host memory]
in remat_dsl/plan/hostmem.py): the layout, the checker's host memory for a GPU plan (what
PyTorch's pinned allocator reserves, not the copies' bytes), `remat check --host-budget`
on it, the generated module's copies in their groups, and paged states that
`optimizer.load_state_dict` brought back to the parameter's device put back in theirs."""

from __future__ import annotations

import copy
import dataclasses
import io
import math
import random
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from remat_dsl import generate_module, load_module, plan_text
from remat_dsl.check.replay import simulate, with_predictions
from remat_dsl.codegen import runtime as rt
from remat_dsl.plan.hostmem import (
    GROUP_BYTES,
    PINNED_ALIGN,
    aligned,
    group_copies,
    host_copies,
    reserved_bytes,
)

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "examples"))

from test_paged_states import OPTIMIZERS, _mixed_plan, _train_beside  # noqa: E402


def test_reserved_bytes_is_the_pinned_allocator_s_next_power_of_two():
    assert [reserved_bytes(n) for n in (0, 1, 2, 3, 64, 65, 4096, 4097)] == [0, 1, 2, 4, 64, 128, 4096, 8192]
    assert reserved_bytes(11008 * 4096 * 4) == 256 << 20  # a Llama-2-7B MLP weight in fp32: 172 MiB


@settings(max_examples=60, deadline=None)
@given(st.dictionaries(st.text("abcxyz", min_size=1, max_size=4), st.integers(0, 5 << 20), max_size=40))
def test_copies_are_packed_aligned_without_overlap_and_the_same_in_any_order(copies):
    groups = group_copies(copies)
    assert set(groups.slots) == set(copies)
    largest = max((aligned(max(n, 1)) for n in copies.values()), default=0)
    capacity = max(reserved_bytes(largest), min(GROUP_BYTES, reserved_bytes(sum(map(aligned, copies.values())))))
    spans = sorted((g, offset, offset + aligned(max(copies[name], 1))) for name, (g, offset) in groups.slots.items())
    assert all(offset % PINNED_ALIGN == 0 for _, offset, _ in spans)
    assert all(a[0] < b[0] or a[2] <= b[1] for a, b in zip(spans, spans[1:]))  # no two copies share a byte
    assert all(end <= groups.sizes[g] <= capacity for g, _, end in spans)
    assert groups.nbytes == sum(aligned(max(n, 1)) for n in copies.values())  # a group asks for what it holds
    assert groups.pinned_bytes <= sum(reserved_bytes(aligned(max(n, 1))) for n in copies.values())  # one each
    shuffled = list(copies.items())
    random.Random(0).shuffle(shuffled)
    assert group_copies(dict(shuffled)) == groups  # the layout depends on the copies only


def test_llama_2_7b_parameters_pin_3_percent_above_their_bytes_where_one_allocation_each_pins_31():
    """The thesis' case (section 4.7.2): the 7B model's parameters, as its configuration
    makes them, kept in host memory (AdamW's states, twice as many bytes, in the same shapes)."""
    from llama2_7b import config
    from transformers import LlamaForCausalLM

    with torch.device("meta"):
        model = LlamaForCausalLM(config(32))
    sizes = {name: p.numel() * p.element_size() for name, p in model.named_parameters()}
    total = sum(sizes.values())
    one_each = sum(reserved_bytes(n) for n in sizes.values())
    grouped = group_copies(sizes).pinned_bytes
    assert total == 26_953_662_464  # 6.74 B fp32 parameters, no tied head
    assert one_each / total > 1.31
    assert grouped / total < 1.03


def _gpu(plan):
    """`plan` as a plan for a GPU (the same instructions; its host copies pinned)."""
    gpu = dataclasses.replace(plan, header=dataclasses.replace(plan.header, device="cuda"))
    return with_predictions(gpu, simulate(gpu))


def test_a_gpu_plan_holds_its_host_copies_as_pinned_groups_and_remat_check_counts_them(tmp_path):
    plan, _, _ = _mixed_plan("adamw")
    copies = host_copies(plan)
    assert copies.streamed.slots and copies.paged.slots and copies.pool.slots and copies.state_tensors == 2
    on_cpu, on_gpu = simulate(plan).host_peak_bytes, simulate(_gpu(plan)).host_peak_bytes
    params = {p.name: math.prod(p.shape) * 4 for p in plan.graph.parameters}
    pageable = 2 * params["head.weight"]  # the host update's states: the parameter is its own host copy
    copied = sum(params[p] for p in copies.streamed.slots) + 2 * sum(params[p] for p in copies.paged.slots)
    offloaded = sum(plan.graph.tensor_by_name[t].nbytes for t in copies.pool.slots)
    assert on_cpu == pageable + copied + offloaded
    assert on_gpu == pageable + copies.nbytes(pinned=True) > on_cpu

    path = tmp_path / "gpu.plan"
    path.write_text(plan_text(_gpu(plan)))
    between = f"{(on_cpu + on_gpu) // 2}B"
    refused = subprocess.run(
        [sys.executable, "-m", "remat_dsl", "check", str(path), "--host-budget", between],
        capture_output=True, text=True,
    )  # fmt: skip
    assert refused.returncode == 2 and "Traceback" not in refused.stderr
    assert f"holds {on_gpu / 2**10:.2f} KiB ({on_gpu} B) of host memory, above the host budget" in refused.stderr
    accepted = subprocess.run(
        [sys.executable, "-m", "remat_dsl", "check", str(path), "--host-budget", f"{on_gpu}B"],
        capture_output=True, text=True,
    )  # fmt: skip
    assert accepted.returncode == 0, accepted.stderr


def test_host_slots_are_tensors_of_their_own_inside_one_group(tmp_path):
    """A parameter's or a state's host copy: its own storage (a checkpoint writes its bytes
    only, safetensors saves two of one group), its bytes the group's, the group kept alive."""
    from safetensors.torch import load_file, save_file

    group = rt._host_group(4096, torch.device("cpu"))
    a = rt._host_slot(group, 0, (3, 5), torch.float32)
    b = rt._host_slot(group, 128, (7,), torch.bfloat16)
    a.copy_(torch.arange(15.0).view(3, 5))
    b.fill_(2.5)
    assert a.data_ptr() == group.data_ptr() and b.data_ptr() == group.data_ptr() + 128
    assert group[:4].view(torch.float32).item() == 0.0 and group[4:8].view(torch.float32).item() == 1.0
    assert a.untyped_storage().nbytes() == 60 and b.untyped_storage().nbytes() == 14
    buffer = io.BytesIO()
    torch.save({"a": a}, buffer)
    assert buffer.tell() < 2048  # the slot's 60 bytes, not the group's 4096
    save_file({"a": a, "b": b}, tmp_path / "two.safetensors")
    loaded = load_file(tmp_path / "two.safetensors")
    assert torch.equal(loaded["a"], a) and torch.equal(loaded["b"], b)
    del group
    assert torch.equal(a, torch.arange(15.0).view(3, 5)) and b.float().eq(2.5).all()  # still there
    assert rt._host_slot(rt._host_group(64, torch.device("cpu")), 0, (0, 4), torch.float32).shape == (0, 4)


def _in(tensor, groups) -> bool:
    start = tensor.data_ptr()
    return any(g.data_ptr() <= start and start + tensor.nbytes <= g.data_ptr() + g.numel() for g in groups)


def test_paged_states_live_in_their_groups_also_after_load_state_dict():
    """The generated module keeps paged states in PAGED_GROUPS; `load_state_dict` (which
    puts states on the parameter's device) is followed by their copy back into the groups,
    and training goes on equal to eager's, bit for bit."""
    plan, eager, inputs = _mixed_plan("adamw")
    path = Path(__import__("tempfile").mkdtemp()) / "mixed.plan"
    path.write_text(plan_text(plan))
    module = load_module(_written(path))
    assert module.PAGED_SLOTS and sum(module.PAGED_GROUPS) == host_copies(plan).paged.nbytes
    make = OPTIMIZERS["adamw"][1]
    ours = copy.deepcopy(eager)
    fast = module.FastModel(ours, optimizer=make(ours.parameters()))
    eager_opt = make(eager.parameters())
    _train_beside(fast, eager, eager_opt, inputs, steps=2)
    params = list(ours.parameters())
    paged = [params[i] for i in module.PAGED_SLOTS]
    groups = fast._optimizers.paged_groups
    states = [fast.optimizer.state[p][k] for p in paged for k in ("exp_avg", "exp_avg_sq")]
    assert states and all(_in(s, groups) for s in states)
    assert len({s.data_ptr() for s in states}) == len(states)

    fast.optimizer.load_state_dict(copy.deepcopy(eager_opt.state_dict()))  # a checkpoint, as trainers resume
    assert all(_in(fast.optimizer.state[p][k], groups) for p in paged for k in ("exp_avg", "exp_avg_sq"))
    _train_beside(fast, eager, eager_opt, inputs, steps=2)
    for (name, a), b in zip(eager.named_parameters(), ours.parameters()):
        assert torch.equal(a, b), name


def _written(plan_path: Path) -> Path:
    source = plan_path.with_suffix(".py")
    source.write_text(generate_module(plan_path))
    return source


@pytest.mark.parametrize("kind", list(OPTIMIZERS))
def test_a_state_of_another_shape_is_refused_with_a_message(kind):
    plan, eager, inputs = _mixed_plan(kind)
    path = Path(__import__("tempfile").mkdtemp()) / "mixed.plan"
    path.write_text(plan_text(plan))
    module = load_module(_written(path))
    make = OPTIMIZERS[kind][1]
    ours = copy.deepcopy(eager)
    optimizer = make(ours.parameters())
    fast = module.FastModel(ours, optimizer=optimizer)
    _train_beside(fast, copy.deepcopy(eager), make(copy.deepcopy(eager).parameters()), inputs, steps=1)
    state = optimizer.state_dict()
    index = next(iter(module.PAGED_SLOTS))
    key = "exp_avg" if kind == "adamw" else "momentum_buffer"
    state["state"][index][key] = state["state"][index][key].flatten()
    with pytest.raises(RuntimeError, match=f"the optimizer state '{key}' of parameter {index} is"):
        optimizer.load_state_dict(state)
