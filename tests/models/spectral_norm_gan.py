"""A GAN discriminator as DCGAN/SNGAN code writes it: strided convolutions under
`torch.nn.utils.parametrizations.spectral_norm`, LeakyReLU (in place); the power iteration
updates `_u`/`_v` in place every training step (NOTE: [Stateful layers] in remat_dsl/capture/stateful.py)."""

import torch
from torch import nn
from torch.nn.utils.parametrizations import spectral_norm


class Discriminator(nn.Module):
    def __init__(self, channels=3, width=8):
        super().__init__()
        self.net = nn.Sequential(
            spectral_norm(nn.Conv2d(channels, width, 4, 2, 1)),
            nn.LeakyReLU(0.2, inplace=True),
            spectral_norm(nn.Conv2d(width, width * 2, 4, 2, 1)),
            nn.LeakyReLU(0.2, inplace=True),
            spectral_norm(nn.Conv2d(width * 2, 1, 4, 1, 0)),
        )

    def forward(self, x):
        return self.net(x).flatten(1)


def build_model():
    torch.manual_seed(0)
    return Discriminator().train()


def sample_inputs():
    return (torch.randn(4, 3, 16, 16, generator=torch.Generator().manual_seed(1)),)


def loss_fn(output):
    return nn.functional.softplus(-output).mean()
