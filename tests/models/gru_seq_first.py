"""A sequence-first GRU tagger as people write one: tokens (time, batch) are embedded, run
through a two-layer `nn.GRU` (dropout between layers) in its default (time, batch, features) layout, and every step's
output is classified; the final hidden state is returned too."""

import torch
from torch import nn

VOCAB = 40


class Tagger(nn.Module):
    def __init__(self, width: int = 16, hidden: int = 24, tags: int = 5):
        super().__init__()
        self.embed = nn.Embedding(VOCAB, width)
        self.rnn = nn.GRU(width, hidden, num_layers=2, dropout=0.25)
        self.head = nn.Linear(hidden, tags)

    def forward(self, tokens):  # tokens: (time, batch)
        out, h_n = self.rnn(self.embed(tokens))
        return self.head(out), h_n


def build_model():
    torch.manual_seed(0)
    return Tagger().train()


def sample_inputs():
    return (torch.randint(0, VOCAB, (7, 3), generator=torch.Generator().manual_seed(1)),)


def loss_fn(output):
    logits, h_n = output
    return logits.logsumexp(-1).mean() + h_n.square().mean()
