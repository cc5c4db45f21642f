"""Attention that takes another path while traced than eagerly, as stock BigBird does under
transformers 5 (NOTE: [Eager agreement] in remat_dsl/capture/agreement.py): eagerly an
attention mask of ones is left out (`mask.all()` reads its values), traced it is kept, zeros
in float32 added to the scores.  Under bfloat16 autocast that makes the scores, the softmax
and the attention dropout float32 where eagerly they are bfloat16: other bits."""

import torch
from torch import nn

autocast = torch.bfloat16


class Attention(nn.Module):
    def __init__(self, width: int):
        super().__init__()
        self.qkv = nn.Linear(width, 3 * width)
        self.dropout = nn.Dropout(0.1)
        self.out = nn.Linear(width, width)

    def forward(self, x, mask):
        q, k, v = self.qkv(x).chunk(3, dim=-1)
        scores = q @ k.transpose(-1, -2) / q.shape[-1] ** 0.5
        if torch.compiler.is_compiling() or not mask.all():  # as transformers' `_ignore_bidirectional_mask_sdpa`
            scores = scores + (1.0 - mask[:, None, :]) * torch.finfo(torch.float32).min
        return x + self.out(self.dropout(scores.softmax(-1)) @ v)


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(64, 32)
        self.attention = Attention(32)
        self.head = nn.Linear(32, 64)

    def forward(self, ids):
        mask = torch.ones(ids.shape, device=ids.device)  # the model makes its own mask, as BigBird does
        h = self.attention(self.embed(ids), mask)
        return nn.functional.cross_entropy(self.head(h).flatten(0, 1).float(), ids.flatten())


def build_model():
    torch.manual_seed(0)
    return Model()


def sample_inputs():
    return (torch.randint(0, 64, (2, 16), generator=torch.Generator().manual_seed(1)),)
