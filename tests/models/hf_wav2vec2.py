"""Stock Hugging Face Wav2Vec2ForSequenceClassification from a config: a waveform input
whose feature encoder sets `requires_grad` on it in training mode (NOTE: [Eager branches]
in remat_dsl/capture/fx.py).  LayerDrop and SpecAugment's time masks are off: they draw
Python-level random decisions (skip a layer, where to mask) that one fixed plan cannot
follow, and capture refuses them with PyTorch's reason at transformers' line."""

import torch
from transformers import Wav2Vec2Config, Wav2Vec2ForSequenceClassification


def build_model():
    torch.manual_seed(0)
    config = Wav2Vec2Config(
        vocab_size=32, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128,
        conv_dim=(32, 32, 32), conv_stride=(5, 2, 2), conv_kernel=(10, 3, 3), num_conv_pos_embeddings=16,
        num_conv_pos_embedding_groups=4, num_labels=3, layerdrop=0.0, mask_time_prob=0.0,
    )  # fmt: skip
    return Wav2Vec2ForSequenceClassification(config)


def sample_inputs():
    generator = torch.Generator().manual_seed(1)
    return {
        "input_values": torch.randn(2, 4000, generator=generator),
        "labels": torch.randint(0, 3, (2,), generator=generator),
    }
