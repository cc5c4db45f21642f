"""A word-level LSTM language model as in PyTorch's examples/word_language_model: sequence-first
(time, batch) tokens, dropout on the embeddings, between the layers and on the output, an
LSTM without biases, and the hidden state `(h0, c0)` carried in from the previous batch, as one tuple argument."""

import torch
import torch.nn.functional as F
from torch import nn

VOCAB = 50


class RNNModel(nn.Module):
    def __init__(self, width: int = 20, hidden: int = 28, layers: int = 3, dropout: float = 0.3):
        super().__init__()
        self.drop = nn.Dropout(dropout)
        self.encoder = nn.Embedding(VOCAB, width)
        self.rnn = nn.LSTM(width, hidden, layers, dropout=dropout, bias=False)
        self.decoder = nn.Linear(hidden, VOCAB)

    def forward(self, tokens, hidden):
        emb = self.drop(self.encoder(tokens))
        output, hidden = self.rnn(emb, hidden)
        return self.decoder(self.drop(output)).view(-1, VOCAB), hidden


def build_model():
    torch.manual_seed(0)
    return RNNModel().train()


def sample_inputs():
    g = torch.Generator().manual_seed(1)
    tokens = torch.randint(0, VOCAB, (9, 4), generator=g)
    hidden = (torch.randn(3, 4, 28, generator=g), torch.randn(3, 4, 28, generator=g))
    return (tokens, hidden)


def loss_fn(output):
    logits, _ = output
    targets = torch.arange(logits.shape[0]) % VOCAB
    return F.cross_entropy(logits, targets)
