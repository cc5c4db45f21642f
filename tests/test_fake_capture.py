"""Capture without materialising, and plans for a device this machine is not (issue 10,
parts 2 and 3): `remat plan --fake` and `--device`, as users type them.

A fake capture (NOTE: [Fake capture] in remat_dsl/capture/pipeline.py) must give the plan a
real capture gives when both take their costs from the same device description: the
graph, the tensor sizes, the schedule, the predicted peak and time, byte for byte (only
the header's `costs` line says which capture it was).  Plans for a GPU made here name the
`cuda` kind, contain no CPU-only kernel and no CPU device constant, and generate.
"""

from __future__ import annotations

import math
import os
import re
import subprocess
import time
from pathlib import Path

import pytest

from remat_dsl.capture.cost import load_device
from remat_dsl.capture.model_file import load_model_file
from remat_dsl.capture.pipeline import FAKE_FRACTION, host_available_bytes, too_large_for_host
from remat_dsl.codegen.compare import compare_training, load_generated
from remat_dsl.check.replay import simulate
from remat_dsl.plan.parser import parse_file

ROOT = Path(__file__).resolve().parent.parent
MODELS = ROOT / "tests" / "models"
BIN = ROOT / ".venv" / "bin"


def shell(script: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}", "HF_HUB_OFFLINE": "1"}
    return subprocess.run(
        ["bash", "-c", "set -eo pipefail\n" + script], cwd=cwd, env=env, capture_output=True, text=True, timeout=900
    )


def _without_costs_line(text: str) -> str:
    """The plan without its `costs` line and the digest, which seals that line too."""
    text = text[: text.index("\ndigest\n")]
    return "\n".join(line for line in text.splitlines() if not line.startswith("  costs "))


@pytest.mark.parametrize(("model", "budget"), [("hf_gpt2.py", "70%"), ("hf_llama.py", "70%"), ("tiny_cnn.py", "90%")])
def test_a_fake_capture_plans_what_a_real_capture_plans(model, budget, tmp_path):
    result = shell(
        f"remat plan {MODELS / model} --device cpu --budget {budget} > real.plan\n"
        f"remat plan {MODELS / model} --device cpu --fake --budget {budget} > fake.plan\n"
        "remat check fake.plan > /dev/null",
        tmp_path,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    real, fake = (tmp_path / "real.plan").read_text(), (tmp_path / "fake.plan").read_text()
    assert '  costs       "roofline cpu"\n' in real
    assert '  costs       "roofline cpu, fake tensors"\n' in fake
    assert _without_costs_line(real) == _without_costs_line(fake)


def test_a_plan_with_predicted_costs_trains_exactly(tmp_path):
    """Predicted costs change the schedule, never the arithmetic: a `--device cpu` plan of
    a stock Llama at 75% trains bit for bit like eager PyTorch."""
    model = MODELS / "hf_llama.py"
    result = shell(
        f"remat plan {model} --device cpu --fake --budget 75% > m.plan\nremat codegen m.plan -o fast.py", tmp_path
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "recompute" in (tmp_path / "m.plan").read_text().split("\ninputs\n")[0]
    comparison = compare_training(load_model_file(str(model)), load_generated(tmp_path / "fast.py"), steps=2)
    assert comparison.identical, comparison.mismatched[:10]


def test_a_gpu_plan_made_here_names_cuda_and_generates(tmp_path):
    """Two Llama-2-7B layers at 4096 tokens, fake, for an H100: checked (also against the
    model, which `check --model` captures fake as the plan says), generated."""
    spec = f"{ROOT / 'examples' / 'llama2_7b.py'}:build_llama_2l"
    result = shell(
        f"remat plan {spec} --fake --device h100 --budget 80% > l.plan\n"
        f"remat check l.plan --model {spec} > report.txt\n"
        "remat codegen l.plan -o l.py",
        tmp_path,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    plan = parse_file(tmp_path / "l.plan")
    assert plan.header.device == "cuda" and plan.header.costs == "roofline h100-sxm, fake tensors"
    assert plan.header.bandwidth == load_device("h100").host_to_device  # the H100's host link, from its description
    assert {d.dtype for d in plan.graph.parameters} == {"bfloat16"}
    targets = {op.target for op in plan.graph.ops}
    assert not any(t.endswith("_for_cpu.default") or "_for_cpu_backward" in t for t in targets)  # portable attention
    source = (tmp_path / "l.py").read_text()
    assert 'torch.device("cpu")' not in source and not re.search(r"cuda:\d", source)
    compile(source, "l.py", "exec")


def test_a_model_too_large_for_the_host_is_captured_fake():
    """Llama-2-7B's bf16 weights (12.55 GiB, measured on the meta device without
    allocating them) are more than 40% of this machine's memory: `remat plan` captures it
    fake without being asked (the slow test below runs that command)."""
    sizes = too_large_for_host(load_model_file(str(ROOT / "examples" / "llama2_7b.py")))
    available = host_available_bytes()
    if available is None or available > 13476831488 / FAKE_FRACTION:
        pytest.skip("the rule is for hosts with less than 33 GB available")
    assert sizes is not None and sizes[0] == 13476831488  # (state bytes, available bytes, which move)
    assert too_large_for_host(load_model_file(str(MODELS / "hf_llama.py"))) is None


@pytest.mark.slow
def test_llama_2_7b_for_an_h100(tmp_path):
    """The acceptance commands of issues 10 and 47: 32 layers, 4096 tokens, bf16.  At
    40 GiB the store-all plan fits (no score matrix: NOTE: [Fused attention]); at 16 GiB an
    H100's host link makes `auto` run offmate (remat_dsl.solve.solvers.auto).  The
    predicted compute is within 2.5x of the physical limit, 6 x 6.7e9 parameters x 4096
    tokens / 989 TFLOP/s = 166.5 ms, and the 40 GiB plan is made in under 2 minutes here."""
    for budget in ("40GiB", "16GiB"):
        start = time.monotonic()
        result = shell(
            f"remat plan {ROOT / 'examples' / 'llama2_7b.py'} --device h100 --budget {budget} > llama.plan\n"
            "remat codegen llama.plan -o llama_remat.py",
            tmp_path,
        )
        seconds = time.monotonic() - start
        assert result.returncode == 0, result.stderr[-3000:]
        plan = parse_file(tmp_path / "llama.plan")
        assert "capturing it with fake tensors" in result.stderr
        assert plan.header.peak_bytes <= int(budget[:2]) * 2**30 and plan.header.device == "cuda"
        assert plan.header.compute_us <= 2.5 * 166.5e3
        # no tensor as large as a layer's attention scores (32 heads x 4096 x 4096), no causal mask
        assert max(math.prod(t.shape) for t in plan.graph.tensors) < 32 * 4096 * 4096
        assert not [t for t in plan.graph.tensors if t.dtype == "bool" and tuple(t.shape[-2:]) == (4096, 4096)]
        assert sum("flash_attention" in op.target for op in plan.graph.ops) == 64
        if budget == "40GiB":  # the store-all plan fits; 16 GiB solves 39 block ILPs (docs/measurements.md)
            assert seconds < 120, seconds
    assert plan.header.solver.startswith("auto: offmate")


@pytest.mark.slow
@pytest.mark.parametrize(
    "example, device, budget, link_bound",
    [
        ("llama2_7b_finetune", "rtx3060", 10, False),
        # 26 GB of bf16 parameters on a 24 GB device: every step streams them and pages AdamW's
        # states through the 26.2 GB/s link, which then sets the step's time, not the compute
        ("llama2_13b_bf16", "rtx4090", 22, True),
        ("llama2_7b_lora", "rtx3060", 10, False),
    ],
)
def test_the_thesis_fine_tunes_plan_on_consumer_gpus(example, device, budget, link_bound, tmp_path):
    """Issue 48's acceptance: Llama-2-7B fp32, Llama-2-13B bf16 and Llama-2-7B + LoRA at
    4 x 512 tokens with AdamW (the fine-tunes of Zhao's thesis, 2024, section 4.8.1), each
    planned with the optimizer in under 5 minutes here, its predicted peak within the
    budget, its host memory within 128 GB (`remat check --host-budget`), its module
    written.  The step is at most 1.25x the unconstrained one (the same command at a budget
    that holds everything: every op once and the GPU update), where the compute sets it;
    where the link does, at most 1.25x the plan's own transfers on the busier direction."""
    spec = ROOT / "examples" / f"{example}.py"
    start = time.monotonic()
    result = shell(f"remat plan {spec} --device {device} --optimizer adamw --budget {budget}GiB > ft.plan", tmp_path)
    seconds = time.monotonic() - start
    assert result.returncode == 0, result.stderr[-3000:]
    assert seconds < 300, seconds
    result = shell(
        f"remat plan {spec} --device {device} --optimizer adamw --budget 1000GiB > free.plan\n"
        "remat check ft.plan --host-budget 128GB > report.txt\n"
        "remat codegen ft.plan -o ft.py",
        tmp_path,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    plan, free = parse_file(tmp_path / "ft.plan"), parse_file(tmp_path / "free.plan")
    assert plan.header.peak_bytes <= budget * 2**30 < free.header.peak_bytes
    assert plan.header.optimizer.startswith("adamw")
    bound = free.header.time_us
    if link_bound:
        bound = max(bound, simulate(plan).transfer_us / 2)
    assert plan.header.time_us <= 1.25 * bound, (plan.header.time_us, bound)
    compile((tmp_path / "ft.py").read_text(), "ft.py", "exec")
