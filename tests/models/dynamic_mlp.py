"""An MLP with dropout planned for batches of up to 8 (`remat plan --dynamic batch`): its ops take no size."""

import torch
from torch import nn


class DynamicMLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1, self.drop, self.head = nn.Linear(64, 512), nn.Dropout(0.1), nn.Linear(512, 10)

    def forward(self, x):
        h = self.fc1(x)
        for _ in range(6):  # activations larger than the parameters: a small budget recomputes some
            h = self.drop(torch.tanh(h * torch.sigmoid(h)))
        return self.head(h)


def build_model() -> nn.Module:
    torch.manual_seed(0)
    return DynamicMLP().train()


def sample_inputs() -> tuple:
    generator = torch.Generator().manual_seed(7)
    return (torch.randn(8, 64, generator=generator),)


def loss_fn(output: torch.Tensor) -> torch.Tensor:
    return output.square().mean()
