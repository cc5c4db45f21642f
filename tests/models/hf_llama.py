"""Stock Hugging Face LlamaForCausalLM from a small config, used as it comes (rotary
embeddings, RMSNorm, gated MLP, `labels=` for its own loss)."""

import torch
from transformers import LlamaConfig, LlamaForCausalLM


def build_model():
    torch.manual_seed(0)
    config = LlamaConfig(
        num_hidden_layers=2, hidden_size=64, intermediate_size=128, num_attention_heads=4, num_key_value_heads=2,
        vocab_size=256, max_position_embeddings=64,
    )  # fmt: skip
    return LlamaForCausalLM(config)


def sample_inputs():
    ids = torch.randint(0, 256, (2, 32), generator=torch.Generator().manual_seed(1))
    return {"input_ids": ids, "labels": ids}
