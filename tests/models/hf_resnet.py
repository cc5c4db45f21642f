"""Stock Hugging Face ResNetForImageClassification (a small ResNet-50 shape: bottleneck
layers, BatchNorm in training mode) from a config, an `ImageClassifierOutputWithNoAttention`."""

import torch
from transformers import ResNetConfig, ResNetForImageClassification


def build_model():
    torch.manual_seed(0)
    config = ResNetConfig(
        embedding_size=16, hidden_sizes=[32, 64, 128, 256], depths=[1, 2, 2, 1], layer_type="bottleneck", num_labels=10
    )
    return ResNetForImageClassification(config)


def sample_inputs():
    generator = torch.Generator().manual_seed(1)
    return {
        "pixel_values": torch.randn(2, 3, 64, 64, generator=generator),
        "labels": torch.randint(0, 10, (2,), generator=generator),
    }
