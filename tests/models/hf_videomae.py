"""Stock Hugging Face VideoMAEForVideoClassification from a config: its sinusoidal
position table is a plain tensor attribute of its embeddings, neither parameter nor
buffer, which the plan lists among its buffers (NOTE: [Tensor attributes] in
remat_dsl/capture/fx.py)."""

import torch
from transformers import VideoMAEConfig, VideoMAEForVideoClassification


def build_model():
    torch.manual_seed(0)
    config = VideoMAEConfig(
        image_size=32, patch_size=8, num_frames=4, tubelet_size=2, hidden_size=64, num_hidden_layers=2,
        num_attention_heads=4, intermediate_size=128, num_labels=5,
    )  # fmt: skip
    return VideoMAEForVideoClassification(config)


def sample_inputs():
    generator = torch.Generator().manual_seed(1)
    return {
        "pixel_values": torch.randn(2, 4, 3, 32, 32, generator=generator),
        "labels": torch.randint(0, 5, (2,), generator=generator),
    }
