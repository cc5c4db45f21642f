"""A dropout mask read by the forward itself, under bfloat16 autocast on the CPU: capture
writes low-precision CPU dropout as eager runs it (NOTE: [Low-precision dropout] in
remat_dsl/capture/fx.py), which has no mask to read, so it is refused with that reason."""

import torch
from torch import nn


class Masked(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(16, 16)

    def forward(self, x):
        out, mask = torch.native_dropout(self.fc(x), 0.1, True)
        return (out * mask).float().square().mean()


def build_model():
    torch.manual_seed(0)
    return Masked()


def sample_inputs():
    return (torch.randn(4, 16, generator=torch.Generator().manual_seed(1)),)
