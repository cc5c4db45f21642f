"""Stock Hugging Face MobileNetV2ForImageClassification from a config: inverted residuals,
depthwise convs, ReLU6, BatchNorm."""

import torch
from transformers import MobileNetV2Config, MobileNetV2ForImageClassification


def build_model():
    torch.manual_seed(0)
    config = MobileNetV2Config(depth_multiplier=0.35, image_size=64, num_labels=10)
    return MobileNetV2ForImageClassification(config)


def sample_inputs():
    generator = torch.Generator().manual_seed(1)
    return {
        "pixel_values": torch.randn(2, 3, 64, 64, generator=generator),
        "labels": torch.randint(0, 10, (2,), generator=generator),
    }
