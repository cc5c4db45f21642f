"""Stock Hugging Face MixtralForCausalLM (mixture of experts) from a small config, used as
it comes: its experts run `transformers.grouped_mm_fallback`, a custom operator, which a
plan cannot hold (NOTE: [Custom operators] in remat_dsl/capture/fx.py)."""

import torch
from transformers import MixtralConfig, MixtralForCausalLM


def build_model():
    torch.manual_seed(0)
    config = MixtralConfig(
        num_hidden_layers=2, hidden_size=64, intermediate_size=128, num_attention_heads=4, num_key_value_heads=2,
        vocab_size=256, max_position_embeddings=64, num_local_experts=4, num_experts_per_tok=2,
    )  # fmt: skip
    return MixtralForCausalLM(config)


def sample_inputs():
    ids = torch.randint(0, 256, (2, 32), generator=torch.Generator().manual_seed(1))
    return {"input_ids": ids, "labels": ids}
