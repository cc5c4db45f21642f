"""Llama-2-13B fine-tuned in bf16 with AdamW, as in the OffMate chapter of Zhao's thesis
("Optimizing Memory Usage when Training Deep Neural Networks", 2024, ch. 4, section 4.8.1):
the published configuration of meta-llama/Llama-2-13b-hf (40 layers, hidden size 5120, 40
heads, MLP 13824, vocabulary 32000), bf16 parameters, a batch of 4 sequences of 512 tokens,
the model's own causal-LM loss (`labels=`).

Its 13 billion parameters take 26 GB in bf16, more than an RTX 4090's 24 GB before a
gradient or an optimizer state is counted: the whole step is planned with the optimizer,
captured with fake tensors (nothing is allocated here) and costed for the device named
with --device.  A parameter updated on the host is updated in an fp32 master copy there:

    remat plan examples/llama2_13b_bf16.py --device rtx4090 --optimizer adamw --budget 22GiB > 13b.plan
    remat codegen 13b.plan -o llama2_13b_ft.py
"""

from __future__ import annotations

import torch
from transformers import LlamaConfig, LlamaForCausalLM

BATCH = 4
SEQ = 512
VOCAB = 32000


def config(layers: int = 40) -> LlamaConfig:
    """The configuration of meta-llama/Llama-2-13b-hf (its config.json), `layers` deep."""
    return LlamaConfig(
        hidden_size=5120,
        intermediate_size=13824,
        num_hidden_layers=layers,
        num_attention_heads=40,
        num_key_value_heads=40,
        vocab_size=VOCAB,
        max_position_embeddings=4096,
        rms_norm_eps=1e-5,
        hidden_act="silu",
        tie_word_embeddings=False,
    )


def build_model(layers: int = 40) -> torch.nn.Module:
    torch.manual_seed(0)
    return LlamaForCausalLM(config(layers)).to(torch.bfloat16)


def sample_inputs():
    ids = torch.randint(0, VOCAB, (BATCH, SEQ), generator=torch.Generator().manual_seed(1))
    return {"input_ids": ids, "labels": ids}
