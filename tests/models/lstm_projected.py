"""A bidirectional LSTM with projections (`proj_size`), batch-first, as a speech encoder is
written: features (batch, time, 12) through two layers whose hidden state is projected to 8,
the last step of the output pooled into a classifier."""

import torch
from torch import nn


class Encoder(nn.Module):
    def __init__(self):
        super().__init__()
        self.lstm = nn.LSTM(12, 20, num_layers=2, proj_size=8, bidirectional=True, batch_first=True)
        self.head = nn.Linear(16, 3)

    def forward(self, features):
        out, (h_n, c_n) = self.lstm(features)
        return self.head(out[:, -1]), c_n


def build_model():
    torch.manual_seed(0)
    return Encoder().train()


def sample_inputs():
    return (torch.randn(4, 6, 12, generator=torch.Generator().manual_seed(1)),)


def loss_fn(output):
    logits, c_n = output
    return logits.square().mean() + c_n.abs().mean()
