"""A tiny model with what stock models do that a plain chain does not:
* constant tensors made in the forward: the index tensor of `x[..., [-2], :]` (Falcon
  splits its fused query/key/value so), an integer range `x[:, [0, 1, 2]]`, and
  `torch.tensor(0.5)` (NOTE: [Constant tensors] in remat_dsl/capture/fx.py);
* bilinear upsampling, whose eager backward is its own kernel (NOTE: [Native kernels]);
* dropout in a layer and then a drop path drawn with `torch.rand(shape)`, which reads no
  parameter (SegFormer's stochastic depth: NOTE: [Random ops in the prelude] in
  remat_dsl/solve/solvers/chain/partition.py)."""

import torch
import torch.nn.functional as F
from torch import nn


class Block(nn.Module):
    def __init__(self, width: int):
        super().__init__()
        self.fc, self.drop = nn.Linear(width, width), nn.Dropout(0.1)

    def forward(self, x):
        return x + self.drop(torch.tanh(self.fc(x)))


class ConstantsUpsample(nn.Module):
    def __init__(self):
        super().__init__()
        self.qkv = nn.Linear(16, 3 * 16)
        self.blocks = nn.ModuleList(Block(16) for _ in range(3))
        self.conv = nn.Conv2d(4, 4, 3, padding=1)
        self.head = nn.Linear(16 * 4, 8)

    def forward(self, x):
        fused = self.qkv(x).view(x.shape[0], x.shape[1], 3, 16)
        q, k = fused[..., [-2], :], fused[..., [-1], :]
        h = (q + k).squeeze(2)
        for index, block in enumerate(self.blocks):
            h = block(h)
            if index == 1:  # drop path: one draw per sample, after the blocks' dropouts began
                keep = (torch.rand(h.shape[0], 1, 1) + 0.9).floor()
                h = h * keep / 0.9
        image = h[:, [0, 1, 2, 3]].reshape(h.shape[0], 4, 4, 4)
        image = F.interpolate(self.conv(image), scale_factor=2.0, mode="bilinear", align_corners=False)
        pooled = F.avg_pool2d(image, 2) * torch.tensor(0.5)
        return self.head(pooled.flatten(1))


def build_model() -> nn.Module:
    torch.manual_seed(0)
    return ConstantsUpsample().train()


def sample_inputs() -> tuple:
    return (torch.randn(2, 6, 16, generator=torch.Generator().manual_seed(3)),)


def loss_fn(output: torch.Tensor) -> torch.Tensor:
    return output.square().mean()
