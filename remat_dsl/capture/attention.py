"""Scaled-dot-product attention as the fused kernel a CUDA device runs, captured anywhere.

NOTE: [Fused attention]
Eager PyTorch runs `F.scaled_dot_product_attention` on a CUDA device as one fused kernel,
flash attention (Dao, "FlashAttention-2: faster attention with better parallelism and work
partitioning", 2023) or memory-efficient attention (Rabe and Staats, "Self-attention does
not need O(n^2) memory", 2021, as in xFormers), chosen at run time by
`select_sdp_backend` (PyTorch, aten/src/ATen/native/transformers/cuda/sdp_utils.cpp) from
the dtype, head size, mask and dropout.  Neither kernel allocates the s x s score matrix:
the forward keeps its output and the log-sum-exp of each row (plus, for dropout, the
Philox seed and offset it drew), and the backward recomputes the scores block by block.

A plan for a CUDA device made on this CPU (`remat plan --device h100`) is captured with
fake tensors (NOTE: [Fake capture] in pipeline.py), where that run-time choice cannot be
made: `cuda_attention` installs, for the capture, a `scaled_dot_product_attention` that
makes the same choice (`cuda_backend`, PyTorch's rules for devices of compute capability
8.0 and above, which every shipped CUDA device is) and calls the same aten entry point
the composite in aten/src/ATen/native/transformers/attention.cpp calls, with the same
argument preparation (the head size padded to a multiple of 8 for flash attention; a
boolean mask turned into an additive one for memory-efficient attention).  AOTAutograd
then traces that operator's own backward (`_scaled_dot_product_flash_attention_backward`,
`_scaled_dot_product_efficient_attention_backward`), so the plan holds one forward op and
one backward op per attention call, with the kernel's memory; the cost model takes their
FLOPs from torch.utils.flop_counter at the device's tensor-core rate (halved for causal
attention, whose kernels skip the masked blocks: `cost.py`).  A generated module calls
these aten operators as eager PyTorch's composite does on the device: where the device
picks the same kernel, the gradients are eager's bit for bit.  A captured model run on a
CUDA device gets the same graph from PyTorch's own choice.  Where neither kernel applies
(float64, a head size the kernels do not take, grouped-query attention with a mask) the
math decomposition is captured, as eager runs it.  Dropout inside attention is random
like every other random op: its recomputation replays the RNG state it first ran with.

Not modelled: devices of compute capability 8.6 and 8.9 (RTX 3060, RTX 4090, L4, L40S)
refuse flash attention's backward for head sizes above 192 (PyTorch's
`check_requires_grad_and_head_dim_gt192_constraints_on_sm86_89`); such a model on those
devices is captured with flash attention and the device runs memory-efficient attention.
"""

from __future__ import annotations

import contextlib
import math
from typing import Iterator

import torch
import torch.nn.functional as F

FLASH = "flash"
EFFICIENT = "efficient"
MATH = "math"
FLASH_MAX_HEAD = 256  # sdp_utils.cpp, check_head_dim_size_flash
LOW_PRECISION = (torch.float16, torch.bfloat16)


def cuda_backend(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, enable_gqa=False) -> str:
    """The kernel PyTorch's `select_sdp_backend` picks on a CUDA device of compute
    capability 8.0 or above for these arguments: FLASH, EFFICIENT or MATH (NOTE: [Fused
    attention]).  query, key, value: [batch, heads, sequence, head size] tensors (real,
    fake or meta: only shapes, strides and dtypes are read)."""
    if not all(isinstance(t, torch.Tensor) and t.dim() == 4 for t in (query, key, value)):
        return MATH  # check_tensor_shapes: batched 4-D inputs only
    if len({query.dtype, key.dtype, value.dtype}) != 1 or any(t.size(-2) == 0 for t in (query, key, value)):
        return MATH
    if any(t.stride(-1) != 1 and t.size(-1) != 1 for t in (query, key, value)):
        return MATH  # check_last_dim_stride_equals_1_dense
    dtype, head = query.dtype, query.size(-1)
    same_heads = query.size(1) == key.size(1) == value.size(1)
    same_batch = query.size(0) == key.size(0) == value.size(0)
    if not same_batch:
        return MATH
    flash = (
        dtype in LOW_PRECISION
        and attn_mask is None
        and key.size(-1) == head == value.size(-1) <= FLASH_MAX_HEAD
        and not (is_causal and query.size(-2) != key.size(-2))  # check_flash_causal_non_square_seqlens
        and (same_heads or (enable_gqa and query.size(1) % key.size(1) == 0 and key.size(1) == value.size(1)))
    )
    if flash:
        return FLASH
    alignment = 4 if dtype == torch.float32 else 8  # check_head_dim_size_mem_efficient
    efficient = (
        dtype in (*LOW_PRECISION, torch.float32)
        and same_heads
        and key.size(-1) == head
        and head % alignment == 0
        and value.size(-1) % alignment == 0
    )
    return EFFICIENT if efficient else MATH


def _flash(query, key, value, dropout_p, is_causal, scale):
    """attention.cpp's flash branch: pad the head size to a multiple of 8, scale by the
    unpadded size, slice the output back."""
    head = query.size(-1)
    scale = scale if scale is not None else 1.0 / math.sqrt(head)
    pad = -head % 8
    if pad:
        query, key, value = (F.pad(t, (0, pad)) for t in (query, key, value))
    out = torch.ops.aten._scaled_dot_product_flash_attention(query, key, value, dropout_p, is_causal, scale=scale)[0]
    return out[..., :head] if pad else out


def _efficient(query, key, value, attn_mask, dropout_p, is_causal, scale):
    """attention.cpp's memory-efficient branch: a boolean mask becomes 0 / -inf in the
    query's dtype, padded to a multiple of 16 in its last dimension and sliced back, and
    broadcast to [batch, heads, queries, keys]."""
    if attn_mask is not None:
        if attn_mask.dtype == torch.bool:
            attn_mask = torch.where(attn_mask, 0.0, float("-inf")).to(query.dtype)
        shape = (query.size(0), query.size(1), query.size(2), key.size(2))
        keys = attn_mask.size(-1)
        pad = -keys % 16
        if pad:
            attn_mask = F.pad(attn_mask, (0, pad))[..., :keys]
        attn_mask = attn_mask.expand(shape)
    logsumexp = torch.is_grad_enabled() and any(t.requires_grad for t in (query, key, value))
    return torch.ops.aten._scaled_dot_product_efficient_attention(
        query, key, value, attn_mask, logsumexp, dropout_p, is_causal, scale=scale
    )[0]


@contextlib.contextmanager
def cuda_attention() -> Iterator[None]:
    """While capturing a CUDA plan on another device kind: `F.scaled_dot_product_attention`
    runs the fused CUDA operator `cuda_backend` picks (NOTE: [Fused attention])."""
    original = F.scaled_dot_product_attention

    def scaled_dot_product_attention(
        query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False
    ):
        backend = cuda_backend(query, key, value, attn_mask, dropout_p, is_causal, enable_gqa)
        if backend == FLASH:  # grouped-query attention too: the kernel takes fewer key and value heads
            return _flash(query, key, value, dropout_p, is_causal, scale)
        if backend == EFFICIENT:
            return _efficient(query, key, value, attn_mask, dropout_p, is_causal, scale)
        return original(query, key, value, attn_mask, dropout_p, is_causal, scale=scale, enable_gqa=enable_gqa)

    F.scaled_dot_product_attention = scaled_dot_product_attention
    try:
        yield
    finally:
        F.scaled_dot_product_attention = original
