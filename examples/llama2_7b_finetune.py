"""Llama-2-7B fine-tuned in fp32 with AdamW, as in the OffMate chapter of Zhao's thesis
("Optimizing Memory Usage when Training Deep Neural Networks", 2024, ch. 4, Table 4.2):
the published configuration (32 layers, hidden size 4096, 32 heads, MLP 11008, vocabulary
32000), fp32 parameters, a batch of 4 sequences of 512 tokens, the model's own causal-LM
loss (`labels=`).

Its 6.7 billion parameters take 27 GB in fp32, their gradients 27 GB more and AdamW's two
states 54 GB: the whole step is planned with the optimizer, captured with fake tensors
(nothing is allocated here) and costed for the device named with --device:

    remat plan examples/llama2_7b_finetune.py --device rtx3060 --optimizer adamw --budget 10GiB > ft.plan
    remat codegen ft.plan -o llama2_7b_ft.py

`build_llama_2l` is the same model with 2 layers (for tests).
"""

from __future__ import annotations

import torch
from llama2_7b import config
from transformers import LlamaForCausalLM

BATCH = 4
SEQ = 512
VOCAB = 32000


def build_model(layers: int = 32) -> torch.nn.Module:
    torch.manual_seed(0)
    return LlamaForCausalLM(config(layers))


def build_llama_2l() -> torch.nn.Module:
    return build_model(layers=2)


def sample_inputs():
    ids = torch.randint(0, VOCAB, (BATCH, SEQ), generator=torch.Generator().manual_seed(1))
    return {"input_ids": ids, "labels": ids}
