"""A plain PyTorch model with the shapes stock models have: positional and keyword inputs,
a non-tensor argument, one tensor passed as two arguments, and a dict output holding None,
a nested tuple and views of intermediates (a Linear on a 3-D input, a transpose)."""

import torch
from torch import nn


class DictOut(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1, self.drop, self.fc2 = nn.Linear(16, 32), nn.Dropout(0.1), nn.Linear(32, 16)

    def forward(self, x, target, scale: float = 1.0, mask=None):
        h = self.drop(torch.relu(self.fc1(x))) * scale
        y = self.fc2(h)  # a view of the matmul's output: [4, 10, 16]
        loss = (y - target).square().mean()
        return {"loss": loss, "y": y, "nothing": None, "pair": (h.sum(-1), (2 * y).transpose(1, 2))}


def build_model():
    torch.manual_seed(0)
    return DictOut()


def sample_inputs():
    x = torch.randn(4, 10, 16, generator=torch.Generator().manual_seed(1))
    return (x,), {"target": x, "scale": 0.5}
