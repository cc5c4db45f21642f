"""Llama-2-7B (Touvron et al., 2023) built from its published configuration: 32 layers,
hidden size 4096, 32 heads, MLP 11008, vocabulary 32000, bf16 parameters; one sequence of
4096 tokens, the model's own causal-LM loss (`labels=`).

Its 6.7 billion parameters take 13.5 GB in bf16 (27 GB while the fp32 initialisation
runs), more than this repository's 24 GiB test machine can hold with a training step, so
`remat plan` captures it with fake tensors (no weights or activations allocated) and
predicts the op costs for the device named with --device:

    remat plan examples/llama2_7b.py --device h100 --budget 40GiB > llama2_7b.plan
    remat codegen llama2_7b.plan -o llama2_7b_remat.py

`build_llama_2l` is the same model with 2 layers (fake capture too: for tests).
"""

from __future__ import annotations

import torch
from transformers import LlamaConfig, LlamaForCausalLM

BATCH = 1
SEQ = 4096
VOCAB = 32000


def config(layers: int = 32) -> LlamaConfig:
    """The configuration of meta-llama/Llama-2-7b-hf (its config.json), `layers` deep."""
    return LlamaConfig(
        hidden_size=4096,
        intermediate_size=11008,
        num_hidden_layers=layers,
        num_attention_heads=32,
        num_key_value_heads=32,
        vocab_size=VOCAB,
        max_position_embeddings=4096,
        rms_norm_eps=1e-5,
        hidden_act="silu",
        tie_word_embeddings=False,
    )


def build_model(layers: int = 32) -> torch.nn.Module:
    torch.manual_seed(0)
    return LlamaForCausalLM(config(layers)).to(torch.bfloat16)


def build_llama_2l() -> torch.nn.Module:
    return build_model(layers=2)


def sample_inputs():
    ids = torch.randint(0, VOCAB, (BATCH, SEQ), generator=torch.Generator().manual_seed(1))
    return {"input_ids": ids, "labels": ids}
