"""A forward that checks its data with `torch._check_tensor_all`, as transformers' Llava
checks its count of image tokens: dynamo keeps the check in the graph as a number read
from a tensor (NOTE: [Data reads] in remat_dsl/capture/fx.py)."""

import torch
from torch import nn


class Checked(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 8)

    def forward(self, x):
        torch._check_tensor_all((x > -100).all())
        return self.fc(x).square().mean()


def build_model():
    return Checked()


def sample_inputs():
    return (torch.randn(4, 8),)
