"""One Linear applied twice under bfloat16 autocast, as ALBERT shares its layer's weights:
eagerly autocast casts the weight once and reuses the cast, so the two uses' gradients are
summed in bfloat16; a trace casts at each use and sums in float32 (NOTE: [Eager agreement]
in remat_dsl/capture/agreement.py)."""

import torch
from torch import nn

autocast = torch.bfloat16


class Shared(nn.Module):
    def __init__(self):
        super().__init__()
        self.layer, self.norm, self.head = nn.Linear(32, 32), nn.LayerNorm(32), nn.Linear(32, 4)

    def forward(self, x):
        for _ in range(2):
            x = self.norm(x + self.layer(x))
        return self.head(x)


def build_model():
    torch.manual_seed(0)
    return Shared()


def sample_inputs():
    return (torch.randn(16, 32, generator=torch.Generator().manual_seed(1)),)


def loss_fn(output):
    return output.float().square().mean()
