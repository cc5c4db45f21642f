"""An LSTMCell run for a few steps, as a recurrent model is written by hand: AOTAutograd
splits its gates with `aten.unsafe_split`, a view whose schema does not say so (NOTE in
remat_dsl/plan/operators.py, VIEW_EXTRA), and the step returns a tuple (h, c)."""

import torch
from torch import nn


class Cell(nn.Module):
    def __init__(self, steps: int = 3):
        super().__init__()
        self.steps = steps
        self.cell = nn.LSTMCell(8, 16)
        self.head = nn.Linear(16, 4)

    def forward(self, x):  # x: (time, batch, 8)
        h = c = torch.zeros(x.shape[1], 16)
        for t in range(self.steps):
            h, c = self.cell(x[t], (h, c))
        return self.head(h), c


def build_model():
    torch.manual_seed(0)
    return Cell().train()


def sample_inputs():
    return (torch.randn(3, 5, 8, generator=torch.Generator().manual_seed(1)),)


def loss_fn(output):
    logits, c = output
    return logits.square().mean() + c.mean()
