"""Stock Hugging Face FalconForCausalLM from a small config, used as it comes: it splits its
fused query/key/value with `fused_qkv[..., [-2], :]`, an index tensor made in the forward
(NOTE: [Constant tensors] in remat_dsl/capture/fx.py)."""

import torch
from transformers import FalconConfig, FalconForCausalLM


def build_model():
    torch.manual_seed(0)
    config = FalconConfig(
        num_hidden_layers=3, hidden_size=128, num_attention_heads=4, vocab_size=512, max_position_embeddings=128
    )
    return FalconForCausalLM(config)


def sample_inputs():
    ids = torch.randint(0, 512, (2, 128), generator=torch.Generator().manual_seed(1))
    return {"input_ids": ids, "labels": ids}
