"""Small residual conv network: conv / BatchNorm2d / ReLU blocks, global pool, linear head.

Model-file contract: `build_model()`, `sample_inputs()`, `loss_fn(output)`.
All operations are out of place (no `inplace=True`).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

BATCH = 8
NUM_CLASSES = 10
SEED = 0
INPUT_SEED = 1234


class BasicBlock(nn.Module):
    """Two 3x3 conv + BN, a residual add, ReLU; a 1x1 conv + BN shortcut when the shape changes."""

    def __init__(self, in_ch: int, out_ch: int, stride: int = 1) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(in_ch, out_ch, 3, stride=stride, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(out_ch)
        self.relu1 = nn.ReLU()
        self.conv2 = nn.Conv2d(out_ch, out_ch, 3, stride=1, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(out_ch)
        self.relu2 = nn.ReLU()
        if stride != 1 or in_ch != out_ch:
            self.downsample = nn.Sequential(
                nn.Conv2d(in_ch, out_ch, 1, stride=stride, bias=False),
                nn.BatchNorm2d(out_ch),
            )
        else:
            self.downsample = nn.Identity()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.relu1(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return self.relu2(out + self.downsample(x))


class SmallResNet(nn.Module):
    def __init__(self, num_classes: int = NUM_CLASSES) -> None:
        super().__init__()
        self.stem = nn.Sequential(
            nn.Conv2d(3, 16, 3, stride=1, padding=1, bias=False),
            nn.BatchNorm2d(16),
            nn.ReLU(),
        )
        self.layer1 = BasicBlock(16, 16)
        self.layer2 = BasicBlock(16, 16)
        self.layer3 = BasicBlock(16, 32, stride=2)
        self.layer4 = BasicBlock(32, 32)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(32, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.stem(x)
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        x = torch.flatten(self.pool(x), 1)
        return self.fc(x)


def build_model() -> nn.Module:
    torch.manual_seed(SEED)
    model = SmallResNet()
    model.train()
    return model


def _make_data() -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(INPUT_SEED)
    images = torch.randn(BATCH, 3, 32, 32, generator=gen)
    labels = torch.randint(0, NUM_CLASSES, (BATCH,), generator=gen, dtype=torch.long)
    return images, labels


IMAGES, LABELS = _make_data()


def sample_inputs() -> tuple:
    return (IMAGES.clone(),)


def loss_fn(output: torch.Tensor) -> torch.Tensor:
    """Cross entropy of the logits against the fixed LABELS."""
    return F.cross_entropy(output, LABELS)
