"""Stock Hugging Face GPT2LMHeadModel from a config, used as it comes: keyword inputs,
`labels=` so the model computes its own loss, `use_cache` left at its default, tied input
and output embeddings, a `CausalLMOutputWithCrossAttentions` returned."""

import torch
from transformers import GPT2Config, GPT2LMHeadModel


def build_model():
    torch.manual_seed(0)
    config = GPT2Config(n_layer=2, n_embd=64, n_head=4, n_positions=32, vocab_size=256, bos_token_id=0, eos_token_id=0)
    return GPT2LMHeadModel(config)


def sample_inputs():
    ids = torch.randint(0, 256, (2, 32), generator=torch.Generator().manual_seed(1))
    return {"input_ids": ids, "labels": ids}
