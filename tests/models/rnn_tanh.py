"""An Elman network (`nn.RNN`, tanh) as in the PyTorch tutorials: batch-first characters,
embedded, a bidirectional two-layer RNN started from a given hidden state, and a
classifier on the last step."""

import torch
from torch import nn
from torch.nn import functional as F

LETTERS = 20


class CharRNN(nn.Module):
    def __init__(self, hidden: int = 32, classes: int = 6):
        super().__init__()
        self.embed = nn.Embedding(LETTERS, 16)
        self.rnn = nn.RNN(16, hidden, num_layers=2, nonlinearity="tanh", bidirectional=True, batch_first=True)
        self.out = nn.Linear(2 * hidden, classes)

    def forward(self, letters, h0):
        out, _ = self.rnn(self.embed(letters), h0)
        return self.out(out[:, -1])


def build_model():
    torch.manual_seed(0)
    return CharRNN().train()


def sample_inputs():
    g = torch.Generator().manual_seed(1)
    return (torch.randint(0, LETTERS, (5, 9), generator=g), torch.randn(4, 5, 32, generator=g))


def loss_fn(output):
    return F.cross_entropy(output, torch.arange(output.shape[0]) % output.shape[1])
