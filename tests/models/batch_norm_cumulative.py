"""A small CNN whose BatchNorm keeps a cumulative average (`momentum=None`): each step it
reads `num_batches_tracked` into a Python float, which torch.compile cannot trace; the plan
computes the factor from the count (NOTE: [Cumulative averages] in remat_dsl/capture/stateful.py)."""

import torch
from torch import nn


def build_model():
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Conv2d(3, 8, 3), nn.BatchNorm2d(8, momentum=None), nn.ReLU(), nn.Flatten(), nn.Linear(8 * 6 * 6, 4)
    )


def sample_inputs():
    torch.manual_seed(1)
    return (torch.randn(4, 3, 8, 8),)


def loss_fn(out):
    return out.square().mean()
