"""A small DenseNet (Huang et al., 2017): 6 dense layers, each BatchNorm, ReLU and a 3x3
convolution over the concatenation of every earlier layer's output.  No separator cuts
the dense layers, so they form one block of 25 forward ops whose saved tensors are most
of the step's memory (NOTE: [Saved tensors are phantoms] in remat_dsl/solve/solvers/ilp/hiremate.py)."""

import torch
from torch import nn


class DenseNet(nn.Module):
    def __init__(self, layers: int = 6, growth: int = 16, stem: int = 16, classes: int = 10):
        super().__init__()
        self.stem = nn.Conv2d(3, stem, 3, padding=1)
        self.layers = nn.ModuleList()
        channels = stem
        for _ in range(layers):
            self.layers.append(
                nn.Sequential(nn.BatchNorm2d(channels), nn.ReLU(), nn.Conv2d(channels, growth, 3, padding=1))
            )
            channels += growth
        self.head = nn.Linear(channels, classes)

    def forward(self, x):
        features = [self.stem(x)]
        for layer in self.layers:
            features.append(layer(torch.cat(features, 1)))
        return self.head(torch.cat(features, 1).mean((2, 3)))


def build_model():
    torch.manual_seed(0)
    return DenseNet()


def sample_inputs():
    return (torch.randn(4, 3, 32, 32, generator=torch.Generator().manual_seed(1)),)
