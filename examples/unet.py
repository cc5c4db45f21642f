"""Small U-Net for per-pixel classification: a graph with long skip connections, not a chain.

Encoder of 3 levels (two conv / BatchNorm2d / ReLU, then a 2x2 max-pool), a bottleneck
with Dropout2d, a decoder that upsamples with ConvTranspose2d and concatenates (torch.cat)
the encoder output of the same resolution, and a 1x1 conv head. The encoder outputs stay
alive until the decoder uses them, so the FB-graph is not a chain of blocks.

Model-file contract: `build_model()`, `sample_inputs()`, `loss_fn(output)`.
All operations are out of place (no `inplace=True`).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

BATCH = 4
SIZE = 64
IN_CH = 3
WIDTHS = (16, 32, 64, 128)  # channels of the three encoder levels and the bottleneck
NUM_CLASSES = 4
DROPOUT = 0.1
SEED = 0
INPUT_SEED = 1234


class DoubleConv(nn.Module):
    """(3x3 conv, BatchNorm2d, ReLU) twice, same spatial size."""

    def __init__(self, in_ch: int, out_ch: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(in_ch, out_ch, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(out_ch)
        self.relu1 = nn.ReLU()
        self.conv2 = nn.Conv2d(out_ch, out_ch, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(out_ch)
        self.relu2 = nn.ReLU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.relu1(self.bn1(self.conv1(x)))
        return self.relu2(self.bn2(self.conv2(x)))


class UNet(nn.Module):

    def __init__(
        self, in_ch: int = IN_CH, widths: tuple[int, int, int, int] = WIDTHS, num_classes: int = NUM_CLASSES
    ) -> None:
        super().__init__()
        w1, w2, w3, w4 = widths
        self.enc1 = DoubleConv(in_ch, w1)
        self.enc2 = DoubleConv(w1, w2)
        self.enc3 = DoubleConv(w2, w3)
        self.pool = nn.MaxPool2d(2)
        self.bottleneck = DoubleConv(w3, w4)
        self.drop = nn.Dropout2d(DROPOUT)
        self.up3 = nn.ConvTranspose2d(w4, w3, 2, stride=2)
        self.dec3 = DoubleConv(2 * w3, w3)
        self.up2 = nn.ConvTranspose2d(w3, w2, 2, stride=2)
        self.dec2 = DoubleConv(2 * w2, w2)
        self.up1 = nn.ConvTranspose2d(w2, w1, 2, stride=2)
        self.dec1 = DoubleConv(2 * w1, w1)
        self.head = nn.Conv2d(w1, num_classes, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        e1 = self.enc1(x)  # W x 64 x 64
        e2 = self.enc2(self.pool(e1))  # 2W x 32 x 32
        e3 = self.enc3(self.pool(e2))  # 4W x 16 x 16
        b = self.drop(self.bottleneck(self.pool(e3)))  # 8W x 8 x 8
        d3 = self.dec3(torch.cat([self.up3(b), e3], dim=1))
        d2 = self.dec2(torch.cat([self.up2(d3), e2], dim=1))
        d1 = self.dec1(torch.cat([self.up1(d2), e1], dim=1))
        return self.head(d1)  # NUM_CLASSES x 64 x 64 logits


def build_model() -> nn.Module:
    torch.manual_seed(SEED)
    model = UNet()
    model.train()
    return model


def _make_data() -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(INPUT_SEED)
    images = torch.randn(BATCH, IN_CH, SIZE, SIZE, generator=gen)
    masks = torch.randint(0, NUM_CLASSES, (BATCH, SIZE, SIZE), generator=gen, dtype=torch.long)
    return images, masks


IMAGES, MASKS = _make_data()


def sample_inputs() -> tuple:
    return (IMAGES.clone(),)


def loss_fn(output: torch.Tensor) -> torch.Tensor:
    """Per-pixel cross entropy of the logits (B x C x H x W) against the fixed MASKS."""
    return F.cross_entropy(output, MASKS)
