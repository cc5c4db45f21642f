"""Module names a plan name cannot hold (PyTorch allows any but `.`; torchvision's RegNet
names its blocks `block1-0`): the plan says `blocks.block1_0`, the generated module finds
the model's `blocks.block1-0.weight` by the same mapping."""

import torch
from torch import nn


class OddNames(nn.Module):
    def __init__(self):
        super().__init__()
        self.blocks = nn.ModuleDict(
            {"block1-0": nn.Linear(8, 16), "conv 1": nn.Linear(16, 16), "out+head": nn.Linear(16, 4)}
        )
        self.register_buffer("scale-factor", torch.full((16,), 0.5))

    def forward(self, x):
        h = torch.relu(self.blocks["block1-0"](x))
        h = torch.tanh(self.blocks["conv 1"](h) * getattr(self, "scale-factor"))
        return self.blocks["out+head"](h)


def build_model():
    torch.manual_seed(0)
    return OddNames()


def sample_inputs():
    return (torch.randn(4, 8, generator=torch.Generator().manual_seed(1)),)


def loss_fn(output):
    return output.square().mean()
