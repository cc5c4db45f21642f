"""A tiny conv net with BatchNorm (buffer updates) and dropout: small enough to fuzz its plans."""

import torch
from torch import nn


def build_model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Conv2d(3, 8, 3, padding=1),
        nn.BatchNorm2d(8),
        nn.ReLU(),
        nn.Dropout(0.1),
        nn.Conv2d(8, 8, 3, padding=1),
        nn.BatchNorm2d(8),
        nn.ReLU(),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(8, 4),
    ).train()


def sample_inputs() -> tuple:
    return (torch.randn(4, 3, 8, 8, generator=torch.Generator().manual_seed(3)),)


def loss_fn(output: torch.Tensor) -> torch.Tensor:
    return output.square().mean()
