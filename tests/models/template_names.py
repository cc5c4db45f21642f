"""Submodules and top-level ops named as a generated module names its own things (`out`,
`ctx`, `where`, `torch`, `device`, `len`, `p`, `b`, `pool`, `_s`, `operator`, `INPUTS`,
`FastModel`), with dropout (RNG states) and a top-level `torch.where` (an op named `where`):
the generated names never meet (NOTE: [Generated names] in remat_dsl/codegen/generate.py)."""

import torch
from torch import nn

NAMES = (
    "torch",
    "device",
    "len",
    "p",
    "b",
    "pool",
    "_s",
    "operator",
    "INPUTS",
    "FastModel",
    "aten_mm_default",
    "host_out",
)


class Names(nn.Module):
    def __init__(self):
        super().__init__()
        for name in ("out", "ctx", *NAMES):
            self.add_module(name, nn.Linear(8, 8))
        self.drop = nn.Dropout(0.2)

    def forward(self, x):
        h = self.out(x)
        h = torch.where(h > 0, h, self.ctx(h))
        for name in NAMES:
            h = getattr(self, name)(torch.relu(self.drop(h)))
        return h, torch.where(h > 0.1, h, -h)


def build_model():
    torch.manual_seed(0)
    return Names().train()


def sample_inputs():
    return (torch.randn(256, 8, generator=torch.Generator().manual_seed(1)),)


def loss_fn(output):
    a, b = output
    return a.square().mean() + b.mean()
