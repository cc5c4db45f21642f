"""Shared pieces of the bad model files: a small model and its inputs (not itself a model file)."""

import torch
from torch import nn


class Small(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 8)

    def forward(self, x):
        return self.fc(x).relu()


def inputs():
    return (torch.randn(4, 8, generator=torch.Generator().manual_seed(0)),)
