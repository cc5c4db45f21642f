"""Predict an operation's time and temporary memory on a target device: a roofline model.

`remat plan --device h100` plans for a device it is not running on: every operation of
the captured graph is costed from its shapes alone (the tensors may be on the `meta`
device) with the roofline model of Williams, Waterman and Patterson, "Roofline: an
insightful visual performance model for multicore architectures", CACM 52(4), 2009:

    time = max(FLOPs / (peak FLOP/s x efficiency), bytes moved / (bandwidth x efficiency))
           + launch latency x kernels

* FLOPs of matrix-class operations (mm, bmm, addmm, baddbmm, convolution and its
  backward, scaled-dot-product attention ...: every operator with a formula in
  `torch.utils.flop_counter.flop_registry`) come from that formula, at the device's
  `[matmul_flops]` peak for the operation's dtype.  Other operations do a few FLOPs per
  element (NOTE: [Work per element]) at the `[vector_flops]` peak; on a GPU that is
  almost always below the memory roof.  A few run several kernels (layer norm's
  backward runs four), each paying the launch latency.
* bytes moved: the bytes of the distinct tensor arguments read (each view's numel x
  element size, not its whole storage) plus the bytes of the outputs written.
* views move nothing: their time is one launch latency.

NOTE: [Device file format]
A device is a TOML file (`remat_dsl/capture/devices/*.toml` ship with remat-dsl; any
other path works the same way).  Every key is required; numbers are positive; `1e12`
and `1_000` are both fine::

    kind              = "cuda"     # or "cpu": the device kind plans and modules name
    memory            = 80e9       # bytes of device memory
    memory_bandwidth  = 3.35e12    # bytes/s, device memory
    host_to_device    = 64e9       # bytes/s, host memory -> device (offload: prefetch)
    device_to_host    = 64e9       # bytes/s, device -> host memory (offload: store)
    host_update       = 2e9        # bytes/s of fp32 parameters the host's AdamW updates
    host_update_overhead = 0.05    # seconds of host management a step adds to its updates (H)
    launch_latency    = 5e-6       # seconds per kernel an operation launches
    matmul_efficiency = 0.8        # fraction of the matmul peak that matrix operations reach
    conv_efficiency   = 0.6        # the same for convolutions (and their backward)
    memory_efficiency = 0.85       # fraction of memory_bandwidth that operations reach

    [matmul_flops]                 # FLOP/s of matrix-class operations, by dtype
    float32  = 67e12               # `float32` is required; float16, bfloat16, float64
    bfloat16 = 989e12              # are optional and fall back to float32's figure

    [vector_flops]                 # FLOP/s of other operations, by dtype (same keys)
    float32  = 67e12

One key is optional: `multiprocessors = 132`, the GPU's streaming multiprocessors, which
matrix operations fill in waves of output tiles (NOTE: [Matmul tiles]); without it a
matrix operation of any shape reaches `matmul_efficiency`.

Integer and boolean tensors are costed at the float32 figures.  The device's name is
the file's stem (`h100-sxm`); `load_device` also knows the shipped files by name, and
ALIASES' other names for them (`h100`, `a100-80gb`).  docs/devices.md says the same for
users.  The shipped files cite a source per figure: a tag their header comment defines
(`("datasheet")`), or ASSUMPTION with a reason; tests/test_device_files.py checks that.
Temporary memory follows a rule per op family: NOTE: [Temporary memory].
"""

from __future__ import annotations

import difflib
import math
import re
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

from remat_dsl.plan.errors import PlanError, RematError
from remat_dsl.plan.ir import Span

DEVICES = Path(__file__).resolve().parent / "devices"
ALIASES = {"h100": "h100-sxm", "a100-80gb": "a100"}
KINDS = ("cuda", "cpu")
DTYPES = ("float32", "float16", "bfloat16", "float64")
NUMBERS = (
    "memory",
    "memory_bandwidth",
    "host_to_device",
    "device_to_host",
    "host_update",
    "host_update_overhead",
    "launch_latency",
    "matmul_efficiency",
    "conv_efficiency",
    "memory_efficiency",
)
TABLES = ("matmul_flops", "vector_flops")
OPTIONAL = ("multiprocessors",)  # NOTE: [Matmul tiles]: without it, no tile or wave quantization
FORMAT_HINT = "see the device file format in docs/devices.md"


@dataclass(frozen=True)
class DeviceModel:
    """What the cost model knows of a device: peaks, bandwidths (bytes/s), seconds, bytes.

    name: `h100-sxm`, `cpu`, or the stem of a user's file; kind: `cuda` or `cpu`.
    matmul_flops / vector_flops: peak FLOP/s by dtype name (`float32` always present) of
    matrix-class operations and of the others.  The efficiencies (0 < e <= 1) scale the
    matmul peak (convolutions have their own) and the memory bandwidth.
    host_update / host_update_overhead: the host CPU's optimizer (OffMate's, Zhao's thesis,
    chapter 4): bytes of fp32 parameters its AdamW updates a second (reading each parameter,
    its gradient and two fp32 states, writing them back; the thesis' alpha_C), and the
    seconds of management time H that eq. 4.23 adds to a step's CPU time.
    """

    name: str
    kind: str
    matmul_flops: Mapping[str, float] = field(hash=False)
    vector_flops: Mapping[str, float] = field(hash=False)
    memory_bandwidth: float  # bytes/s
    host_to_device: float  # bytes/s
    device_to_host: float  # bytes/s
    host_update: float  # bytes/s
    host_update_overhead: float  # seconds
    launch_latency: float  # seconds
    memory: int  # bytes
    matmul_efficiency: float = 1.0
    conv_efficiency: float = 1.0
    memory_efficiency: float = 1.0
    multiprocessors: int = 0  # streaming multiprocessors; 0: unknown (NOTE: [Matmul tiles])

    def matmul_peak(self, dtype: str) -> float:
        """Peak FLOP/s of matrix-class operations on `dtype` (float32's for others)."""
        return self.matmul_flops.get(dtype, self.matmul_flops["float32"])

    def vector_peak(self, dtype: str) -> float:
        """Peak FLOP/s of other operations on `dtype` (float32's for others)."""
        return self.vector_flops.get(dtype, self.vector_flops["float32"])


# ---------------------------------------------------------------------------
# Loading device files
# ---------------------------------------------------------------------------


def shipped_devices() -> tuple[str, ...]:
    """Names of the device files shipped with remat-dsl, sorted (`a100`, `cpu`, ...)."""
    return tuple(sorted(p.stem for p in DEVICES.glob("*.toml")))


def load_device(spec: str) -> DeviceModel:
    """The device named `spec` (a shipped name or alias: `h100` is `h100-sxm`) or read
    from the TOML file at path `spec` (NOTE: [Device file format]).

    Raises RematError on an unknown name (suggesting the closest shipped one) or an
    unreadable file, and PlanError (`FILE:LINE:COL: error: ...`) on a TOML syntax error,
    a missing or unknown key, or a value that is not a positive number.
    """
    name = ALIASES.get(spec, spec)
    if name in shipped_devices():
        return read_device(DEVICES / f"{name}.toml")
    if spec.endswith(".toml") or "/" in spec or "\\" in spec or Path(spec).is_file():
        return read_device(Path(spec))
    return _unknown_device(spec)


def _aliases() -> str:
    """`h100 is h100-sxm, a100-80gb is a100`: the other names of shipped devices."""
    return ", ".join(f"{alias} is {name}" for alias, name in ALIASES.items())


def _unknown_device(spec: str) -> DeviceModel:
    names = (*shipped_devices(), *ALIASES)
    close = difflib.get_close_matches(spec, names, n=1, cutoff=0.5)
    other = f"pass the path of a .toml device file ({FORMAT_HINT})"
    raise RematError(
        f"error: unknown device `{spec}`; the shipped devices are {', '.join(shipped_devices())} ({_aliases()})",
        hint=f"did you mean `{close[0]}`? Otherwise {other}" if close else other[0].upper() + other[1:],
    )


def read_device(path: Path) -> DeviceModel:
    """Read and check one device file; the device's name is the file's stem.  Raises as
    `load_device` does."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        raise RematError(
            f"{path}: error: cannot read the device file: {reason}",
            hint=f"pass a shipped device ({', '.join(shipped_devices())}) or the path of a readable .toml file",
        ) from None
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise _syntax_error(exc, path, text) from None
    return _device(data, path, text)


def _syntax_error(exc: tomllib.TOMLDecodeError, path: Path, text: str) -> PlanError:
    """tomllib's message ends with `(at line L, column C)` or `(at end of document)`."""
    message = str(exc)
    found = re.fullmatch(r"(?s)(.*) \(at line (\d+), column (\d+)\)", message)
    if found:
        message, line, col = found.group(1), int(found.group(2)), int(found.group(3))
    else:
        message = message.removesuffix(" (at end of document)")
        lines = text.split("\n")
        line, col = len(lines), len(lines[-1]) + 1
    return PlanError(
        f"TOML syntax: {message[:1].lower()}{message[1:]}",
        span=Span(line, col),
        path=str(path),
        source=text,
        hint=FORMAT_HINT,
    )


def _device(data: dict[str, Any], path: Path, text: str) -> DeviceModel:
    def error(message: str, key: str, table: str | None = None, hint: str = FORMAT_HINT) -> PlanError:
        span = _key_span(text, key, table)
        return PlanError(message, span=span, path=str(path), source=text, hint=hint, length=len(key) if span else 1)

    allowed = ("kind", *NUMBERS, *TABLES, *OPTIONAL)
    for key in data:
        if key not in allowed:
            raise error(f"unknown key `{key}` in the device file", key, hint=_closest(key, allowed, "keys"))
    for key in ("kind", *NUMBERS, *TABLES):
        if key not in data:
            raise PlanError(
                f"the device file has no `{key}`", path=str(path), hint=f"add `{key} = ...` ({FORMAT_HINT})"
            )
    if data["kind"] not in KINDS:
        raise error(
            f'`kind` is {data["kind"]!r}; a device\'s kind is "cuda" or "cpu"',
            "kind",
            hint='write kind = "cuda" or kind = "cpu"',
        )
    numbers = {key: _positive(data[key], key, error) for key in NUMBERS}
    for key in ("matmul_efficiency", "conv_efficiency", "memory_efficiency"):
        if numbers[key] > 1:
            raise error(
                f"`{key}` is {numbers[key]}; an efficiency is a fraction of the peak, at most 1",
                key,
                hint=f"write {key} = 0.8 for 80%",
            )
    tables = {table: _dtype_table(data[table], table, error) for table in TABLES}
    multiprocessors = 0
    if "multiprocessors" in data:
        value = data["multiprocessors"]
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            raise error(
                f"`multiprocessors` is {value!r}, not a positive whole number",
                "multiprocessors",
                hint="write multiprocessors = 132 (the GPU's streaming multiprocessors)",
            )
        multiprocessors = value
    return DeviceModel(
        name=path.stem,
        kind=data["kind"],
        matmul_flops=tables["matmul_flops"],
        vector_flops=tables["vector_flops"],
        memory_bandwidth=numbers["memory_bandwidth"],
        host_to_device=numbers["host_to_device"],
        device_to_host=numbers["device_to_host"],
        host_update=numbers["host_update"],
        host_update_overhead=numbers["host_update_overhead"],
        launch_latency=numbers["launch_latency"],
        memory=int(numbers["memory"]),
        matmul_efficiency=numbers["matmul_efficiency"],
        conv_efficiency=numbers["conv_efficiency"],
        memory_efficiency=numbers["memory_efficiency"],
        multiprocessors=multiprocessors,
    )


def _positive(value: Any, key: str, error, table: str | None = None) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        name = f"{table}.{key}" if table else key
        raise error(
            f"`{name}` is {value!r}, not a positive number",
            key,
            table,
            hint=f"write {key} = 1e12 (a number, no quotes or units)",
        )
    return float(value)


def _dtype_table(value: Any, table: str, error) -> dict[str, float]:
    if not isinstance(value, dict):
        raise error(
            f"`{table}` must be a table of FLOP/s by dtype",
            table,
            hint=f"write [{table}] on its own line, then float32 = 1e12",
        )
    for key in value:
        if key not in DTYPES:
            raise error(f"unknown dtype `{key}` in [{table}]", key, table, hint=_closest(key, DTYPES, "dtypes"))
    if "float32" not in value:
        raise error(f"[{table}] has no `float32`", table, hint=f"add float32 = ... (FLOP/s) under [{table}]")
    return {key: _positive(v, key, error, table) for key, v in value.items()}


def _closest(name: str, known: tuple[str, ...], what: str) -> str:
    """`did you mean `X`?` for the known name closest to `name`, else the list of them."""
    close = difflib.get_close_matches(name, known, n=1)
    return f"did you mean `{close[0]}`?" if close else f"the {what} are {', '.join(known)}"


def _key_span(text: str, key: str, table: str | None) -> Span | None:
    """Where `key = ...` (or the header `[key]`) is written, inside `[table]` if given."""
    current = None
    for number, line in enumerate(text.split("\n"), 1):
        stripped = line.split("#")[0].strip()
        header = re.fullmatch(r"\[\s*([\w.-]+)\s*\]", stripped)
        if header:
            current = header.group(1)
            if table is None and current == key:
                return Span(number, line.index(key) + 1)
            continue
        if current == table and re.match(rf"{re.escape(key)}\s*=", stripped):
            return Span(number, line.index(key) + 1)
    return None


# ---------------------------------------------------------------------------
# Costs of one operation
# ---------------------------------------------------------------------------

# NOTE: [Work per element]
# Operations without a FLOP formula do work in proportion to the elements they touch
# (the numel of their largest tensor argument or output): ELEMENT_FLOPS gives it in
# FLOP-equivalents per element, 1 for the others (an addition).  Some operations run
# several kernels and pay the launch latency once for each: LAUNCHES.  Both tables come
# from measurements on the CPU (bench/cost_model.py, 2 threads), where these kernels are
# compute-bound: the per-element time of each family over that of an addition, and the
# fixed time of each over the launch latency, rounded.  On a GPU the memory roof is above
# every ELEMENT_FLOPS entry, so there they change nothing.  Families: random numbers (a
# generator draw, a compare and a scale per element: the slowest by far on a CPU),
# transcendental functions (a range reduction and a polynomial), softmax (an exp, a max
# and a sum), normalizations (statistics, then an affine map; batch norm also updates its
# running statistics) and pooling.
RANDOM = (
    "native_dropout", "bernoulli", "rand", "rand_like", "randn", "randn_like", "normal", "uniform", "randint",
    "randint_like",
)  # fmt: skip
TRANSCENDENTAL = (
    "tanh", "exp", "exp2", "expm1", "log", "log1p", "log2", "log10", "sigmoid", "erf", "erfc", "erfinv", "gelu", "silu",
    "mish", "softplus", "elu", "sin", "cos", "tan", "atan", "asin", "acos", "sinh", "cosh", "asinh", "atanh", "logit",
)  # fmt: skip
ELEMENT_FLOPS = {
    **dict.fromkeys(RANDOM, 80.0),
    **dict.fromkeys(TRANSCENDENTAL, 16.0),
    **dict.fromkeys(("_softmax", "_log_softmax", "logsumexp"), 4.0),
    "_safe_softmax": 30.0,
    **dict.fromkeys(("native_layer_norm", "native_group_norm", "_fused_rms_norm"), 3.0),
    **dict.fromkeys(
        (
            "native_batch_norm",
            "_native_batch_norm_legit",
            "_native_batch_norm_legit_functional",
            "_native_batch_norm_legit_no_training",
        ),
        10.0,
    ),
    **dict.fromkeys(
        (
            "native_layer_norm_backward",
            "native_batch_norm_backward",
            "native_group_norm_backward",
            "embedding_dense_backward",
        ),
        2.0,
    ),
    "native_dropout_backward": 4.0,
    "max_pool2d_with_indices": 24.0,
}
LAUNCHES = {
    "native_layer_norm": 3,
    "native_layer_norm_backward": 4,
    "_native_batch_norm_legit_functional": 5,
    "native_batch_norm_backward": 2,
    "native_dropout_backward": 3,
    "_safe_softmax": 4,
    "_softmax_backward_data": 2,
    "select_backward": 2,
    "slice_backward": 2,
    "embedding_dense_backward": 2,
    "max_pool2d_with_indices_backward": 3,
}
ALLOCATE_ONLY = frozenset({"empty", "empty_like", "empty_strided", "new_empty", "new_empty_strided"})


@dataclass(frozen=True)
class Work:
    """What one operation does, whatever the device: `flops` (FLOPs or, for `vector`
    operations, FLOP-equivalents: NOTE: [Work per element]), `bytes` moved (read and
    written), its `kind` (`matmul`, `conv`, `attention`, `vector` or `view`), the `dtype`
    name that selects the peak, how many kernels it `launches` and, for a matrix product,
    its output's `gemm` shape (NOTE: [Matmul tiles])."""

    flops: float
    bytes: int
    kind: str
    dtype: str
    launches: int = 1
    gemm: tuple[int, int, int] | None = None  # (batch, rows, columns) of a matrix product's output


def op_time_us(device: DeviceModel, target, args, kwargs, output) -> int:
    """Predicted microseconds of `target(*args, **kwargs)` returning `output` on `device`,
    at least 1: the roofline max(FLOPs / peak, bytes moved / bandwidth) plus the launch
    latency (see the module docstring).

    target: a torch._ops.OpOverload (an aten operator of an FX graph); args, kwargs and
    output hold real or `meta` tensors: only shapes and dtypes are read, so the same
    shapes always give the same number.
    """
    return max(1, round(roofline_seconds(device, op_work(target, args, kwargs, output)) * 1e6))


def roofline_seconds(device: DeviceModel, work: Work) -> float:
    """Seconds of `work` on `device`: max(compute, memory) + launch latency per kernel
    (Williams, Waterman and Patterson, CACM 2009); a view costs one launch latency."""
    if work.kind == "view":
        return device.launch_latency
    memory_s = work.bytes / (device.memory_bandwidth * device.memory_efficiency)
    if work.kind == "vector":
        compute_s = work.flops / device.vector_peak(work.dtype)
    else:
        efficiency = {"conv": device.conv_efficiency, "attention": ATTENTION_EFFICIENCY}.get(
            work.kind, device.matmul_efficiency
        )
        compute_s = work.flops / (device.matmul_peak(work.dtype) * efficiency * tile_utilisation(device, work.gemm))
    return max(compute_s, memory_s) + work.launches * device.launch_latency


# NOTE: [Matmul tiles]
# A GPU computes a matrix product's output in tiles, each on one streaming multiprocessor
# (SM), in waves of as many tiles as the device has SMs.  A product whose output does not
# fill whole tiles computes the padding anyway, and its last wave leaves SMs idle: "tile
# quantization" and "wave quantization" in NVIDIA's Matrix Multiplication Background
# User's Guide (Deep Learning Performance documentation).  So a matrix product reaches
# `matmul_efficiency` x the fraction of the work its tiles and waves do usefully: for
# rows M and columns N of a batch of B outputs, with tiles of TILE x TILE (half that edge
# for an edge shorter than TILE, as cuBLAS then picks narrower tiles),
#     useful = M x N / (padded M x padded N)   x   tiles / (waves x SMs)
# This is what makes a skinny or small GEMM (a LoRA adapter, a small batch) far slower per
# FLOP than a large one.  Without `multiprocessors` in the device file (the CPU) the
# utilisation is 1.
TILE = 128


def tile_utilisation(device: DeviceModel, gemm: tuple[int, int, int] | None) -> float:
    """The fraction of a matrix product's tile work that is useful on `device` (NOTE:
    [Matmul tiles]); 1 without a GEMM shape or a multiprocessor count."""
    if gemm is None or not device.multiprocessors or min(gemm) <= 0:
        return 1.0
    batch, rows, columns = gemm
    row_tile, column_tile = (TILE if edge >= TILE else TILE // 2 for edge in (rows, columns))
    row_tiles, column_tiles = -(-rows // row_tile), -(-columns // column_tile)
    tiles = batch * row_tiles * column_tiles
    waves = -(-tiles // device.multiprocessors)
    padding = rows * columns / (row_tiles * row_tile * column_tiles * column_tile)
    return padding * tiles / (waves * device.multiprocessors)


# NOTE: [Attention kernels]
# The fused attention kernels (NOTE: [Fused attention] in capture/attention.py) reach a
# smaller fraction of the tensor-core peak than cuBLAS GEMMs: FlashAttention-2 reaches
# "50-73% of the theoretical maximum FLOPs/s on A100" in its forward pass, less in its
# backward (Dao, "FlashAttention-2: faster attention with better parallelism and work
# partitioning", 2023, abstract and section 4.1).  ATTENTION_EFFICIENCY takes the low end
# for forward and backward, for flash and memory-efficient attention alike.  Their FLOPs
# are torch.utils.flop_counter's (every score of the s x s matrix), halved for causal
# attention, whose kernels skip the blocks above the diagonal.
ATTENTION_EFFICIENCY = 0.5
ATTENTION_OPS = (
    "_scaled_dot_product_flash_attention", "_scaled_dot_product_flash_attention_backward",
    "_scaled_dot_product_efficient_attention", "_scaled_dot_product_efficient_attention_backward",
    "_scaled_dot_product_cudnn_attention", "_scaled_dot_product_cudnn_attention_backward",
)  # fmt: skip
GEMMS = ("mm", "addmm", "bmm", "baddbmm")


def op_work(target, args, kwargs, output) -> Work:
    """The FLOPs and bytes of `target(*args, **kwargs)` returning `output`, from shapes.

    FLOPs: torch.utils.flop_counter's formula for matrix-class operators, else
    ELEMENT_FLOPS (1 by default) per element of the largest tensor, with LAUNCHES kernels
    (NOTE: [Work per element]).  Bytes: the distinct
    tensor arguments read plus the outputs that are not arguments, numel x element size
    each; allocations without a value (`empty`) and views move nothing.
    """
    import torch
    from torch.fx.operator_schemas import normalize_function

    from remat_dsl.plan.operators import is_view

    if isinstance(target, torch._ops.OpOverload) and is_view(target):
        return Work(0.0, 0, "view", "float32")
    name = _name(target)
    inputs = _tensors((args, kwargs))
    outputs = [t for t in _tensors(output) if not any(t is i for i in inputs)]
    moved = 0 if name in ALLOCATE_ONLY else sum(_nbytes(t) for t in (*inputs, *outputs))
    flops = _matmul_flops(target, args, kwargs, output)
    if flops is not None:
        if name in ATTENTION_OPS:
            normalized = normalize_function(target, args, kwargs, normalize_to_only_use_kwargs=True)
            causal = normalized is not None and normalized.kwargs.get("is_causal", False)
            return Work(float(flops) / (2 if causal else 1), moved, "attention", _dtype(inputs))
        kind = "conv" if "conv" in name else "matmul"
        return Work(float(flops), moved, kind, _dtype(inputs), gemm=_gemm_shape(name, output))
    elements = max((t.numel() for t in (*inputs, *outputs)), default=0)
    return Work(
        ELEMENT_FLOPS.get(name, 1.0) * elements, moved, "vector", _dtype(outputs or inputs), LAUNCHES.get(name, 1)
    )


def op_temp_bytes(device: DeviceModel, target, args, kwargs, output) -> int:
    """Temporary bytes `target(*args, **kwargs)` allocates beyond its inputs and outputs
    on `device`, from shapes alone (NOTE: [Temporary memory]); 0 for most operations."""
    name = _name(target)
    if device.kind == "cuda":
        return _flash_backward_workspace(args) if name == "_scaled_dot_product_flash_attention_backward" else 0
    if device.kind != "cpu":
        return 0
    inputs, outputs = _tensors((args, kwargs)), _tensors(output)
    if name in ("native_dropout", "native_dropout_backward") and inputs:
        return _nbytes(inputs[0])
    if name == "native_batch_norm_backward" and len(inputs) > 1:
        return _nbytes(inputs[1])
    if name == "_safe_softmax" and inputs:
        return inputs[0].numel()
    if name == "convolution" and outputs:
        return max(sum(_nbytes(t) for t in inputs[:2]), _nbytes(outputs[0]))
    if name == "convolution_backward" and inputs:
        return max(2 * sum(_nbytes(t) for t in outputs), _nbytes(inputs[0]))
    return 0


# NOTE: [Temporary memory]
# Rules measured on the CPU (remat_dsl.capture.profile, the allocator's events inside
# each operation), per op family; on a GPU every family but one is 0: cuBLAS keeps its workspace
# per handle, dropout and batch norm are fused kernels, and the workspace cuDNN takes for
# a convolution depends on the algorithm it picks at run time (not modelled).
# * native_dropout, native_dropout_backward: the mask in the input's dtype (bytes of the
#   first argument), drawn or converted before it is applied.
# * native_batch_norm_backward: one copy of the input activation (its second argument).
# * _safe_softmax: a boolean mask of the fully masked rows, one byte per element.
# * convolution: oneDNN reorders the input and weight, or the output, into its blocked
#   layout: the larger of the two.
# * convolution_backward: the reordered gradients, twice the bytes of the outputs, or
#   the reordered grad_output (its first argument) when that is larger.
# On a CUDA device one family is not 0: flash attention's backward, whose float32
# accumulators are sized by its arguments (`_flash_backward_workspace`).


def _gemm_shape(name: str, output) -> tuple[int, int, int] | None:
    """(batch, rows, columns) of the output of a matrix product (NOTE: [Matmul tiles])."""
    import torch

    if name not in GEMMS or not isinstance(output, torch.Tensor) or output.dim() not in (2, 3):
        return None
    shape = tuple(output.shape)
    return (1, *shape) if len(shape) == 2 else shape  # type: ignore[return-value]


def _flash_backward_workspace(args) -> int:
    """Bytes flash attention's backward allocates beside its outputs (NOTE: [Temporary
    memory]): FlashAttention-2's `mha_bwd` (flash_api.cpp, as PyTorch builds it) makes a
    float32 accumulator of dQ, [batch, queries rounded up to 128, heads, head size rounded
    up to 32 (256 above 192)], the float32 row sums softmax_d, [batch, heads, queries
    rounded up to 128], and with fewer key/value heads than query heads (grouped-query
    attention) dK and dV for every query head before summing them."""
    grad_out, key = args[0], args[2]
    batch, heads, queries, head = grad_out.shape
    rounded_queries = -(-queries // 128) * 128
    rounded_head = -(-head // 32) * 32 if head <= 192 else 256
    workspace = 4 * batch * rounded_queries * heads * (rounded_head + 1)
    if key.shape[1] != heads:
        workspace += 2 * batch * key.shape[2] * heads * head * key.element_size()
    return workspace


def _name(target) -> str:
    """The operator's name without namespace and overload: `mm`, `native_dropout` (a
    target that is not an aten operator: its Python name)."""
    schema = getattr(target, "_schema", None)
    return schema.name.split("::")[-1] if schema is not None else getattr(target, "__name__", str(target))


def _tensors(tree) -> list:
    """The distinct tensors (by identity) among the leaves of `tree`, in order."""
    import torch
    import torch.utils._pytree as pytree

    found: list[torch.Tensor] = []
    for leaf in pytree.tree_leaves(tree):
        if isinstance(leaf, torch.Tensor) and not any(leaf is t for t in found):
            found.append(leaf)
    return found


def _nbytes(tensor) -> int:
    return tensor.numel() * tensor.element_size()


def _dtype(tensors: list) -> str:
    """The dtype name of the first floating-point tensor of `tensors`, else float32."""
    for tensor in tensors:
        if tensor.is_floating_point():
            return str(tensor.dtype).removeprefix("torch.")
    return "float32"


def _matmul_flops(target, args, kwargs, output) -> int | None:
    """FLOPs from torch.utils.flop_counter's formula for `target` (shapes only), or None
    when it has none: the operation is not matrix-class.  The CPU's flash attention
    (in graphs captured on a CPU) counts as the CUDA one, whose arguments it shares."""
    import torch
    from torch.utils.flop_counter import flop_registry

    aten = torch.ops.aten
    same_as = {
        "_scaled_dot_product_flash_attention_for_cpu": aten._scaled_dot_product_flash_attention,
        "_scaled_dot_product_flash_attention_for_cpu_backward": aten._scaled_dot_product_flash_attention_backward,
    }
    formula = flop_registry.get(same_as.get(_name(target), getattr(target, "overloadpacket", None)))
    if formula is None:
        return None
    return int(formula(*args, **(kwargs or {}), out_val=output))
