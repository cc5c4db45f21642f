"""The roofline cost model: shipped devices, predictions from shapes alone, bad device files."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch
import torch.fx as fx
import torch.utils._pytree as pytree

from remat_dsl.capture.cost import DEVICES, load_device, op_temp_bytes, op_time_us, shipped_devices, tile_utilisation
from remat_dsl.capture.fx import capture
from remat_dsl.capture.model_file import load_model_file
from remat_dsl.capture.profile import is_call
from remat_dsl.plan.errors import PlanError, RematError

ROOT = Path(__file__).resolve().parent.parent
GPT2 = str(ROOT / "tests" / "models" / "hf_gpt2.py")
aten = torch.ops.aten
GPUS = ("a100", "a100-40gb", "h100-sxm", "h100-pcie", "h200", "gh200", "l4", "l40s")  # fp32 < half the bf16 rate


def meta(*shape: int, dtype=torch.float32) -> torch.Tensor:
    return torch.empty(*shape, dtype=dtype, device="meta")


def predict(device, target, *args, **kwargs) -> int:
    return op_time_us(device, target, args, kwargs, target(*args, **kwargs))


def test_every_shipped_device_loads():
    assert shipped_devices() == (
        "a100",
        "a100-40gb",
        "cpu",
        "gh200",
        "h100-pcie",
        "h100-sxm",
        "h200",
        "l4",
        "l40s",
        "rtx3060",
        "rtx4090",
    )
    for name in shipped_devices():
        device = load_device(name)
        assert device.name == name
        assert device.kind == ("cpu" if name == "cpu" else "cuda")
        assert device.matmul_flops["float32"] > 0 and device.memory_bandwidth > 0 and device.memory > 0
        assert device.host_to_device > 0 and device.device_to_host > 0 and device.launch_latency > 0
        assert device.host_update > 0 and device.host_update_overhead > 0


def test_h100_is_h100_sxm():
    assert load_device("h100") == load_device("h100-sxm")
    assert load_device("h100").name == "h100-sxm"


def test_a_device_file_by_path_is_named_by_its_stem(tmp_path):
    path = tmp_path / "my-gpu.toml"
    path.write_text((DEVICES / "l4.toml").read_text())
    device = load_device(str(path))
    assert device.name == "my-gpu"
    assert device.matmul_flops == load_device("l4").matmul_flops


def test_a_large_bf16_matmul_runs_at_the_h100_peak():
    device = load_device("h100-sxm")
    a = meta(4096, 4096, dtype=torch.bfloat16)
    # 32 x 32 output tiles of 128 x 128 in 8 waves of 132 SMs (NOTE: [Matmul tiles])
    assert tile_utilisation(device, (1, 4096, 4096)) == 1024 / (8 * 132)
    seconds = 2 * 4096**3 / (989e12 * device.matmul_efficiency * 1024 / (8 * 132)) + device.launch_latency
    assert device.matmul_flops["bfloat16"] == 989e12
    assert predict(device, aten.mm.default, a, a) == round(seconds * 1e6)
    assert 2 * 4096**3 / 989e12 * 1e6 <= predict(device, aten.mm.default, a, a) <= 1.5 * 2 * 4096**3 / 989e12 * 1e6


def test_an_elementwise_add_is_bandwidth_bound():
    device = load_device("h100-sxm")
    x = meta(8192, 8192)
    moved = 3 * x.numel() * 4  # two inputs read, one output written
    seconds = moved / (device.memory_bandwidth * device.memory_efficiency) + device.launch_latency
    assert predict(device, aten.add.Tensor, x, x.clone()) == round(seconds * 1e6)
    assert predict(device, aten.add.Tensor, x, x) == round(
        (2 * x.numel() * 4 / (device.memory_bandwidth * device.memory_efficiency) + device.launch_latency) * 1e6
    )


@pytest.mark.parametrize("name", GPUS)
def test_fp32_matmuls_are_slower_than_bf16_on_gpus(name):
    device = load_device(name)
    a32, a16 = meta(4096, 4096), meta(4096, 4096, dtype=torch.bfloat16)
    assert predict(device, aten.mm.default, a32, a32) > 2 * predict(device, aten.mm.default, a16, a16)


def test_a_view_costs_the_launch_latency_only():
    device = load_device("a100")
    x = meta(1024, 1024)
    assert predict(device, aten.t.default, x) == max(1, round(device.launch_latency * 1e6))


def test_a_slice_reads_its_view_not_its_storage():
    device = load_device("l4")
    whole = meta(64, 1 << 20)
    part = whole[:1]
    assert predict(device, aten.clone.default, part) < predict(device, aten.clone.default, whole) / 10


def test_real_and_meta_tensors_predict_the_same():
    torch.manual_seed(0)
    cases = [
        (aten.mm.default, (torch.randn(64, 32), torch.randn(32, 48)), {}),
        (aten.addmm.default, (torch.randn(48), torch.randn(64, 32), torch.randn(32, 48)), {}),
        (aten.add.Tensor, (torch.randn(64, 32), torch.randn(64, 32)), {}),
        (
            aten.convolution.default,
            (torch.randn(2, 3, 16, 16), torch.randn(8, 3, 3, 3), None, [1, 1], [1, 1], [1, 1], False, [0, 0], 1),
            {},
        ),
        (aten.native_dropout.default, (torch.randn(64, 32), 0.1, True), {}),
        (aten._softmax.default, (torch.randn(4, 64, 64), -1, False), {}),
    ]
    for name in shipped_devices():
        device = load_device(name)
        for target, args, kwargs in cases:
            meta_args = pytree.tree_map(lambda a: a.to("meta") if isinstance(a, torch.Tensor) else a, args)
            real = (
                op_time_us(device, target, args, kwargs, target(*args, **kwargs)),
                op_temp_bytes(device, target, args, kwargs, target(*args, **kwargs)),
            )
            fake = (
                op_time_us(device, target, meta_args, kwargs, target(*meta_args, **kwargs)),
                op_temp_bytes(device, target, meta_args, kwargs, target(*meta_args, **kwargs)),
            )
            assert real == fake, (name, target)
            assert real[0] >= 1 and real[1] >= 0


def test_temporary_memory_rules():
    x = meta(64, 128)
    dropout = aten.native_dropout.default
    assert op_temp_bytes(load_device("cpu"), dropout, (x, 0.1, True), {}, dropout(x, 0.1, True)) == 64 * 128 * 4
    assert op_temp_bytes(load_device("h100"), dropout, (x, 0.1, True), {}, dropout(x, 0.1, True)) == 0
    assert op_temp_bytes(load_device("cpu"), aten.mm.default, (x, x.t()), {}, x @ x.t()) == 0


# ---------------------------------------------------------------------------
# Bad names and files
# ---------------------------------------------------------------------------


def test_an_unknown_name_lists_the_shipped_devices_and_suggests_the_closest():
    with pytest.raises(RematError) as error:
        load_device("h100-sx")
    text = error.value.format()
    assert "unknown device `h100-sx`" in text
    assert all(name in text for name in shipped_devices())
    assert "did you mean `h100-sxm`?" in text


def test_a_missing_file_is_an_error(tmp_path):
    with pytest.raises(RematError, match=r"missing\.toml: error: cannot read the device file"):
        load_device(str(tmp_path / "missing.toml"))


def test_a_toml_syntax_error_names_file_line_and_column(tmp_path):
    path = tmp_path / "bad.toml"
    path.write_text('kind = "cuda"\nmemory = 80e9\nmemory_bandwidth = = 3e12\n')
    with pytest.raises(PlanError) as error:
        load_device(str(path))
    first = error.value.format().splitlines()[0]
    assert re.match(rf"{re.escape(str(path))}:3:20: error: TOML syntax: ", first), first
    assert "memory_bandwidth = = 3e12" in error.value.format()


def device_text(**changes: str | None) -> str:
    """h100-sxm.toml with the lines of the keys in `changes` replaced (None: removed)."""
    lines = []
    for line in (DEVICES / "h100-sxm.toml").read_text().splitlines():
        key = line.split("=")[0].strip()
        if key in changes:
            if changes[key] is not None:
                lines.append(f"{key} = {changes[key]}")
            continue
        lines.append(line)
    return "\n".join(lines) + "\n"


def test_a_missing_key_is_named_with_the_file(tmp_path):
    path = tmp_path / "gpu.toml"
    path.write_text(device_text(launch_latency=None))
    with pytest.raises(PlanError) as error:
        load_device(str(path))
    assert error.value.format().startswith(f"{path}: error: the device file has no `launch_latency`")
    assert "hint: add `launch_latency = ...`" in error.value.format()


def test_an_unknown_key_is_located_and_suggests_the_closest(tmp_path):
    path = tmp_path / "gpu.toml"
    path.write_text(device_text() + "[matmul_flops2]\nfloat32 = 1e12\n")
    with pytest.raises(
        PlanError, match=r"gpu\.toml:\d+:2: error: unknown key `matmul_flops2`(.|\n)*did you mean `matmul_flops`"
    ):
        load_device(str(path))
    path.write_text(device_text().replace("bfloat16 = 989e12", "bfloat61 = 989e12"))
    with pytest.raises(PlanError, match=r"unknown dtype `bfloat61` in \[matmul_flops\](.|\n)*did you mean `bfloat16`"):
        load_device(str(path))


@pytest.mark.parametrize("value", ["0", "-3e12", '"3 TB/s"', "nan"])
def test_a_value_that_is_not_a_positive_number_is_refused(tmp_path, value):
    path = tmp_path / "gpu.toml"
    path.write_text(device_text(memory_bandwidth=value))
    with pytest.raises(PlanError) as error:
        load_device(str(path))
    text = error.value.format()
    assert re.match(rf"{re.escape(str(path))}:\d+:1: error: `memory_bandwidth` is .*, not a positive number", text), (
        text
    )
    assert "hint: write memory_bandwidth = 1e12" in text


@pytest.mark.parametrize("key", ["host_update", "host_update_overhead"])
def test_the_host_update_keys_are_required_and_checked(tmp_path, key):
    """The host CPU's optimizer speed and its management time (OffMate's alpha_C and H)
    are required like the host link, and refused unless positive numbers, at their place."""
    assert getattr(load_device("rtx3060"), key) == {"host_update": 1.1e9, "host_update_overhead": 0.05}[key]
    path = tmp_path / "gpu.toml"
    path.write_text(device_text(**{key: None}))
    with pytest.raises(PlanError) as error:
        load_device(str(path))
    assert error.value.format().startswith(f"{path}: error: the device file has no `{key}`")
    assert f"hint: add `{key} = ...`" in error.value.format()
    for value in ("0", '"1.1 GB/s"'):
        path.write_text(device_text(**{key: value}))
        with pytest.raises(PlanError) as error:
            load_device(str(path))
        text = error.value.format()
        assert re.match(rf"{re.escape(str(path))}:\d+:1: error: `{key}` is .*, not a positive number", text), text
        assert f"hint: write {key} = 1e12" in text


def test_an_unknown_kind_and_an_efficiency_above_one_are_refused(tmp_path):
    path = tmp_path / "gpu.toml"
    path.write_text(device_text(kind='"tpu"'))
    with pytest.raises(PlanError, match='a device\'s kind is "cuda" or "cpu"'):
        load_device(str(path))
    path.write_text(device_text(matmul_efficiency="80"))
    with pytest.raises(PlanError, match="an efficiency is a fraction of the peak, at most 1"):
        load_device(str(path))


# ---------------------------------------------------------------------------
# Every op of a captured graph, on meta tensors
# ---------------------------------------------------------------------------


def run_calls(gm: fx.GraphModule, args: list, calls: list, to_meta: bool) -> dict[str, object]:
    """Interpret `gm` on `args`; factories (`arange(..., device=cpu)`) make meta tensors if `to_meta`."""

    def load(a):
        if isinstance(a, fx.Node):
            return env[a.name]
        return torch.device("meta") if to_meta and isinstance(a, torch.device) else a

    env: dict[str, object] = {}
    placeholders = iter(args)
    for node in gm.graph.nodes:
        if node.op == "placeholder":
            env[node.name] = next(placeholders)
        elif node.op == "call_function":
            fn_args, fn_kwargs = pytree.tree_map(load, (node.args, node.kwargs))
            env[node.name] = node.target(*fn_args, **fn_kwargs)
            if is_call(node):
                calls.append((node, fn_args, fn_kwargs, env[node.name]))
    return env


def calls_of(captured, to_meta: bool) -> list:
    """(node, args, kwargs, output) of every call of the training step, on meta tensors or real ones."""
    primals = [t.to("meta") if to_meta else t for t in captured.example_primals]
    calls = []
    with torch.random.fork_rng(), torch.no_grad():
        forward = run_calls(captured.forward, primals, calls, to_meta)
        saved = {n.name: forward[n.name] for n in captured.forward.graph.nodes if n.name in forward}
        outputs = [
            forward[n.name]
            for n in captured.forward.graph.output_node().args[0][len(captured.mutated) :][: captured.num_outputs]
        ]
        inputs, tangent = [], 0
        for node in captured.backward.graph.nodes:
            if node.op != "placeholder":
                continue
            if node.name.startswith("tangents_"):
                inputs.append(torch.ones_like(outputs[captured.tangent_of[tangent]]))
                tangent += 1
            else:
                inputs.append(saved[node.name])
        run_calls(captured.backward, inputs, calls, to_meta)
    return calls


def test_every_op_of_a_gpt2_step_is_costed_from_meta_tensors():
    model_file = load_model_file(GPT2)
    captured = capture(model_file.build_model(), model_file.sample_inputs())
    fake, real = calls_of(captured, to_meta=True), calls_of(captured, to_meta=False)
    assert len(fake) == len(real) > 100
    assert all(
        isinstance(t, torch.Tensor) and t.is_meta for t in pytree.tree_leaves(fake[0][1]) if isinstance(t, torch.Tensor)
    )
    for name in ("h100-sxm", "cpu"):
        device = load_device(name)
        costs = [
            (op_time_us(device, n.target, a, k, v), op_temp_bytes(device, n.target, a, k, v)) for n, a, k, v in fake
        ]
        assert costs == [
            (op_time_us(device, n.target, a, k, v), op_temp_bytes(device, n.target, a, k, v)) for n, a, k, v in real
        ]
        assert all(isinstance(t, int) and t >= 1 and isinstance(b, int) and b >= 0 for t, b in costs)
        assert costs == [
            (op_time_us(device, n.target, a, k, v), op_temp_bytes(device, n.target, a, k, v)) for n, a, k, v in fake
        ]
    matmuls = [op_time_us(load_device("h100"), n.target, a, k, v) for n, a, k, v in fake if "mm" in str(n.target)]
    assert matmuls, "GPT-2 has matmuls"


def test_the_cpu_flash_attention_is_costed_as_attention():
    q = meta(2, 8, 1024, 64, dtype=torch.bfloat16)
    forward = aten._scaled_dot_product_flash_attention_for_cpu.default
    out = forward(q, q, q, 0.0, True)
    backward = aten._scaled_dot_product_flash_attention_for_cpu_backward.default
    device = load_device("h100")
    flops = 4 * 2 * 8 * 1024 * 1024 * 64  # two batched matmuls of 2 * 1024 * 1024 * 64 per head
    seconds = flops / (device.matmul_flops["bfloat16"] * device.matmul_efficiency) + device.launch_latency
    assert op_time_us(device, forward, (q, q, q, 0.0, True), {}, out) == round(seconds * 1e6)
    grads = backward(out[0], q, q, q, out[0], out[1], 0.0, True)
    assert (
        op_time_us(device, backward, (out[0], q, q, q, out[0], out[1], 0.0, True), {}, grads)
        > 2 * round(seconds * 1e6) - 10
    )
