"""A siamese encoder whose one BatchNorm2d keeps a cumulative average (`momentum=None`)
and is applied to both inputs: `num_batches_tracked` counts twice a step, and the second
update's momentum is 1 / (the count after the first + 1)."""

import torch
from torch import nn


class Siamese(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.bn = nn.BatchNorm2d(8, momentum=None)
        self.fc = nn.Linear(8, 4)

    def embed(self, x):
        return self.fc(torch.relu(self.bn(self.conv(x))).mean((2, 3)))

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
