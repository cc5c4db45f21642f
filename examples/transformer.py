"""Small torch.nn.Transformer encoder-decoder.

Model-file contract: `build_model()`, `sample_inputs()`, `loss_fn(output)`.
`examples/transformer.py:build_transformer_4x4` has 4 encoder and 4 decoder layers.
"""

from __future__ import annotations

import torch
from torch import nn

D_MODEL = 64
BATCH = 8
SRC_LEN = 32
TGT_LEN = 24
SEED = 0
INPUT_SEED = 1234


class Seq2Seq(nn.Module):
    def __init__(self, layers: int = 2) -> None:
        super().__init__()
        self.transformer = nn.Transformer(
            d_model=D_MODEL,
            nhead=4,
            num_encoder_layers=layers,
            num_decoder_layers=layers,
            dim_feedforward=128,
            dropout=0.1,
            batch_first=True,
        )

    def forward(self, src: torch.Tensor, tgt: torch.Tensor) -> torch.Tensor:
        return self.transformer(src, tgt)


def build_model(layers: int = 2) -> nn.Module:
    torch.manual_seed(SEED)
    model = Seq2Seq(layers)
    model.train()
    return model


def build_transformer_4x4() -> nn.Module:
    return build_model(layers=4)


def _make_data() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(INPUT_SEED)
    src = torch.randn(BATCH, SRC_LEN, D_MODEL, generator=gen)
    tgt = torch.randn(BATCH, TGT_LEN, D_MODEL, generator=gen)
    target = torch.randn(BATCH, TGT_LEN, D_MODEL, generator=gen)
    return src, tgt, target


SRC, TGT, TARGET = _make_data()


def sample_inputs() -> tuple:
    return (SRC.clone(), TGT.clone())


def loss_fn(output: torch.Tensor) -> torch.Tensor:
    """Mean squared error of the output against the fixed TARGET tensor."""
    return ((output - TARGET) ** 2).mean()
