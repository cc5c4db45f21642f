"""A siamese encoder: one BatchNorm2d applied to two inputs in one forward (its running
statistics updated twice a step), GroupNorm and LayerNorm beside it."""

import torch
from torch import nn


class Siamese(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.bn = nn.BatchNorm2d(8)
        self.gn = nn.GroupNorm(2, 8)
        self.ln = nn.LayerNorm(8)
        self.fc = nn.Linear(8, 4)

    def embed(self, x):
        h = torch.relu(self.bn(self.conv(x)))
        h = self.gn(h).mean((2, 3))
        return self.fc(self.ln(h))

    def forward(self, a, b):
        return self.embed(a), self.embed(b)


def build_model():
    torch.manual_seed(0)
    return Siamese().train()


def sample_inputs():
    g = torch.Generator().manual_seed(1)
    return (torch.randn(4, 3, 8, 8, generator=g), torch.randn(4, 3, 8, 8, generator=g))


def loss_fn(output):
    a, b = output
    return (a - b).square().mean()
