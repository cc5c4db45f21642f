"""A tiny MLP with dropout: small enough that its plan can be read and edited by hand."""

import torch
from torch import nn


class TinyMLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1, self.drop, self.fc2, self.head = (
            nn.Linear(32, 64),
            nn.Dropout(0.1),
            nn.Linear(64, 64),
            nn.Linear(64, 8),
        )

    def forward(self, x):
        h = self.drop(torch.relu(self.fc1(x)))
        return self.head(torch.relu(self.fc2(h)))


def build_model() -> nn.Module:
    torch.manual_seed(0)
    return TinyMLP().train()


def sample_inputs() -> tuple:
    generator = torch.Generator().manual_seed(7)
    return (torch.randn(16, 32, generator=generator),)


def loss_fn(output: torch.Tensor) -> torch.Tensor:
    return output.square().mean()
