"""Stock Hugging Face OlmoForCausalLM from a small config (2 layers), used as it comes: its
attention block holds a third of the forward ops (NOTE: [Chains of two layers] in
remat_dsl/solve/solvers/chain/partition.py)."""

import torch
from transformers import OlmoConfig, OlmoForCausalLM


def build_model():
    torch.manual_seed(0)
    config = OlmoConfig(
        num_hidden_layers=2, hidden_size=128, intermediate_size=256, num_attention_heads=4, vocab_size=512,
        max_position_embeddings=128, pad_token_id=0, eos_token_id=1, bos_token_id=None,
    )  # fmt: skip
    return OlmoForCausalLM(config)


def sample_inputs():
    ids = torch.randint(0, 512, (2, 128), generator=torch.Generator().manual_seed(1))
    return {"input_ids": ids, "labels": ids}
