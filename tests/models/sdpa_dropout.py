"""A causal self-attention decoder written the ordinary way: `F.scaled_dot_product_attention`
with `dropout_p` while training (as nanoGPT writes it), three layers, batch first.  On the
CPU, attention with dropout runs PyTorch's math path (the CPU's fused kernel takes no
dropout), whose dropout draws from the generator like any other random op."""

import torch
import torch.nn.functional as F
from torch import nn


class Block(nn.Module):
    def __init__(self, width: int, heads: int, dropout: float):
        super().__init__()
        self.heads, self.dropout = heads, dropout
        self.ln_1, self.ln_2 = nn.LayerNorm(width), nn.LayerNorm(width)
        self.c_attn, self.c_proj = nn.Linear(width, 3 * width), nn.Linear(width, width)
        self.mlp = nn.Sequential(nn.Linear(width, 4 * width), nn.GELU(), nn.Linear(4 * width, width))

    def forward(self, x):
        batch, time, width = x.shape
        q, k, v = self.c_attn(self.ln_1(x)).split(width, dim=2)
        q, k, v = (t.view(batch, time, self.heads, width // self.heads).transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, dropout_p=self.dropout if self.training else 0.0, is_causal=True)
        x = x + self.c_proj(y.transpose(1, 2).contiguous().view(batch, time, width))
        return x + self.mlp(self.ln_2(x))


class Decoder(nn.Module):
    def __init__(self, vocab: int = 64, width: int = 32, heads: int = 4, layers: int = 3, dropout: float = 0.1):
        super().__init__()
        self.embed = nn.Embedding(vocab, width)
        self.blocks = nn.ModuleList(Block(width, heads, dropout) for _ in range(layers))
        self.head = nn.Linear(width, vocab)

    def forward(self, ids, targets):
        x = self.embed(ids)
        for block in self.blocks:
            x = block(x)
        return F.cross_entropy(self.head(x).flatten(0, 1), targets.flatten())


def build_model() -> nn.Module:
    torch.manual_seed(0)
    return Decoder().train()


def sample_inputs() -> tuple:
    generator = torch.Generator().manual_seed(3)
    ids = torch.randint(0, 64, (4, 64), generator=generator)
    return (ids, torch.roll(ids, -1, dims=1))
