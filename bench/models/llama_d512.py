"""The Llama-style decoder of issue 13: stock Hugging Face LlamaForCausalLM, d=512, 4 layers,
8 heads, batch 4 x 256 tokens, its own loss from `labels=`."""

import torch
from transformers import LlamaConfig, LlamaForCausalLM


def build_model():
    torch.manual_seed(0)
    config = LlamaConfig(
        num_hidden_layers=4, hidden_size=512, intermediate_size=1376, num_attention_heads=8, num_key_value_heads=8,
        vocab_size=8000, max_position_embeddings=256,
    )  # fmt: skip
    return LlamaForCausalLM(config)


def sample_inputs():
    ids = torch.randint(0, 8000, (4, 256), generator=torch.Generator().manual_seed(1))
    return {"input_ids": ids, "labels": ids}
