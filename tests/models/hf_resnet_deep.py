"""Stock Hugging Face ResNetForImageClassification from a config with many layers per
stage (3 + 14 + 14 + 12 basic layers, EfficientNet-V2-S's shape: more layers than
max_blocks (40, ChainConfig), in few stages), an `ImageClassifierOutputWithNoAttention`."""

import torch
from transformers import ResNetConfig, ResNetForImageClassification


def build_model():
    torch.manual_seed(0)
    config = ResNetConfig(
        embedding_size=8, hidden_sizes=[8, 16, 16, 32], depths=[3, 14, 14, 12], layer_type="basic", num_labels=5
    )
    return ResNetForImageClassification(config)


def sample_inputs():
    generator = torch.Generator().manual_seed(1)
    return {
        "pixel_values": torch.randn(2, 3, 32, 32, generator=generator),
        "labels": torch.randint(0, 5, (2,), generator=generator),
    }
