"""Stock Hugging Face AlbertForMaskedLM from a config: one layer module run for every
layer (ALBERT shares its layers' parameters), keyword inputs and labels."""

import torch
from transformers import AlbertConfig, AlbertForMaskedLM


def build_model():
    torch.manual_seed(0)
    config = AlbertConfig(
        num_hidden_layers=3, hidden_size=64, embedding_size=32, intermediate_size=128, num_attention_heads=4,
        vocab_size=256, max_position_embeddings=128,
    )  # fmt: skip
    return AlbertForMaskedLM(config)


def sample_inputs():
    ids = torch.randint(0, 256, (4, 128), generator=torch.Generator().manual_seed(1))
    return {"input_ids": ids, "labels": ids}
