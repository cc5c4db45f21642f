"""Stock Hugging Face ViTForImageClassification from a config: pixel values and labels by
keyword, an `ImageClassifierOutput` returned."""

import torch
from transformers import ViTConfig, ViTForImageClassification


def build_model():
    torch.manual_seed(0)
    config = ViTConfig(
        num_hidden_layers=2, hidden_size=64, num_attention_heads=4, intermediate_size=128, image_size=32, patch_size=8,
        num_labels=10,
    )  # fmt: skip
    return ViTForImageClassification(config)


def sample_inputs():
    generator = torch.Generator().manual_seed(1)
    return {
        "pixel_values": torch.randn(2, 3, 32, 32, generator=generator),
        "labels": torch.randint(0, 10, (2,), generator=generator),
    }
