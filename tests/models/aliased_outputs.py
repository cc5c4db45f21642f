"""Outputs that alias each other or an input (NOTE: [Aliased outputs] in
remat_dsl/capture/fx.py): a view of another output, two views of one intermediate, a view
of the input, and one tensor at two places (NOTE: [Output order]); the loss
differentiates every one of them but `side`, so `side`'s parameters keep `.grad` None
(NOTE: [Absent output gradients] in remat_dsl/codegen/runtime.py)."""

import torch
from torch import nn


class AliasedOutputs(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 8)
        self.proj = nn.Linear(8, 6)
        self.side = nn.Linear(8, 2)

    def forward(self, x):
        h = self.fc(x).relu()
        z = self.proj(h)
        return {
            "h": h,
            "h_t": h.t(),
            "z_rows": z.view(2, 2, 6),
            "z_t": z.t(),
            "x_t": x.t(),
            "pair": (z.relu(), h),
            "side": self.side(h),
        }


def build_model():
    torch.manual_seed(0)
    return AliasedOutputs()


def sample_inputs():
    return (torch.randn(4, 8, generator=torch.Generator().manual_seed(0)),)


def loss_fn(out):
    parts = out["h"].square().mean(), (out["h_t"] * 3).sum(), out["z_rows"].sum(), out["z_t"][0].square().sum()
    return sum(parts) + out["x_t"].sum() + out["pair"][1].mean() + out["pair"][0].sum()
