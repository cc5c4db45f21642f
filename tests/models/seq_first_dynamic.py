"""A sequence-first language model planned once for every (time, batch) up to its sample's
(`remat plan --dynamic S=0,B=1`): tokens (time, batch) run through nn.TransformerEncoder in
its default sequence-first layout, with dropout, and come out as (time, batch, vocab)."""

import torch
from torch import nn

VOCAB = 50


class SeqFirstLM(nn.Module):
    def __init__(self, width: int = 16, layers: int = 1):
        super().__init__()
        self.embed = nn.Embedding(VOCAB, width)
        layer = nn.TransformerEncoderLayer(width, nhead=2, dim_feedforward=32, dropout=0.1)
        self.encoder = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.head = nn.Linear(width, VOCAB)

    def forward(self, tokens):  # tokens: (time, batch)
        return self.head(self.encoder(self.embed(tokens)))


def build_model():
    torch.manual_seed(0)
    return SeqFirstLM().train()


def sample_inputs():
    return (torch.randint(0, VOCAB, (20, 6), generator=torch.Generator().manual_seed(1)),)


def loss_fn(logits):
    return logits.logsumexp(-1).mean()
