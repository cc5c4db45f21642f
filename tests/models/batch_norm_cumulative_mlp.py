"""An MLP as people write one, with BatchNorm1d keeping cumulative averages
(`momentum=None`) after each hidden layer: each step counts `num_batches_tracked` and
updates the running statistics with momentum 1 / count."""

import torch
from torch import nn


class MLP(nn.Module):
    def __init__(self, width=64):
        super().__init__()
        self.net = nn.Sequential(
            nn.Linear(32, width), nn.BatchNorm1d(width, momentum=None), nn.ReLU(),
            nn.Linear(width, width), nn.BatchNorm1d(width, momentum=None), nn.ReLU(),
            nn.Linear(width, 10),
        )  # fmt: skip

    def forward(self, x):
        return self.net(x)


def build_model():
    torch.manual_seed(0)
    return MLP().train()


def sample_inputs():
    g = torch.Generator().manual_seed(1)
    return (torch.randn(256, 32, generator=g),)


def loss_fn(out):
    return out.logsumexp(-1).mean()
