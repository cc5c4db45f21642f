"""Llama-2-7B planned on this CPU for a GPU (issue 47's acceptance; examples/llama2_7b.py).

For each budget, `remat plan examples/llama2_7b.py --device DEVICE --budget B` runs as a
user types it (a subprocess, fake capture since the weights do not fit here); the script
prints the seconds it took, the plan's predicted peak, time, compute (every op once) and
recompute, the compute over the physical limit 6 x N x T / peak (N parameters, T tokens,
the device's bf16 tensor-core peak: 6 x 6.74e9 x 4096 / 989e12 = 167.5 ms on an H100 SXM),
the share of compute in attention, matrix products and the rest, the solver the header
names, and the tensors of the plan as large as a layer's attention scores (32 heads x 4096 x
4096 elements) or a 4096 x 4096 boolean causal mask, which the GPU's fused attention never
allocates (NOTE: [Fused attention]).

Usage: python bench/llama2_7b.py [--device h100] [--budgets 40GiB,16GiB] [--no-write]
"""

from __future__ import annotations

import argparse
import math
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import ROOT, Report, add_write_flag  # noqa: E402

from remat_dsl.capture.cost import load_device  # noqa: E402
from remat_dsl.plan.parser import parse_file  # noqa: E402

PARAMETERS = 6_738_415_616  # LlamaForCausalLM(examples/llama2_7b.config()): its parameters
TOKENS = 4096
HEADS = 32
ABOUT = """Llama-2-7B (32 layers, bf16, 1 x 4096 tokens) planned here for a GPU with `remat plan`
as a subprocess: seconds, predicted peak and time, compute against the physical limit
6 x parameters x tokens / bf16 peak, where the compute goes, and the tensors as large as an
attention score matrix (none: the plan holds the GPU's fused attention)."""


def score_sized(shape: tuple[int, ...], dtype: str) -> bool:
    """Whether a tensor is as large as one layer's attention scores (heads x tokens x
    tokens elements), or is a tokens x tokens mask: what math attention allocates."""
    return math.prod(shape) >= HEADS * TOKENS * TOKENS or (dtype == "bool" and tuple(shape[-2:]) == (TOKENS, TOKENS))


def family(target: str) -> str:
    name = target.split(".")[1]
    if "attention" in name:
        return "attention"
    if name in ("mm", "addmm", "bmm", "baddbmm"):
        return "matmul"
    return "other"


def main() -> None:
    parser = add_write_flag(
        argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    )
    parser.add_argument("--device", default="h100")
    parser.add_argument("--budgets", default="40GiB,16GiB")
    args = parser.parse_args()
    device = load_device(args.device)
    limit_ms = 6 * PARAMETERS * TOKENS / device.matmul_peak("bfloat16") * 1e3
    report = Report("bench/llama2_7b.py", "Llama-2-7B for a GPU, planned on this CPU", ABOUT)
    report.line(f"device {device.name}; physical limit 6 x {PARAMETERS:,} x {TOKENS} / bf16 peak = {limit_ms:.1f} ms")
    with tempfile.TemporaryDirectory() as work:
        for budget in args.budgets.split(","):
            out = Path(work) / "llama.plan"
            start = time.perf_counter()
            result = subprocess.run(
                [sys.executable, "-m", "remat_dsl", "plan", str(ROOT / "examples" / "llama2_7b.py"),
                 "--device", args.device, "--budget", budget, "--no-cache", "-o", str(out)],
                cwd=ROOT, capture_output=True, text=True, timeout=1800,
            )  # fmt: skip
            seconds = time.perf_counter() - start
            if result.returncode != 0:
                report.line(f"{budget}: refused after {seconds:.0f} s: {result.stderr.strip().splitlines()[-1]}")
                continue
            plan = parse_file(out)
            h = plan.header
            by_family: Counter[str] = Counter()
            for op in plan.graph.ops:
                by_family[family(op.target)] += op.time_us
            shares = ", ".join(f"{name} {100 * us / h.compute_us:.0f}%" for name, us in by_family.most_common())
            squares = [t.name for t in plan.graph.tensors if score_sized(t.shape, t.dtype)]
            report.line(
                f"{budget}: planned in {seconds:.0f} s; peak {h.peak_bytes / 2**30:.2f} GiB,"
                f" time {h.time_us / 1e3:,.1f} ms (compute {h.compute_us / 1e3:,.1f},"
                f" recompute {h.recompute_us / 1e3:,.1f});"
                f" compute / limit {h.compute_us / 1e3 / limit_ms:.2f}; {shares}; score-sized tensors {len(squares)};"
                f" solver {h.solver.split(';')[0]}"
            )
    report.write(args)


if __name__ == "__main__":
    main()
