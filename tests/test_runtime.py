"""The generated module's runtime (remat_dsl/codegen/runtime.py) as a Python module of its own.

Code generation inlines its source (NOTE: [Runtime] in remat_dsl.codegen.generate); here each
helper runs on real CPU tensors, and the inlining is checked: the module holds the runtime
verbatim, imports nothing of remat-dsl, and no plan value takes one of its names.
"""

from __future__ import annotations

import ast
import collections
import inspect
import sys
import types
import warnings
from pathlib import Path

import pytest
import torch

from remat_dsl.codegen import generate as codegen
from remat_dsl.codegen import runtime as rt
from remat_dsl.plan import ir

ROOT = Path(__file__).resolve().parent.parent
CPU = torch.device("cpu")


# --- the inlining -------------------------------------------------------------


def test_the_runtime_imports_only_torch_and_the_standard_library():
    tree = ast.parse(codegen.RUNTIME.read_text())
    imported = {a.name.partition(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    imported |= {n.module.partition(".")[0] for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}
    assert imported - set(sys.stdlib_module_names) == {"torch"}


def test_every_global_of_the_runtime_is_reserved():
    names = {name for name in vars(rt) if not name.startswith("__")}
    assert codegen.runtime_globals() == names
    assert names <= codegen.RESERVED


def test_a_plan_value_named_like_the_runtime_is_renamed():
    names = codegen._Namespace(ir.Graph((), (), (), (), (), (), None, ()))
    for name in ("re", "sys", "torch", "threading", "warnings", "linecache", "inspect", "functools"):
        assert names._fresh(name, set()) != name


def test_the_generated_module_holds_the_runtime_verbatim():
    from remat_dsl.check.verify import verify
    from remat_dsl.plan.parser import parse

    path = ROOT / "tests" / "plans" / "tiny_mlp_offload.plan"
    source = codegen.generate(verify(parse(path.read_text(), str(path)), within_budget=False), path.name)
    block = codegen.runtime_source()
    assert block.startswith(codegen.RUNTIME_BEGIN) and block.endswith(codegen.RUNTIME_END)
    assert block in source, "black would reformat the runtime: run black -l 120 on remat_dsl/codegen/runtime.py"
    assert '"""The runtime of a generated module' not in source
    assert "remat_dsl" not in {
        a.name.partition(".")[0] for n in ast.walk(ast.parse(source)) if isinstance(n, ast.Import) for a in n.names
    }


# --- transfers (NOTE: [Streams]), on the CPU path -------------------------------


def test_offload_and_prefetch_round_trip_a_tensor_in_its_dense_layout(monkeypatch):
    monkeypatch.setattr(rt, "_FREE_BUFFERS", {})
    x = torch.randn(6, 5).t()  # not contiguous: the host copy is laid out as x.to("cpu") would be
    pool = rt._HostBuffer(CPU, (4096, 1024))
    host, event = rt._offload(x, pool, (1, 128))
    assert event is None and torch.equal(host, x) and host.stride() == x.stride()
    assert host.data_ptr() == pool.groups[1].data_ptr() + 128
    back, event = rt._prefetch(host, event, CPU)
    rt._wait(event, CPU)
    assert torch.equal(back, x) and back.data_ptr() != host.data_ptr()
    pool.release()


def test_a_released_host_buffer_is_reused_by_the_next_step(monkeypatch):
    monkeypatch.setattr(rt, "_FREE_BUFFERS", {})
    first = rt._HostBuffer(CPU, (4160, 64))
    storage = [g.data_ptr() for g in first.groups]
    first.release()
    first.release()  # twice: nothing more
    second = rt._HostBuffer(CPU, (4160, 64))
    assert [g.data_ptr() for g in second.groups] == storage
    third = rt._HostBuffer(CPU, (4160, 64))  # while `second` holds it: a new one
    assert [g.numel() for g in third.groups] == [4160, 64] and third.groups[0].data_ptr() not in storage


def test_a_constant_made_on_the_step_s_device_kind_is_made_on_the_step_s_device():
    assert rt._on(CPU, "cpu") is CPU
    assert rt._on(CPU, "meta") == torch.device("meta")


# --- random operations ---------------------------------------------------------


def test_replay_draws_what_the_first_run_drew_and_restores_the_rng():
    dropout = torch.ops.aten.native_dropout.default
    x = torch.randn(64, 64)
    torch.manual_seed(0)
    state = rt._rng_state(CPU)
    first = rt._first_draw(state, dropout(x, 0.5, True))
    after = torch.rand(3)
    torch.manual_seed(0)
    rt._replay(state, CPU, dropout, x, 0.5, True)  # from the state saved above, whatever the current one
    torch.manual_seed(0)
    _ = rt._rng_state(CPU), dropout(x, 0.5, True)
    current = torch.get_rng_state()
    again = rt._replay(state, CPU, dropout, x, 0.5, True)
    assert all(torch.equal(a, b) for a, b in zip(first, again))
    assert torch.equal(torch.get_rng_state(), current)
    assert torch.equal(torch.rand(3), after)


def test_a_draw_keeps_the_first_run_s_outputs_for_the_recompute():
    draw = rt._Draw()
    outputs = (torch.ones(2),)
    assert rt._first_draw(draw, outputs) is outputs
    assert rt._replay(draw, CPU, lambda: pytest.fail("a draw runs nothing")) is outputs


# --- in-place outputs (NOTE: [In-place outputs]) -------------------------------


def test_into_writes_the_output_into_the_dying_input():
    step = types.SimpleNamespace(keep=False)
    a = torch.randn(4, 4)
    expected = torch.relu(a)
    out = rt._into(step, torch.ops.aten.relu.out, torch.ops.aten.relu.default, "out", a, a)
    assert out.data_ptr() == a.data_ptr() and torch.equal(out, expected)


def test_into_leaves_the_input_alone_when_the_graph_is_kept_or_not_contiguous():
    a = torch.randn(4, 4)
    out = rt._into(types.SimpleNamespace(keep=True), torch.ops.aten.relu.out, torch.ops.aten.relu.default, "out", a, a)
    assert out.data_ptr() != a.data_ptr()
    b = torch.randn(4, 4).t()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = rt._into(
            types.SimpleNamespace(keep=False), torch.ops.aten.abs.out, torch.ops.aten.abs.default, "out", b, b
        )
    assert out.data_ptr() != b.data_ptr() and torch.equal(out, b.abs())
    assert any("not written in place" in str(w.message) for w in caught)


# --- absent output gradients, repeated inputs, traced layouts ------------------


def test_an_absent_gradient_is_zeros_viewed_as_it_is_read():
    absent = torch.empty(4, 6, device="meta").t()
    zeros = rt._zeros_if_absent(absent, CPU)
    assert zeros.device == CPU and zeros.shape == (6, 4) and zeros.stride() == absent.stride() and not zeros.any()
    given = torch.ones(2)
    assert rt._zeros_if_absent(given, CPU) is given


def test_a_sum_with_an_absent_gradient_is_the_other_operand():
    b = torch.randn(3, 5)
    absent = torch.empty(3, 5, device="meta")
    assert rt._add_gradients(absent, b, True, False, False, CPU) is b
    assert rt._add_gradients(b, absent, False, True, False, CPU) is b
    transposed = torch.randn(5, 3).t()  # the sum would take the absent one's layout: not `any_layout`
    summed = rt._add_gradients(absent, transposed, True, False, False, CPU)
    assert summed is not transposed and torch.equal(summed, transposed)
    assert rt._add_gradients(absent, transposed, True, False, True, CPU) is transposed
    assert torch.equal(rt._add_gradients(b, b, False, False, False, CPU), b + b)


def test_repeated_inputs_are_passed_once():
    a, b = torch.ones(1), torch.zeros(1)
    inputs, where = rt._distinct([a, b, a])
    assert inputs[0] is a and inputs[1] is b and inputs[2] is None and where == (0, 1, 0)


def test_gradients_take_the_layout_the_backward_was_traced_with():
    assert rt._traced_layout(torch.randn(1, 4).expand(3, 4)) is None
    output = torch.randn(4, 3).t()
    layout = rt._traced_layout(output)
    assert layout == (1, 3)
    grad = torch.randn(3, 4)
    laid = rt._as_traced(grad, layout)
    assert laid.stride() == layout and torch.equal(laid, grad)
    assert rt._as_traced(laid, layout) is laid
    assert rt._as_traced(output, None).is_contiguous()


def test_autocast_is_off_inside_a_plan_function():
    seen = []

    @rt._autocast_off("cpu")
    def step(x):
        seen.append(torch.is_autocast_enabled("cpu"))
        return x

    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert step(1) == 1
        assert torch.is_autocast_enabled("cpu")
    assert seen == [False]


# --- the model and its arguments ----------------------------------------------


class _Wrapper(torch.nn.Module):
    def __init__(self, model):
        super().__init__()
        self.model = model
        self.register_state_dict_post_hook(rt._model_keys)
        self.register_load_state_dict_pre_hook(rt._wrapped_keys)


def test_the_state_dict_has_the_model_s_keys_and_loads_back():
    model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.BatchNorm1d(4))
    wrapped = _Wrapper(model)
    state = wrapped.state_dict()
    assert list(state) == list(model.state_dict())
    fresh = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.BatchNorm1d(4))
    fresh.load_state_dict(state)
    _Wrapper(fresh).load_state_dict(model.state_dict())
    assert torch.equal(fresh[0].weight, model[0].weight)


def test_plan_names_are_the_plan_language_s():
    for name in ("fc1.weight", "trunk.block1-0.proj", "a b.c"):
        assert rt._plan_name(name) == ir.plan_name(name)


def test_inputs_are_bound_by_position_and_name_and_checked():
    def forward(x, mask=None, *, use_cache=False):
        pass

    signature = inspect.signature(forward)
    planned = (("x", (2, 3), torch.float32), ("mask", (2,), torch.bool))
    x, mask = torch.zeros(2, 3), torch.zeros(2, dtype=torch.bool)
    assert rt._bind_inputs(signature, (x,), {"mask": mask}, CPU, planned, {"use_cache": False}) == [x, mask]
    assert rt._bind_inputs(signature, (x, mask), {"use_cache": False}, CPU, planned, {"use_cache": False}) == [x, mask]
    with pytest.raises(ValueError, match="use_cache=False"):
        rt._bind_inputs(signature, (x, mask), {"use_cache": True}, CPU, planned, {"use_cache": False})
    with pytest.raises(TypeError, match="needs the argument 'mask'"):
        rt._bind_inputs(signature, (x,), {}, CPU, planned, {})
    with pytest.raises(TypeError, match="made without the argument 'use_cache'"):
        rt._bind_inputs(signature, (x, mask), {"use_cache": True}, CPU, planned, {})
    with pytest.raises(ValueError, match=r"float32\[3, 2\]"):
        rt._bind_inputs(signature, (x.t(), mask), {}, CPU, ((*planned[0][:1], (2, 3), torch.float32), planned[1]), {})
    with pytest.raises(ValueError, match="requires grad"):
        rt._check_input("x", x.requires_grad_(), (2, 3), torch.float32, CPU, {})


def test_containers_are_bound_element_by_element():
    """NOTE: [Nested arguments] in remat_dsl/capture/fx.py: a tuple, list or dict argument is
    bound by its elements' names, and another structure is refused naming them."""

    def forward(tokens, hidden, batch):
        pass

    signature = inspect.signature(forward)
    t, h, c, w = torch.zeros(2, dtype=torch.int64), torch.zeros(1, 2), torch.ones(1, 2), torch.zeros(2)
    planned = (
        ("tokens", (2,), torch.int64),
        ("hidden.0", (1, 2), torch.float32),
        ("hidden.1", (1, 2), torch.float32),
        ("batch.weights.0", (2,), torch.float32),
    )
    constants = {"batch.scale": 2}
    bound = rt._bind_inputs(signature, (t, (h, c), {"weights": [w], "scale": 2}), {}, CPU, planned, constants)
    assert bound == [t, h, c, w] and bound[1] is h and bound[2] is c
    assert rt._bind_inputs(signature, (t, [h, c]), {"batch": {"scale": 2, "weights": (w,)}}, CPU, planned, constants)
    with pytest.raises(TypeError, match=r"'hidden' is Tensor, where the plan takes .* holding hidden.0, hidden.1"):
        rt._bind_inputs(signature, (t, h, {"weights": [w], "scale": 2}), {}, CPU, planned, constants)
    with pytest.raises(TypeError, match="made without the argument 'hidden.2'"):
        rt._bind_inputs(signature, (t, (h, c, c), {"weights": [w], "scale": 2}), {}, CPU, planned, constants)
    with pytest.raises(ValueError, match="batch.scale=2, not 3"):
        rt._bind_inputs(signature, (t, (h, c), {"weights": [w], "scale": 3}), {}, CPU, planned, constants)


def test_parameters_are_looked_up_and_checked_against_the_plan():
    model = torch.nn.Linear(3, 2)
    parameters = (("weight", "weight", (2, 3), torch.float32, True), ("bias", "bias", (2,), torch.float32, False))
    params = rt._lookup(model.named_parameters(), parameters, "parameter")
    assert params == [model.weight, model.bias]
    assert rt._device_of(params, "cpu") == CPU
    with pytest.raises(ValueError, match="made for cuda"):
        rt._device_of(params, "cuda")
    with pytest.raises(ValueError, match="made with it frozen"):
        rt._check_parameters(params, parameters)
    model.bias.requires_grad_(False)
    rt._check_parameters(params, parameters)
    with pytest.raises(ValueError, match="the model has no parameter 'other'"):
        rt._lookup(model.named_parameters(), (("other", "other", (1,), torch.float32),), "parameter")
    model.weight = torch.nn.Parameter(torch.zeros(2, 3))
    with pytest.raises(RuntimeError, match="no longer the one"):
        rt._check_still_the_models(model, params, parameters)


def test_the_autocast_state_must_be_the_plan_s():
    rt._check_autocast(CPU, "cpu", None)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        rt._check_autocast(CPU, "cpu", torch.bfloat16)
        with pytest.raises(RuntimeError, match="--autocast bf16"):
            rt._check_autocast(CPU, "cpu", None)
    with pytest.raises(RuntimeError, match="autocast is off"):
        rt._check_autocast(CPU, "cpu", torch.bfloat16)


Pair = collections.namedtuple("Pair", "a b")


def test_output_types_are_data_containers_of_imported_modules():
    assert rt._output_type(f"{__name__}.Pair", "g.plan:9 (outputs)") is Pair
    with pytest.raises(TypeError, match="not a data container"):
        rt._output_type(f"{__name__}.test_output_types_are_data_containers_of_imported_modules", "g.plan:9 (outputs)")
    with pytest.raises(TypeError, match=r"g\.plan:9 \(outputs\)\), which no module imported so far defines"):
        rt._output_type("not_imported_anywhere.Output", "g.plan:9 (outputs)")


def test_a_tensor_changed_in_place_between_forward_and_backward_is_refused():
    x = torch.zeros(3)
    versions = rt._versions((x,))
    rt._check_versions(("x",), versions, (x,))
    x.add_(1)
    with pytest.raises(RuntimeError, match="'x' float32\\[3\\] is at version 1; expected version 0"):
        rt._check_versions(("x",), versions, (x,))


def test_a_buffer_left_on_another_device_is_refused():
    rt._check_buffers((torch.zeros(()), torch.zeros(2)), (("scale",), ("mask",)), CPU)
    with pytest.raises(ValueError, match="buffer 'mask' is on meta"):
        rt._check_buffers((torch.zeros(2, device="meta"),), (("mask",),), CPU)
