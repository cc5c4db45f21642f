"""InstanceNorm2d with `track_running_stats=True`: running statistics written back with
`copy_` (NOTE: [Stateful layers] in remat_dsl/capture/stateful.py)."""

import torch
from torch import nn


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.norm = nn.InstanceNorm2d(8, affine=True, track_running_stats=True)
        self.out = nn.Conv2d(8, 3, 3, padding=1)

    def forward(self, x):
        return self.out(torch.relu(self.norm(self.conv(x))))


def build_model():
    torch.manual_seed(0)
    return Net().train()


def sample_inputs():
    return (torch.randn(2, 3, 12, 12, generator=torch.Generator().manual_seed(1)),)


def loss_fn(output):
    return output.square().mean()
