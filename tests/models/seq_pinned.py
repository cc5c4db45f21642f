"""A batch-first model that keeps the first half of its sequence, `h[:, : S // 2]`: the
slice's end follows S other than as k*B*S + a*B + b*S + c, so `remat plan --dynamic
batch,seq` names it and plans for the sample sequence length, the batch still varying."""

import torch
from torch import nn


class SeqPinned(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed, self.head = nn.Embedding(32, 16), nn.Linear(16, 4)

    def forward(self, tokens):
        h = torch.tanh(self.embed(tokens))
        return self.head(h[:, : h.shape[1] // 2])


def build_model():
    torch.manual_seed(0)
    return SeqPinned().train()


def sample_inputs():
    return (torch.randint(0, 32, (4, 10), generator=torch.Generator().manual_seed(1)),)


def loss_fn(output):
    return output.square().mean()
