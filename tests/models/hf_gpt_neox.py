"""Stock Hugging Face GPTNeoXForCausalLM from a small config, used as it comes (parallel
residual: attention and MLP read the same input and their sums meet after both; rotary
embeddings, `labels=` for its own loss)."""

import torch
from transformers import GPTNeoXConfig, GPTNeoXForCausalLM


def build_model():
    torch.manual_seed(0)
    config = GPTNeoXConfig(
        num_hidden_layers=4, hidden_size=128, intermediate_size=512, num_attention_heads=4, vocab_size=512,
        max_position_embeddings=128, use_parallel_residual=True,
    )  # fmt: skip
    return GPTNeoXForCausalLM(config)


def sample_inputs():
    ids = torch.randint(0, 512, (4, 128), generator=torch.Generator().manual_seed(1))
    return {"input_ids": ids, "labels": ids}
