"""Stock Hugging Face BertForMaskedLM from a config: keyword inputs with an attention mask
and labels, a `MaskedLMOutput` returned."""

import torch
from transformers import BertConfig, BertForMaskedLM


def build_model():
    torch.manual_seed(0)
    config = BertConfig(
        num_hidden_layers=2, hidden_size=64, num_attention_heads=4, intermediate_size=128, vocab_size=512,
        max_position_embeddings=64,
    )  # fmt: skip
    return BertForMaskedLM(config)


def sample_inputs():
    generator = torch.Generator().manual_seed(1)
    ids = torch.randint(0, 512, (2, 32), generator=generator)
    mask = torch.ones(2, 32, dtype=torch.long)
    mask[1, 24:] = 0
    return {"input_ids": ids, "attention_mask": mask, "labels": ids}
