"""A residual MLP that checkpoints each block itself, as its author writes it:
`from torch.utils.checkpoint import checkpoint` and `checkpoint(block, x, use_reentrant=False)`
in the forward, dropout inside the checkpointed blocks.  `build_reentrant` checkpoints each
block with `torch.utils.checkpoint.checkpoint(..., use_reentrant=True)` instead, and
`build_sequential` runs the blocks with `checkpoint_sequential` in two segments."""

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint, checkpoint_sequential


class Block(nn.Module):
    def __init__(self, width: int, dropout: float):
        super().__init__()
        self.norm = nn.LayerNorm(width)
        self.up, self.down = nn.Linear(width, 4 * width), nn.Linear(4 * width, width)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x):
        return x + self.dropout(self.down(F.gelu(self.up(self.norm(x)))))


class Net(nn.Module):
    def __init__(self, mode: str, width: int = 32, layers: int = 4, dropout: float = 0.1):
        super().__init__()
        self.mode = mode
        self.embed = nn.Linear(16, width)
        self.blocks = nn.Sequential(*(Block(width, dropout) for _ in range(layers)))
        self.head = nn.Linear(width, 10)

    def forward(self, x, target):
        x = self.embed(x)
        if self.mode == "sequential":
            x = checkpoint_sequential(self.blocks, 2, x, use_reentrant=False)
        else:
            for block in self.blocks:
                if self.mode == "reentrant":
                    x = torch.utils.checkpoint.checkpoint(block, x, use_reentrant=True)
                else:
                    x = checkpoint(block, x, use_reentrant=False)
        return F.cross_entropy(self.head(x), target)


def build_model() -> nn.Module:
    torch.manual_seed(0)
    return Net("non-reentrant").train()


def build_reentrant() -> nn.Module:
    torch.manual_seed(0)
    return Net("reentrant").train()


def build_sequential() -> nn.Module:
    torch.manual_seed(0)
    return Net("sequential").train()


def sample_inputs() -> tuple:
    generator = torch.Generator().manual_seed(1)
    return (torch.randn(256, 16, generator=generator), torch.randint(0, 10, (256,), generator=generator))
