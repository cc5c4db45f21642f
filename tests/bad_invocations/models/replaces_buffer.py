import torch
from torch import nn

from _tiny import inputs


class ReplacesBuffer(nn.Module):
    """A table buffer the forward casts to its input's dtype and stores again, as
    Wav2Vec2-Conformer's relative positions do under autocast (`self.pe = pe.to(x.dtype)`)."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 8)
        self.table = nn.Buffer(torch.arange(8.0), persistent=False)

    def forward(self, x):
        h = self.fc(x)
        if self.table.dtype != h.dtype:
            self.table = self.table.to(h.dtype)
        return (h + self.table).float().sum()


def build_model():
    return ReplacesBuffer()


sample_inputs = inputs
