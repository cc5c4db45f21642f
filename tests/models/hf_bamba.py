"""Stock Hugging Face BambaForCausalLM from a config (Mamba-2 mixers and attention in one
stack), without its CUDA kernels (not installed here).  With its default `use_cache=True`
a training forward builds a cache and the mixer takes its cache path, which slices the
convolution's output (`[:, :, -seq_len:]`) and so computes other last bits of the
gradients than without a cache.  A plan is a training step without a cache: when the
inputs leave `use_cache` out, the plan is of `use_cache=False` and says so above the
constant (NOTE: [Stock models] in remat_dsl/capture/fx.py).  These inputs pass it, so that
eager PyTorch, called with them, is the same computation to compare with bit for bit."""

import torch
from transformers import BambaConfig, BambaForCausalLM


def build_model():
    torch.manual_seed(0)
    config = BambaConfig(
        vocab_size=512, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        intermediate_size=128, attn_layer_indices=[1], mamba_d_state=8, mamba_n_heads=8, mamba_d_head=16,
        mamba_chunk_size=16, pad_token_id=0,
    )  # fmt: skip
    return BambaForCausalLM(config)


def sample_inputs():
    ids = torch.randint(3, 500, (2, 64), generator=torch.Generator().manual_seed(1))
    return {"input_ids": ids, "labels": ids, "use_cache": False}
