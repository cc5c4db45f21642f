"""An attention call whose keys have more heads than its queries: the op fails on the sample
inputs' shapes, and dynamo lists every argument before saying so (NOTE: [Capture errors])."""

import torch
import torch.nn.functional as F
from torch import nn


class Attention(nn.Module):
    def __init__(self):
        super().__init__()
        self.q = nn.Linear(32, 32)
        self.kv = nn.Linear(32, 256)

    def forward(self, x):
        q = self.q(x).view(2, 16, 4, 8).transpose(1, 2)
        k, v = self.kv(x).view(2, 16, 32, 8).transpose(1, 2).chunk(2, dim=1)  # 16 heads, 4 of queries
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=True, scale=0.125)
        return out.sum()


def build_model():
    return Attention()


def sample_inputs():
    return (torch.randn(2, 16, 32, generator=torch.Generator().manual_seed(0)),)
