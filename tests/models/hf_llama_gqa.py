"""Stock Hugging Face LlamaForCausalLM with grouped-query attention at 128 tokens, used as it
comes: traced, transformers repeats the shared key/value heads; eagerly SDPA shares them
inside its kernel (NOTE: [Eager branches] in remat_dsl/capture/fx.py)."""

import torch
from transformers import LlamaConfig, LlamaForCausalLM


def build_model():
    torch.manual_seed(0)
    config = LlamaConfig(
        num_hidden_layers=2, hidden_size=128, intermediate_size=256, num_attention_heads=4, num_key_value_heads=2,
        vocab_size=256, max_position_embeddings=128,
    )  # fmt: skip
    return LlamaForCausalLM(config)


def sample_inputs():
    ids = torch.randint(0, 256, (2, 128), generator=torch.Generator().manual_seed(1))
    return {"input_ids": ids, "labels": ids}
