"""Stock Hugging Face LlamaForCausalLM with LoRA adapters from peft, as `get_peft_model`
returns it: the base weights frozen, adapters on the attention's q and v projections.
Short sequences: the frozen weights, not the activations, fill the memory."""

import torch
from peft import LoraConfig, get_peft_model
from transformers import LlamaConfig, LlamaForCausalLM


def build_model():
    torch.manual_seed(0)
    config = LlamaConfig(
        num_hidden_layers=2, hidden_size=128, intermediate_size=256, num_attention_heads=4, num_key_value_heads=2,
        vocab_size=512, max_position_embeddings=64,
    )  # fmt: skip
    lora = LoraConfig(r=8, lora_alpha=16, target_modules=["q_proj", "v_proj"], lora_dropout=0.05)
    return get_peft_model(LlamaForCausalLM(config), lora)


def sample_inputs():
    ids = torch.randint(0, 512, (1, 16), generator=torch.Generator().manual_seed(1))
    return {"input_ids": ids, "labels": ids}
