"""A forward that checks its data with `.item()`, as ProphetNet's shift of its labels does:
the step's Python would depend on a tensor's value."""

import torch
from torch import nn


class Checked(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 8)

    def forward(self, x):
        assert torch.all(x > -100).item(), "out of range"
        return self.fc(x).square().mean()


def build_model():
    return Checked()


def sample_inputs():
    return (torch.randn(4, 8),)
