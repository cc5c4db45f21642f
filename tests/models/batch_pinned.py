"""An MLP whose forward scales by 1 / batch size, a float: a capture with static shapes bakes
it into the multiplication, which `remat plan --dynamic batch` names (the view that takes
the batch size as a number follows it: `[B, 2, 32]`)."""

import torch
from torch import nn


class BatchPinned(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(64, 64), nn.Linear(32, 10)

    def forward(self, x):
        h = torch.relu(self.fc1(x))
        return self.fc2(h.view(h.shape[0], 2, 32).sum(1)) * (1.0 / h.shape[0])


def build_model() -> nn.Module:
    torch.manual_seed(0)
    return BatchPinned().train()


def sample_inputs() -> tuple:
    generator = torch.Generator().manual_seed(7)
    return (torch.randn(8, 64, generator=generator),)
