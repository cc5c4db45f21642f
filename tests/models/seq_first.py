"""A sequence-first language model, as people write one with nn.TransformerEncoder's default
layout: tokens (batch, time) are embedded, run through the encoder as (time, batch, width),
and the head's logits are returned batch-first as a transposed view, `head(h).transpose(0, 1)`.
The loss reshapes them, so the gradient reaching the output is laid out batch-first."""

import torch
from torch import nn
from torch.nn import functional as F

VOCAB = 50


class SeqFirst(nn.Module):
    def __init__(self, width: int = 32, layers: int = 2):
        super().__init__()
        self.embed = nn.Embedding(VOCAB, width)
        layer = nn.TransformerEncoderLayer(width, nhead=4, dim_feedforward=64, dropout=0.1)
        self.encoder = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.head = nn.Linear(width, VOCAB)

    def forward(self, tokens):
        h = self.encoder(self.embed(tokens).transpose(0, 1))  # (time, batch, width)
        return self.head(h).transpose(0, 1)  # (batch, time, vocab), not contiguous


def build_model():
    torch.manual_seed(0)
    return SeqFirst().train()


def sample_inputs():
    return (torch.randint(0, VOCAB, (4, 12), generator=torch.Generator().manual_seed(1)),)


def loss_fn(logits):
    targets = torch.arange(logits.shape[0] * logits.shape[1]) % VOCAB
    return F.cross_entropy(logits.reshape(-1, VOCAB), targets)
