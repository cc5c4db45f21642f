"""A loss over the elements a boolean mask selects, as GLPN's depth loss does
(`pred[target > 0]`): a tensor whose size depends on the data (NOTE: [Data reads] in
remat_dsl/capture/fx.py)."""

import torch
from torch import nn


class Masked(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 8)

    def forward(self, x):
        y = self.fc(x)
        return y[x > 0].square().mean()


def build_model():
    return Masked()


def sample_inputs():
    return (torch.randn(4, 8),)
