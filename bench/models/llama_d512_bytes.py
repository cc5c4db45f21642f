"""bench/models/llama_d512.py with a byte-sized vocabulary (512 tokens): the same stock
Hugging Face LlamaForCausalLM decoder stack (d=512, 4 layers, 8 heads, batch 4 x 256, its
own loss from `labels=`), but logits of 2 MiB instead of 31 MiB, so that the decoder
layers' activations, not the LM head's, make the peak.  With 8,000 tokens no plan that
keeps its tensors on the device reaches 40% of the autograd peak (the LM head's backward
alone holds 38% of it).  `:build_8_layers` selects the same decoder 8 layers deep."""

import torch
from transformers import LlamaConfig, LlamaForCausalLM


def build_model(layers: int = 4):
    torch.manual_seed(0)
    config = LlamaConfig(
        num_hidden_layers=layers, hidden_size=512, intermediate_size=1376, num_attention_heads=8, num_key_value_heads=8,
        vocab_size=512, max_position_embeddings=256,
    )  # fmt: skip
    return LlamaForCausalLM(config)


def build_8_layers():
    """The same decoder 8 layers deep (`llama_d512_bytes.py:build_8_layers`)."""
    return build_model(8)


def sample_inputs():
    ids = torch.randint(0, 512, (4, 256), generator=torch.Generator().manual_seed(1))
    return {"input_ids": ids, "labels": ids}
