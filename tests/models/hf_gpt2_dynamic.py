"""A stock Hugging Face GPT2LMHeadModel from a tiny config (2 layers, width 32, 128 tokens,
512 positions, GPT-2's dropout) planned once for every batch up to 8 and every sequence up
to 512 (`remat plan --dynamic batch,seq`): its ops take arguments computed from both sizes
(the causal mask's `arange`, `view(x, [B*S, 32])`, the attention's splits)."""

import torch
from transformers import GPT2Config, GPT2LMHeadModel


def build_model():
    torch.manual_seed(0)
    config = GPT2Config(n_layer=2, n_embd=32, n_head=2, n_positions=512, vocab_size=128, bos_token_id=0, eos_token_id=0)
    return GPT2LMHeadModel(config)


def sample_inputs():
    ids = torch.randint(0, 128, (8, 512), generator=torch.Generator().manual_seed(1))
    return {"input_ids": ids, "labels": ids}
