"""A fixed position table kept as a plain module attribute, neither parameter nor buffer,
as stock VideoMAE keeps its sinusoidal table (NOTE: [Tensor attributes] in
remat_dsl/capture/fx.py)."""

import math

import torch
from torch import nn


class Embeddings(nn.Module):
    def __init__(self, positions: int, width: int):
        super().__init__()
        angles = torch.arange(positions)[:, None] / 10000 ** (torch.arange(width)[None, :] / width)
        self.table = torch.where(torch.arange(width) % 2 == 0, torch.sin(angles), torch.cos(angles))[None]

    def forward(self, x):
        return x + self.table.type_as(x).to(x.device)


class WithTable(nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(16, 16)
        self.embeddings = Embeddings(8, 16)
        self.head = nn.Linear(16, 3)

    def forward(self, x):
        h = torch.tanh(self.embeddings(self.proj(x))) / math.sqrt(16)
        return self.head(h).square().mean()


def build_model():
    torch.manual_seed(0)
    return WithTable()


def sample_inputs():
    return (torch.randn(4, 8, 16, generator=torch.Generator().manual_seed(1)),)
