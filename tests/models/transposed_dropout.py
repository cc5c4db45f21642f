"""Dropout of a transposed bfloat16 tensor under autocast, as WavLM drops out its attention
output (`out_proj(...)` in (time, batch, feature) order, `.transpose(0, 1)`): eager draws
its noise in the input's memory order (NOTE: [Draws in memory order] in
remat_dsl/capture/fx.py).  Two layers, so that a plan below 100% recomputes."""

import torch
from torch import nn


class Layer(nn.Module):
    def __init__(self, width: int):
        super().__init__()
        self.proj, self.drop, self.norm = nn.Linear(width, width), nn.Dropout(0.1), nn.LayerNorm(width)
        self.up, self.down = nn.Linear(width, 4 * width), nn.Linear(4 * width, width)

    def forward(self, x):  # x: (batch, time, width)
        y = self.proj(x.transpose(0, 1)).transpose(0, 1)  # bfloat16, not contiguous
        x = self.norm(x + self.drop(y))
        return x + self.down(torch.relu(self.up(x)))


class TransposedDropout(nn.Module):
    def __init__(self, width: int = 32, layers: int = 2):
        super().__init__()
        self.layers = nn.ModuleList(Layer(width) for _ in range(layers))
        self.head = nn.Linear(width, 4)

    def forward(self, x):
        for layer in self.layers:
            x = layer(x)
        return self.head(x)


def build_model() -> nn.Module:
    torch.manual_seed(0)
    return TransposedDropout().train()


def sample_inputs() -> tuple:
    generator = torch.Generator().manual_seed(7)
    return (torch.randn(8, 64, 32, generator=generator),)


def loss_fn(output: torch.Tensor) -> torch.Tensor:
    return output.float().square().mean()
