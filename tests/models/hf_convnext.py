"""Stock Hugging Face ConvNextForImageClassification from a config: depthwise convs,
LayerNorm over channels-last, layer scale, stochastic depth off."""

import torch
from transformers import ConvNextConfig, ConvNextForImageClassification


def build_model():
    torch.manual_seed(0)
    config = ConvNextConfig(hidden_sizes=[16, 32, 64, 128], depths=[1, 1, 2, 1], num_labels=10, image_size=64)
    return ConvNextForImageClassification(config)


def sample_inputs():
    generator = torch.Generator().manual_seed(1)
    return {
        "pixel_values": torch.randn(2, 3, 64, 64, generator=generator),
        "labels": torch.randint(0, 10, (2,), generator=generator),
    }
