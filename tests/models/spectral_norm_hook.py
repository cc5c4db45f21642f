"""A discriminator with the older `torch.nn.utils.spectral_norm` hook, which sets
`module.weight` before every forward (NOTE: [Stateful layers] in remat_dsl/capture/stateful.py)."""

import torch
from torch import nn
from torch.nn.utils import spectral_norm


class Discriminator(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = spectral_norm(nn.Conv2d(3, 8, 3, 2, 1))
        self.conv2 = spectral_norm(nn.Conv2d(8, 16, 3, 2, 1))
        self.fc = spectral_norm(nn.Linear(16 * 4 * 4, 1))

    def forward(self, x):
        x = nn.functional.leaky_relu(self.conv1(x), 0.2)
        x = nn.functional.leaky_relu(self.conv2(x), 0.2)
        return self.fc(x.flatten(1))


def build_model():
    torch.manual_seed(0)
    return Discriminator().train()


def sample_inputs():
    return (torch.randn(4, 3, 16, 16, generator=torch.Generator().manual_seed(1)),)


def loss_fn(output):
    return nn.functional.softplus(output).mean()
