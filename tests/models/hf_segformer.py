"""Stock Hugging Face SegformerForSemanticSegmentation from a small config, used as it
comes: its head asks for every hidden state (transformers installs output hooks on that
first call: NOTE: [Stock models] in remat_dsl/capture/fx.py), upsamples them bilinearly
(NOTE: [Native kernels]) and its drop path draws `rand(shape)` after the first
attention's dropout (NOTE: [Random ops in the prelude] in remat_dsl/solve/solvers/chain/partition.py)."""

import torch
from transformers import SegformerConfig, SegformerForSemanticSegmentation


def build_model():
    torch.manual_seed(0)
    config = SegformerConfig(
        num_encoder_blocks=2, depths=[1, 1], sr_ratios=[2, 1], hidden_sizes=[32, 64], num_attention_heads=[1, 2],
        decoder_hidden_size=64, num_labels=5,
    )  # fmt: skip
    return SegformerForSemanticSegmentation(config)


def sample_inputs():
    generator = torch.Generator().manual_seed(1)
    return {
        "pixel_values": torch.randn(2, 3, 64, 64, generator=generator),
        "labels": torch.randint(0, 5, (2, 64, 64), generator=generator),
    }
