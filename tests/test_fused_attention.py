"""Plans for a GPU describe the GPU's attention (issue 47, part 1): a CUDA plan made on this
CPU holds scaled-dot-product attention as the fused kernel PyTorch runs on the device
(NOTE: [Fused attention] in remat_dsl/capture/attention.py), with that kernel's memory (no
score matrix) and its backward, costed at the tensor-core rate; a CPU plan keeps the CPU's
own attention, dropout included, and trains bit for bit.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from remat_dsl.capture.attention import EFFICIENT, FLASH, MATH, cuda_backend
from remat_dsl.capture.cost import load_device, op_work, roofline_seconds
from remat_dsl.capture.model_file import load_model_file
from remat_dsl.codegen.compare import compare_training, load_generated
from remat_dsl.capture.measure import step_peak
from remat_dsl.plan.parser import parse_file

ROOT = Path(__file__).resolve().parent.parent
MODEL = ROOT / "tests" / "models" / "sdpa_dropout.py"
SEQUENCE = 64  # sdpa_dropout.py's sample sequence length


def remat(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    return subprocess.run(
        [sys.executable, "-m", "remat_dsl", *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=600
    )


def meta(*shape: int, dtype=torch.bfloat16) -> torch.Tensor:
    return torch.empty(shape, dtype=dtype, device="meta")


@pytest.mark.parametrize(
    ("query", "key", "mask", "causal", "gqa", "expected"),
    [
        ((2, 8, 128, 64), (2, 8, 128, 64), None, True, False, FLASH),  # a causal LM in bf16
        ((2, 8, 128, 72), (2, 8, 128, 72), None, False, False, FLASH),  # head size padded to 80 by the composite
        ((2, 8, 128, 64), (2, 8, 128, 64), "bool", False, False, EFFICIENT),  # flash takes no mask
        ((2, 8, 128, 64), (2, 2, 128, 64), None, True, True, FLASH),  # grouped-query attention, natively
        ((2, 8, 128, 64), (2, 2, 128, 64), "bool", False, True, MATH),  # memory-efficient takes no GQA
        ((2, 8, 16, 64), (2, 8, 128, 64), None, True, False, EFFICIENT),  # causal with fewer queries than keys
        ((2, 8, 128, 512), (2, 8, 128, 512), None, False, False, EFFICIENT),  # flash's head size is at most 256
        ((2, 8, 128, 60), (2, 8, 128, 60), "bool", False, False, MATH),  # 60 is not a multiple of 8
        ((2, 128, 64), (2, 128, 64), None, False, False, MATH),  # 3-D inputs
    ],
)
def test_the_backend_is_the_one_pytorch_picks_on_the_gpu(query, key, mask, causal, gqa, expected):
    attn_mask = meta(query[0], 1, query[-2], key[-2], dtype=torch.bool) if mask else None
    q, k = meta(*query), meta(*key)
    assert cuda_backend(q, k, meta(*key), attn_mask, 0.0, causal, gqa) == expected


def test_the_dtype_picks_the_backend():
    shape = (1, 4, 32, 64)
    assert cuda_backend(*(meta(*shape, dtype=torch.float16),) * 3) == FLASH
    assert cuda_backend(*(meta(*shape, dtype=torch.float32),) * 3) == EFFICIENT  # flash is half precision only
    assert cuda_backend(*(meta(*shape, dtype=torch.float64),) * 3) == MATH


def _attention_tensors(plan) -> list:
    """Tensors of the plan as large as a score matrix: [..., S, S]."""
    return [t for t in plan.graph.tensors if tuple(t.shape[-2:]) == (SEQUENCE, SEQUENCE)]


@pytest.mark.parametrize(
    ("autocast", "kernel"),
    [("none", "_scaled_dot_product_efficient_attention"), ("bf16", "_scaled_dot_product_flash_attention")],
)
def test_a_cuda_plan_made_here_holds_the_fused_kernel(autocast, kernel, tmp_path):
    """float32 attention runs memory-efficient attention on the GPU, bfloat16 flash
    attention; both with the model's dropout, and neither allocates a score matrix."""
    result = remat(
        "plan", str(MODEL), "--device", "h100", "--budget", "100%", "--autocast", autocast, "-o", "gpu.plan",
        cwd=tmp_path,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    plan = parse_file(tmp_path / "gpu.plan")
    targets = [op.target for op in plan.graph.ops]
    assert targets.count(f"aten.{kernel}.default") == 3  # one per layer
    assert targets.count(f"aten.{kernel}_backward.default") == 3
    assert not {t.split(".")[1] for t in targets} & {"_softmax", "_safe_softmax", "bmm", "baddbmm"}, targets
    assert _attention_tensors(plan) == []
    forward = next(op for op in plan.graph.ops if op.target == f"aten.{kernel}.default")
    assert forward.random  # its dropout is replayed when it is recomputed
    assert plan.header.device == "cuda" and plan.header.costs == "roofline h100-sxm, fake tensors"
    result = remat("codegen", "gpu.plan", "-o", "fast.py", cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    assert f"torch.ops.aten.{kernel}.default" in (tmp_path / "fast.py").read_text()


def test_a_cpu_plan_keeps_the_cpu_attention(tmp_path):
    result = remat("plan", str(MODEL), "--device", "cpu", "--budget", "100%", "-o", "cpu.plan", cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    plan = parse_file(tmp_path / "cpu.plan")
    assert not any("flash" in op.target or "efficient" in op.target for op in plan.graph.ops)
    assert _attention_tensors(plan)  # the math path's scores: what the CPU allocates with dropout


@pytest.mark.parametrize("budget", ["100%", "50%"])
def test_attention_with_dropout_trains_exactly_on_the_cpu(budget, tmp_path):
    result = remat("plan", str(MODEL), "--budget", budget, "-o", "m.plan", cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    plan = parse_file(tmp_path / "m.plan")
    if budget == "50%":
        assert any(i.verb == "recompute" for i in (*plan.forward, *plan.backward))
    result = remat("codegen", "m.plan", "-o", "fast.py", cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    model_file = load_model_file(str(MODEL))
    generated = load_generated(tmp_path / "fast.py")
    comparison = compare_training(model_file, generated, steps=3)
    assert comparison.identical, comparison.mismatched[:10]
    peak = step_peak(generated.FastModel(model_file.build_model()), model_file.sample_inputs())
    assert peak == plan.header.peak_bytes


def test_causal_attention_costs_half_the_scores():
    """Causal kernels skip the blocks above the diagonal (NOTE: [Attention kernels])."""
    h100 = load_device("h100")
    q = torch.empty(1, 32, 4096, 128, dtype=torch.bfloat16, device="meta")
    target = torch.ops.aten._scaled_dot_product_flash_attention.default
    out = target(q, q, q, 0.0, True)
    causal = op_work(target, (q, q, q, 0.0, True), {}, out)
    full = op_work(target, (q, q, q, 0.0, False), {}, out)
    assert causal.kind == "attention" and causal.flops * 2 == full.flops == 4 * 32 * 4096 * 4096 * 128
    assert roofline_seconds(h100, causal) < roofline_seconds(h100, full)
