"""Llama-2-7B with LoRA adapters from peft, fine-tuned with AdamW, as in the OffMate chapter
of Zhao's thesis ("Optimizing Memory Usage when Training Deep Neural Networks", 2024, ch. 4,
section 4.8.1): the published Llama-2-7B configuration (examples/llama2_7b.py) with its
fp32 weights frozen, rank-16 adapters on the attention's q and v projections as
`get_peft_model` returns them (no wrapper), a batch of 4 sequences of 512 tokens.

The frozen base takes 27 GB in fp32: it is kept in host memory and prefetched layer by
layer, while the 8.4 M adapter parameters, their gradients and AdamW's states stay small.
Captured with fake tensors and costed for the device named with --device:

    remat plan examples/llama2_7b_lora.py --device rtx3060 --optimizer adamw --budget 10GiB > lora.plan
    remat codegen lora.plan -o llama2_7b_lora_ft.py
"""

from __future__ import annotations

import torch
from llama2_7b import config
from peft import LoraConfig, get_peft_model
from transformers import LlamaForCausalLM

BATCH = 4
SEQ = 512
VOCAB = 32000
RANK = 16


def build_model(layers: int = 32) -> torch.nn.Module:
    torch.manual_seed(0)
    lora = LoraConfig(r=RANK, lora_alpha=2 * RANK, target_modules=["q_proj", "v_proj"], lora_dropout=0.0)
    return get_peft_model(LlamaForCausalLM(config(layers)), lora)


def sample_inputs():
    ids = torch.randint(0, VOCAB, (BATCH, SEQ), generator=torch.Generator().manual_seed(1))
    return {"input_ids": ids, "labels": ids}
