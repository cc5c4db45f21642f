"""A classifier on a pooled first token beside a sequence branch whose output it
discards, as the classification heads of stock CANINE and BigBird do.  Eager PyTorch
runs the branch: its dropout draws from the generator before the pooled dropout does
(NOTE: [Discarded draws] in remat_dsl/capture/fx.py), and its parameters require grad
but get none (NOTE: [Frozen and unused parameters] in remat_dsl/plan/ir.py)."""

import torch
from torch import nn


class DiscardedBranch(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = nn.Linear(16, 16)
        self.branch = nn.Linear(16, 16)
        self.pooler = nn.Linear(16, 16)
        self.dropout = nn.Dropout(0.1)
        self.head = nn.Linear(16, 3)

    def forward(self, x):
        h = torch.tanh(self.body(x))
        self.dropout(self.branch(h))  # the sequence output, which the head discards
        pooled = self.dropout(torch.tanh(self.pooler(h[:, 0])))
        return self.head(pooled).square().mean()


def build_model():
    torch.manual_seed(0)
    return DiscardedBranch()


def sample_inputs():
    return (torch.randn(4, 8, 16, generator=torch.Generator().manual_seed(1)),)
