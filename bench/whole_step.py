"""Whole training steps against what users pick instead (issue 48, part 7).

For a model, an optimizer (AdamW) and a target GPU, the predicted step time and device
peak of six strategies, all from one graph: the training step of the model captured here
with fake tensors (no weights: NOTE: [Fake capture] in remat_dsl/capture/pipeline.py) and
costed by the device's description (remat_dsl/capture/devices/*.toml, the roofline of
remat_dsl/capture/cost.py), the op costs the planner itself plans with.  Nothing is run on
a GPU and nothing is timed: every figure is a prediction of that one cost model, so the
ratios compare strategies, not machines.

Symbols (bytes are decimal: 1 GB = 1e9 B, as the device files give memory):
  M      usable device memory = the device file's `memory` x (1 - MARGIN), MARGIN = 5%
         (CUDA context, allocator fragmentation: an ASSUMPTION, not measured); every row
         "fits" when its device peak is at most M
  P      bytes of all parameters (their dtype), resident on the device unless a row says
  N      trainable parameters; Pt their bytes; G = Pt the gradients' bytes
  S      = 2 Pt: torch.optim AdamW's states (exp_avg, exp_avg_sq) in the parameters' dtype,
         as remat_dsl/plan/optimizer.py counts them (the planner's device model)
  W      = 4 N: bytes of the fp32 master weights a host (ZeRO-style) optimizer updates;
         the host holds fp32 master weights and fp32 AdamW states (12 N bytes) for them
  Udev   the device's AdamW speed, bytes of parameter a second:
         memory_bandwidth x memory_efficiency / 11 (plan/optimizer.py device_update_speed,
         the speed `remat plan --optimizer` writes: workflow.update_speeds)
  Uhost  the device file's host_update (bytes of fp32 parameters the host's AdamW updates a
         second); H its host_update_overhead (seconds a step: the thesis' H)
  Bh2d, Bd2h   the host link, bytes/s each way (host_to_device, device_to_host; the two
         directions overlap)
  Tc     compute: the sum of every op's time_us in the graph (every op once); Tc_f its
         forward ops
  Aag    the autograd plan's simulated peak (Planner.autograd_peak): activations and every
         gradient, held to the step's end, nothing recomputed
  Arm    Planner(graph).smallest_budget("rockmate"): the smallest peak the solver reaches
         (activations recomputed, every gradient held to the step's end); Trm the predicted
         time of plan(Arm, "rockmate") (compute plus recompute)
  A0     the same for the graph without its gradient lines (each gradient freed once made,
         as when it is offloaded as made: what Planner.plan_step plans the activations
         with); T0 = T0_f + T0_b its plan's time, split into the forward section's and the
         backward section's ops (recompute included where it runs)
  L      bytes of the largest prefetch unit: one decoder layer's parameters (embeddings,
         final norm and head are units of their own)

Rows (time is a step, forward + backward + optimizer update):
  eager            peak = P + S + Aag             time = Tc + Pt / Udev
  recompute only   peak = P + S + Arm             time = Trm + Pt / Udev
    (Rockmate-style: parameters, gradients and states on the device, activations as small
    as the solver makes them)
  ZeRO-Offload     peak = P + A0
                   time = T0_f + max(T0_b, G / Bd2h, Pt / Bh2d, W / Uhost) + H
    (parameters on the device; each gradient offloaded as made; states, fp32 master and the
    update on the host; the updated parameters copied back.  The max assumes the host
    updates each parameter as its gradient arrives, overlapped with the rest of the
    backward from the first gradient on (ZeRO-Offload overlaps that much only with its
    one-step delayed update), so it is a lower bound.  Transfer buffers are not counted.)
  ZeRO-Infinity    peak = 2 L + A0
                   time = max(T0_f, P / Bh2d) + max(T0_b, P / Bh2d, G / Bd2h, W / Uhost) + H
    (offload everything: parameters on the host, prefetched per layer, so that the device
    holds two layers' parameters and the activations; all parameters cross the link twice,
    in the forward and in the backward, the gradients once the other way; each phase takes
    the longer of its compute and its transfers, the two directions overlapping; the
    update as in ZeRO-Offload)
  paged optimizer  Spg = 8 N (bitsandbytes' 32-bit paged AdamW: fp32 states)
                   V = min(Spg, max(0, P + Aag + Spg - M)): the states that do not fit
                   peak = P + Aag + Spg - V       fits when P + Aag <= M
                   time = Tc + W / Udev + V / Bh2d + V / Bd2h
    (eager activations; the states that do not fit next to the step's peak are paged to
    the host and come back for the update: 2 x their bytes over the link each step)
  remat plan       budget b = M; peak = the plan's peak; time = the plan's time_us
    (Planner(graph).plan_step(b, AdamW, update_speeds, "auto"): the whole step's plan,
    optimizer placed per parameter on the device (states held or paged) or the host, the
    fastest placement that fits kept, parameters kept in host
    memory where the budget needs it (NOTE: [Optimizer placement] in
    remat_dsl/solve/driver.py).  The plan's peak counts the parameters on the device, the
    device's optimizer states and updates, activations and gradients.)
  The ratio is a row's time over the eager row's time (eager's extrapolated when it does
  not fit: every op once + the device update).

Configurations (issue 48): Llama-2-7B fp32, batch 4 x 512, AdamW on rtx3060, rtx4090 and
h100 (h100-sxm); Llama-2-13B with bf16 parameters on rtx4090 and h100; Llama-2-7B + LoRA on
rtx3060.
Assumptions for bf16 (13B): on the device AdamW runs as torch.optim runs it on bf16
parameters (bf16 states, no master copy: the planner's model); where the optimizer is on
the host (ZeRO rows), fp32 master weights and fp32 states, W = 4 N; the paged optimizer
keeps fp32 states.  The planner's `host_update` charges a bf16 parameter's bytes (2 N)
/ Uhost, half the W / Uhost the ZeRO rows are charged: the output says so.
LoRA (rank 16 on q_proj and v_proj, frozen base: no gradient and no state for the base
weights): its baselines are derived from the 7B fp32 graph: the ops that output base-
weight gradients are removed from the times (Twg), the adapters' six matrix products and
two additions per adapter are added by the same roofline (Tlora = Tlora_f + Tlora_b: Tc
becomes Tc - Twg + Tlora, Trm becomes T0 - Twg + Tlora, T0_f + Tlora_f and T0_b - Twg +
Tlora_b the two phases), Aag and Arm are the autograd peak and A0 of the graph without
gradient lines (upper bounds: a frozen weight's matmul saves less) plus the adapters'
gradients, and the adapters (fp32) are the trainable parameters: Pt = G = 4 N, S = 2 Pt, W
= 4 N, and P = the base's parameters + Pt. The remat plan row is planned from a fake
capture of the model as peft's `get_peft_model` returns it (the same rank and targets;
lora_alpha 2 x rank).

The real depths take 26 minutes here (2 cores), so by default DEFAULT_LAYERS (4)
decoder layers are captured: the figures are then those of a 4-layer model of the same
width (parameters, memory and time all of that smaller model), NOT extrapolated to the full
depth; each table says the layer count it used.  `--layers full` captures the real depth
(32 layers, 40 for 13B), `--layers N` N layers.

Usage: python bench/whole_step.py [--layers N|full] [--configs NAME,...] [--tiny] [--no-write]
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import ROOT, Report, add_write_flag  # noqa: E402

from remat_dsl.capture.cost import DeviceModel, Work, load_device, roofline_seconds  # noqa: E402
from remat_dsl.check.replay import value_nbytes  # noqa: E402
from remat_dsl.plan import ir  # noqa: E402
from remat_dsl.plan.errors import RematError  # noqa: E402
from remat_dsl.plan.optimizer import device_update_speed, parse_optimizer  # noqa: E402
from remat_dsl.solve.api import BudgetError  # noqa: E402
from remat_dsl.solve.driver import Planner  # noqa: E402
from remat_dsl.workflow import update_speeds  # noqa: E402

# Wall time of the five configurations on this project's 2-core machine (one run each):
# full depths (32 and 40 layers) 26 minutes (a 32-layer 7B on h100: capture 38 s, the
# smallest gradient-free budget 149 s, plan_step 120 s), 8 layers 14.5 minutes (13B's
# smallest gradient-free budget alone 311 s), 4 layers 2 minutes: the default captures
# DEFAULT_LAYERS layers, and says so (nothing is extrapolated)
DEFAULT_LAYERS = 4
MARGIN = 0.05  # of the device's memory, left out of every row's memory (the module docstring's M)
GB = 1e9
OPTIMIZER = "adamw"
LORA_RANK = 16
LORA_TARGETS = ("q_proj", "v_proj")
COLUMNS = ("strategy", "step ms", "x eager", "device peak GB", "fits")
NOTES = (
    f"M = device memory x {1 - MARGIN:.2f}; peaks and memory in GB = 1e9 bytes; predicted, not measured.",
    "Uhost is the device file's host_update, PyTorch's CPU AdamW (the thesis' alpha_C), for the ZeRO rows and",
    "the remat plan alike: DeepSpeed's CPU-Adam, which ZeRO-Offload and ZeRO-Infinity run, is faster than that, so",
    "their rows are pessimistic where W / Uhost sets their time.  The ZeRO rows recompute what the smallest budget",
    "needs (T0 against Tc) even where the device has room for more activations (pessimistic too); their overlap",
    "of the host update with the backward is a lower bound (optimistic).  'recompute only' equals eager where the",
    "gradients held to the step's end set the peak (Arm = Aag).",
)
ABOUT = """Predicted step time and device peak of six training strategies for one model and
AdamW on one GPU, all from the op costs of the same fake-captured graph that the planner
plans with (formulas: the docstring of bench/whole_step.py).  "remat plan" is
Planner.plan_step's whole-step plan at the budget M: its peak counts the parameters on the
device, the device's optimizer states and updates, activations and gradients."""


@dataclass(frozen=True)
class Model:
    """A Llama-2 configuration (its config.json), without the weights."""

    name: str
    hidden: int
    intermediate: int
    heads: int
    layers: int
    vocab: int = 32000
    positions: int = 4096


LLAMA2_7B = Model("Llama-2-7B", 4096, 11008, 32, 32)
LLAMA2_13B = Model("Llama-2-13B", 5120, 13824, 40, 40)
TINY = Model("tiny Llama", 128, 344, 4, 2, vocab=512, positions=256)


@dataclass(frozen=True)
class Config:
    """One table: `model` in `dtype` on `device`, batch x seq tokens; `lora`: the LoRA
    variant derived from the full fine-tuning graph (module docstring)."""

    name: str
    model: Model
    dtype: str
    device: str
    batch: int = 4
    seq: int = 512
    lora: bool = False


CONFIGS = (
    Config("7b-fp32-rtx3060", LLAMA2_7B, "float32", "rtx3060"),
    Config("7b-fp32-rtx4090", LLAMA2_7B, "float32", "rtx4090"),
    Config("7b-fp32-h100", LLAMA2_7B, "float32", "h100-sxm"),
    Config("13b-bf16-rtx4090", LLAMA2_13B, "bfloat16", "rtx4090"),
    Config("13b-bf16-h100", LLAMA2_13B, "bfloat16", "h100-sxm"),
    Config("7b-lora-rtx3060", LLAMA2_7B, "float32", "rtx3060", lora=True),
)
TINY_CONFIGS = (
    Config("tiny-fp32-rtx3060", TINY, "float32", "rtx3060", batch=2, seq=64),
    Config("tiny-lora-rtx3060", TINY, "float32", "rtx3060", batch=2, seq=64, lora=True),
)


# ---------------------------------------------------------------------------
# The graph and what the planner says of it
# ---------------------------------------------------------------------------


def model_file(model: Model, dtype: str, layers: int, batch: int, seq: int, lora: bool = False):
    """A ModelFile of `model` (`layers` deep, parameters in `dtype`) on batch x seq token ids,
    with the model's own causal-LM loss, as examples/llama2_7b.py has it; `lora`: with peft's
    LoRA adapters (LORA_RANK on LORA_TARGETS) as `get_peft_model` returns the model."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from remat_dsl.capture.model_file import ModelFile

    def build():
        config = LlamaConfig(
            hidden_size=model.hidden, intermediate_size=model.intermediate, num_hidden_layers=layers,
            num_attention_heads=model.heads, num_key_value_heads=model.heads, vocab_size=model.vocab,
            max_position_embeddings=model.positions, rms_norm_eps=1e-5, hidden_act="silu",
            tie_word_embeddings=False,
        )  # fmt: skip
        base = LlamaForCausalLM(config).to(getattr(torch, dtype))
        if not lora:
            return base
        from peft import LoraConfig, get_peft_model

        return get_peft_model(
            base, LoraConfig(r=LORA_RANK, lora_alpha=2 * LORA_RANK, target_modules=list(LORA_TARGETS))
        )

    def inputs():
        ids = torch.randint(0, model.vocab, (batch, seq), generator=torch.Generator().manual_seed(1))
        return {"input_ids": ids, "labels": ids}

    spec = f"bench/whole_step.py:{model.name}" + (" + LoRA" if lora else "")
    return ModelFile(spec, ROOT / "bench" / "whole_step.py", model.name, None, build, inputs, None)


@dataclass(frozen=True)
class Terms:
    """The module docstring's symbols for one configuration (bytes, microseconds)."""

    P: int
    Pt: int
    N: int
    G: int
    S: int
    W: int
    L: int
    Tc: int
    Tc_f: int
    Trm: int
    T0_f: int
    T0_b: int
    Aag: int
    Arm: int
    A0: int
    Aag0: int  # autograd peak without gradient lines (LoRA's Aag)


def units(graph: ir.Graph) -> dict[str, int]:
    """Bytes of each prefetch unit: `model.layers.K` or a parameter's own module."""
    sizes: dict[str, int] = {}
    for p in graph.parameters:
        parts = p.name.split(".")
        key = ".".join(parts[:3]) if parts[:2] == ["model", "layers"] else ".".join(parts[:-1])
        sizes[key] = sizes.get(key, 0) + value_nbytes(p)
    return sizes


def split_us(plan: ir.Plan) -> tuple[int, int]:
    """(forward, backward) microseconds of a plan without transfers: its sections' ops."""
    ops = plan.graph.op_by_name
    forward = sum(ops[i.target].time_us for i in plan.forward if i.runs_op)
    return forward, plan.header.time_us - forward


def terms_of(graph: ir.Graph, kind: str, device: DeviceModel, progress) -> Terms:
    """The symbols of the module docstring for `graph` (the planner's solves run here)."""
    sizes = {p.name: value_nbytes(p) for p in graph.parameters}
    trainable = [g.parameter for g in graph.gradients if g.value is not None]
    items = {p.name: sizes[p.name] // max(1, _itemsize(p.dtype)) for p in graph.parameters}
    options = dict(device=kind, bandwidth=int(device.host_to_device), host_link=kind == "cuda")
    planner = Planner(graph, **options)
    progress("smallest rockmate budget, with gradients")
    arm = planner.smallest_budget("rockmate")
    trm = planner.plan(arm, "rockmate").header.time_us
    without = Planner(replace(graph, gradients=()), **options)
    progress("smallest rockmate budget, gradients freed as made")
    a0 = without.smallest_budget("rockmate")
    t0_f, t0_b = split_us(without.plan(a0, "rockmate"))
    pt = sum(sizes[p] for p in trainable)
    n = sum(items[p] for p in trainable)
    return Terms(
        P=sum(sizes.values()), Pt=pt, N=n, G=planner.gradient_bytes, S=2 * pt, W=4 * n, L=max(units(graph).values()),
        Tc=sum(op.time_us for op in graph.ops), Tc_f=sum(op.time_us for op in graph.ops if op.phase == "forward"),
        Trm=trm, T0_f=t0_f, T0_b=t0_b, Aag=planner.autograd_peak, Arm=arm, A0=a0, Aag0=without.autograd_peak,
    )  # fmt: skip


def _itemsize(dtype: str) -> int:
    return ir.DTYPE_ITEMSIZE[dtype]


# ---------------------------------------------------------------------------
# LoRA, derived from the full fine-tuning graph (module docstring)
# ---------------------------------------------------------------------------


def weight_gradient_us(graph: ir.Graph) -> int:
    """Microseconds of the ops that output a parameter's gradient (Twg)."""
    producer = {t.name: t.producer for t in graph.tensors}
    gradients = [name for g in graph.gradients if g.value is not None for name in ir.refs_in(g.value)]
    ops = {producer[name] for name in gradients if name in producer}
    return sum(graph.op_by_name[name].time_us for name in ops)


def lora_us(device: DeviceModel, model: Model, layers: int, tokens: int) -> tuple[int, int, int]:
    """(forward, backward microseconds, parameters) of the fp32 LoRA adapters (rank
    LORA_RANK on LORA_TARGETS of every layer) by the device's roofline: per adapter
    h = x A^T, y += h B^T forward; dB = dy^T h, dh = dy B, dA = dh^T x, dx += dh A backward."""
    r, d, size = LORA_RANK, model.hidden, 4  # q_proj and v_proj are hidden x hidden

    def gemm(m: int, k: int, n: int) -> float:  # (m x k) @ (k x n)
        work = Work(2 * m * k * n, size * (m * k + k * n + m * n), "matmul", "float32", gemm=(1, m, n))
        return roofline_seconds(device, work)

    def add(elements: int) -> float:
        return roofline_seconds(device, Work(elements, 3 * size * elements, "vector", "float32"))

    forward = gemm(tokens, d, r) + gemm(tokens, r, d) + add(tokens * d)
    backward = gemm(d, tokens, r) + gemm(tokens, d, r) + gemm(r, tokens, d) + gemm(tokens, r, d) + add(tokens * d)
    adapters = layers * len(LORA_TARGETS)
    return round(adapters * forward * 1e6), round(adapters * backward * 1e6), adapters * r * (d + d)


def lora_terms(full: Terms, graph: ir.Graph, device: DeviceModel, model: Model, layers: int, tokens: int) -> Terms:
    """The terms of the frozen base + LoRA step, from the full fine-tuning graph's."""
    twg = weight_gradient_us(graph)
    lora_f, lora_b, n = lora_us(device, model, layers, tokens)
    pl = 4 * n  # fp32 adapters
    return Terms(
        P=full.P + pl, Pt=pl, N=n, G=pl, S=2 * pl, W=4 * n, L=full.L,
        Tc=full.Tc - twg + lora_f + lora_b, Tc_f=full.Tc_f + lora_f,
        Trm=full.T0_f + full.T0_b - twg + lora_f + lora_b, T0_f=full.T0_f + lora_f, T0_b=full.T0_b - twg + lora_b,
        Aag=full.Aag0 + pl, Arm=full.A0 + pl, A0=full.A0, Aag0=full.Aag0,
    )  # fmt: skip


# ---------------------------------------------------------------------------
# The rows
# ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Row:
    strategy: str
    time_us: float | None
    peak: int | None
    fits: bool | None  # None: not known (no plan made)
    note: str = ""


def baseline_rows(t: Terms, device: DeviceModel, memory: float) -> list[Row]:
    """The five baselines (module docstring), in microseconds and bytes."""
    udev = device_update_speed(OPTIMIZER, device.memory_bandwidth * device.memory_efficiency)
    s_ = 1e6  # bytes / (bytes/s) -> us
    dev_update = t.Pt / udev * s_
    d2h, h2d = device.device_to_host, device.host_to_device
    host = t.W / device.host_update * s_
    h = device.host_update_overhead * s_
    rows = []
    peak = t.P + t.S + t.Aag
    rows.append(Row("eager", t.Tc + dev_update, peak, peak <= memory))
    peak = t.P + t.S + t.Arm
    rows.append(Row("recompute only", t.Trm + dev_update, peak, peak <= memory))
    peak = t.P + t.A0
    time_us = t.T0_f + max(t.T0_b, t.G / d2h * s_, t.Pt / h2d * s_, host) + h
    rows.append(Row("ZeRO-Offload", time_us, peak, peak <= memory))
    peak = 2 * t.L + t.A0
    time_us = max(t.T0_f, t.P / h2d * s_) + max(t.T0_b, t.P / h2d * s_, t.G / d2h * s_, host) + h
    rows.append(Row("ZeRO-Infinity", time_us, peak, peak <= memory))
    spg = 8 * t.N
    moved = min(spg, max(0.0, t.P + t.Aag + spg - memory))
    time_us = t.Tc + t.W / udev * s_ + moved / h2d * s_ + moved / d2h * s_
    rows.append(Row("paged optimizer", time_us, int(t.P + t.Aag + spg - moved), t.P + t.Aag <= memory,
                    f"{gb(moved)} GB of states paged"))  # fmt: skip
    return rows


def remat_row(graph: ir.Graph, kind: str, device: DeviceModel, t: Terms, memory: float, progress) -> Row:
    """The planner's whole-step plan at the budget M (module docstring)."""
    budget = int(memory)
    optimizer = parse_optimizer(OPTIMIZER)
    planner = Planner(graph, device=kind, bandwidth=int(device.host_to_device), host_link=kind == "cuda")
    progress(f"plan_step at a budget of {gb(budget)} GB")
    try:
        plan = planner.plan_step(budget, optimizer, update_speeds(optimizer, device, kind), "auto")
    except BudgetError as error:
        return Row("remat plan", None, None, False, f"no plan at budget {gb(budget)} GB ({gb(error.smallest)} needed)")
    except RematError as error:
        return Row("remat plan", None, None, False, str(error).splitlines()[0])
    h = plan.header
    hosted = sum(1 for i in plan.backward if i.verb == "host_update")
    updated = hosted + sum(1 for i in plan.backward if i.verb == "update")
    peak = h.peak_bytes
    streamed = len({i.target for i in (*plan.forward, *plan.backward) if i.verb == "prefetch"} & {
        p.name for p in graph.parameters})  # fmt: skip
    paged = sum(1 for i in plan.backward if i.verb == "prefetch_states")  # NOTE: [Paged optimizer states]
    note = (f"{hosted}/{updated} parameters updated on the host, {paged} with paged states, {streamed} kept in "
            f"host memory; {host_memory(plan)}; "
            f"solver {h.solver.split(';')[0]}")  # fmt: skip
    return Row("remat plan", h.time_us, peak, peak <= memory, note)


def host_memory(plan: ir.Plan) -> str:
    """The plan's host memory as `remat check` counts it (NOTE: [Pinned host memory]): its
    host peak, of which the pinned groups, beside the bytes of the copies they hold and
    what one pinned allocation per copy (and one for the step's offloads) would take."""
    from remat_dsl.check.replay import simulate
    from remat_dsl.plan.hostmem import host_copies, reserved_bytes

    copies = host_copies(plan)
    sizes = {p.name: value_nbytes(p) for p in plan.graph.parameters}
    one_each = sum(reserved_bytes(sizes[p]) for p in copies.streamed.slots) + reserved_bytes(copies.pool.nbytes)
    one_each += sum(copies.state_tensors * reserved_bytes(sizes[p]) for p in copies.paged.slots)
    host, pinned = simulate(plan).host_peak_bytes, copies.nbytes(pinned=True)
    return (
        f"host peak {gb(host)} GB, of which pinned groups {gb(pinned)} GB for {gb(copies.nbytes(pinned=False))} GB of "
        f"copies (one pinned allocation each: {gb(one_each)} GB)"
    )


# ---------------------------------------------------------------------------
# The tables
# ---------------------------------------------------------------------------


def table(rows: list[Row]) -> list[str]:
    """The rows as a fixed-width table, COLUMNS as its head."""
    eager = rows[0].time_us
    widths = (16, 11, 8, 15, 4)

    def line(cells) -> str:
        return "  ".join(c.ljust(w) if i in (0, 4) else c.rjust(w) for i, (c, w) in enumerate(zip(cells, widths)))

    lines = [line(COLUMNS).rstrip()]
    for row in rows:
        cells = (
            row.strategy,
            "-" if row.time_us is None else f"{row.time_us / 1e3:,.1f}",
            "-" if row.time_us is None or not eager else f"{row.time_us / eager:.2f}",
            "-" if row.peak is None else gb(row.peak),
            "-" if row.fits is None else "yes" if row.fits else "no",
        )
        lines.append((line(cells) + (f"  {row.note}" if row.note else "")).rstrip())
    return lines


def gb(nbytes: float) -> str:
    """`nbytes` in GB (1e9 B): 2 decimals, or 2 significant digits below 0.1 GB."""
    value = nbytes / GB
    return f"{value:,.2f}" if value >= 0.1 or value == 0 else f"{value:.2g}"


def describe(config: Config, layers: int, device: DeviceModel, memory: float, t: Terms) -> list[str]:
    tokens = f"batch {config.batch} x {config.seq}"
    lora = f"+ LoRA r={LORA_RANK} on {','.join(LORA_TARGETS)} (frozen {config.dtype} base)"
    what = f"{config.model.name} {lora if config.lora else config.dtype}"
    depth = f"{layers} of {config.model.layers} layers" + (
        "" if layers == config.model.layers else f" (a {layers}-layer model, NOT extrapolated to {config.model.layers})"
    )
    return [
        f"{config.name}: {what}, {depth}, {tokens}, AdamW, on {device.name}",
        f"  device memory {device.memory / GB:.1f} GB, M {gb(memory)} GB; link h2d {device.host_to_device / GB:.1f}"
        f" / d2h {device.device_to_host / GB:.1f} GB/s; host AdamW {device.host_update / GB:.1f} GB/s,"
        f" H {device.host_update_overhead * 1e3:.0f} ms",
        f"  P {gb(t.P)} GB, N {t.N:,} trainable, G {gb(t.G)} GB, S {gb(t.S)} GB, W {gb(t.W)} GB," f" L {gb(t.L)} GB",
        f"  Tc {t.Tc / 1e3:,.1f} ms (forward {t.Tc_f / 1e3:,.1f}), Trm {t.Trm / 1e3:,.1f}, T0 {t.T0_f / 1e3:,.1f}"
        f" + {t.T0_b / 1e3:,.1f} ms; Aag {gb(t.Aag)}, Arm {gb(t.Arm)}, A0 {gb(t.A0)} GB",
    ]


def depth(layers: str | None, model: Model, tiny: bool) -> int:
    """The decoder layers to capture: `--layers` (a number, or `full`), else DEFAULT_LAYERS
    (the tiny model: its own depth), never more than the model has."""
    if layers == "full" or (layers is None and tiny):
        return model.layers
    return min(int(layers) if layers is not None else DEFAULT_LAYERS, model.layers)


def main() -> None:
    parser = add_write_flag(
        argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    )
    parser.add_argument(
        "--layers", default=None,
        help=f"decoder layers captured, or `full` for the real depth (default: {DEFAULT_LAYERS}; --tiny: its 2)",
    )  # fmt: skip
    parser.add_argument("--configs", default=None, help="comma-separated configuration names (default: all)")
    parser.add_argument("--tiny", action="store_true", help="a 2-layer tiny Llama instead (a quick check)")
    args = parser.parse_args()
    if args.layers not in (None, "full") and not (args.layers.isdigit() and int(args.layers) > 0):
        parser.error(f"--layers {args.layers}: expected a number of layers > 0 or `full`")
    configs = TINY_CONFIGS if args.tiny else CONFIGS
    if args.configs:
        chosen = args.configs.split(",")
        unknown = [c for c in chosen if c not in {k.name for k in configs}]
        if unknown:
            parser.error(f"unknown configuration {', '.join(unknown)}: one of {', '.join(k.name for k in configs)}")
        configs = tuple(c for c in configs if c.name in chosen)
    # the real depth gets a section of its own, beside the default depth's
    full = args.layers == "full"
    report = Report(
        "bench/whole_step.py" + (" (full depth)" if full else ""),
        "Whole training steps against what users pick instead" + (", at the models' full depth" if full else ""),
        ABOUT,
    )
    started = time.perf_counter()

    def progress(text: str) -> None:
        print(f"  [{time.perf_counter() - started:5.0f} s] {text}", file=sys.stderr, flush=True)

    from remat_dsl.capture.pipeline import capture_graph

    captured: dict[tuple, tuple] = {}  # (model, dtype, device, layers, batch, seq) -> (graph, kind, Terms)
    for config in configs:
        layers = depth(args.layers, config.model, args.tiny)
        device = load_device(config.device)
        memory = device.memory * (1 - MARGIN)
        key = (config.model, config.dtype, config.device, layers, config.batch, config.seq)
        if key not in captured:
            progress(f"{config.name}: fake capture of {layers} layers")
            result = capture_graph(
                model_file(config.model, config.dtype, layers, config.batch, config.seq), device_model=device, fake=True
            )
            captured[key] = (result.graph, result.device, terms_of(result.graph, result.device, device, progress))
        graph, kind, terms = captured[key]
        if config.lora:
            terms = lora_terms(terms, graph, device, config.model, layers, config.batch * config.seq)
            progress(f"{config.name}: fake capture of {layers} layers with peft's LoRA adapters")
            adapted = capture_graph(
                model_file(config.model, config.dtype, layers, config.batch, config.seq, lora=True),
                device_model=device, fake=True,
            )  # fmt: skip
            rows = baseline_rows(terms, device, memory) + [
                remat_row(adapted.graph, adapted.device, device, terms, memory, progress)
            ]
        else:
            rows = baseline_rows(terms, device, memory) + [remat_row(graph, kind, device, terms, memory, progress)]
        report.line()
        for line in describe(config, layers, device, memory, terms) + table(rows):
            report.line(line)
        if config.dtype == "bfloat16" and not config.lora:
            planner_host = terms.Pt / device.host_update * 1e3
            report.line(
                f"  note: the ZeRO rows charge the host W / Uhost = {terms.W / device.host_update * 1e3:,.0f} ms (fp32"
                f" master); the planner charges host-updated bf16 parameters their own bytes / Uhost (all of them:"
                f" {planner_host:,.0f} ms), and keeps bf16 states (S = 2 Pt), where the ZeRO rows keep 12 N on the host"
            )
        if config.lora:
            report.line(
                f"  note: the baselines are derived from {config.model.name}'s full fine-tuning graph; the remat plan"
                " is made from a capture of the model with peft's adapters;"
                f" Twg = {weight_gradient_us(graph) / 1e3:,.1f} ms of base-gradient ops removed; a bf16 base would"
                f" hold {gb((terms.P - terms.Pt) / 2)} GB of parameters"
            )
    report.line()
    for line in NOTES:
        report.line(line)
    progress("done")
    report.write(args)


if __name__ == "__main__":
    main()
