"""InstanceNorm2d with running statistics and `momentum=None`: PyTorch passes momentum
0.0, so its running statistics keep their initial values while it trains."""

import torch
from torch import nn


def build_model():
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Conv2d(3, 8, 3, padding=1), nn.InstanceNorm2d(8, affine=True, track_running_stats=True, momentum=None),
        nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(8, 4),
    ).train()  # fmt: skip


def sample_inputs():
    g = torch.Generator().manual_seed(1)
    return (torch.randn(4, 3, 8, 8, generator=g),)


def loss_fn(out):
    return out.square().mean()
