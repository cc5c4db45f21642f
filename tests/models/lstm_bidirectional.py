"""A two-layer bidirectional LSTM sentence classifier, batch-first, as it is written in most
tutorials: embedded tokens (batch, time), the final hidden states of both directions of the
last layer concatenated into a linear head."""

import torch
from torch import nn

VOCAB = 60


class Classifier(nn.Module):
    def __init__(self, width: int = 16, hidden: int = 24, classes: int = 4):
        super().__init__()
        self.embed = nn.Embedding(VOCAB, width)
        self.lstm = nn.LSTM(width, hidden, num_layers=2, bidirectional=True, batch_first=True)
        self.head = nn.Linear(2 * hidden, classes)

    def forward(self, tokens):
        out, (h_n, c_n) = self.lstm(self.embed(tokens))
        return self.head(torch.cat([h_n[-2], h_n[-1]], dim=1))


def build_model():
    torch.manual_seed(0)
    return Classifier().train()


def sample_inputs():
    return (torch.randint(0, VOCAB, (3, 7), generator=torch.Generator().manual_seed(1)),)


def loss_fn(output):
    return output.logsumexp(-1).mean()
