"""Stock Hugging Face CLIPModel from a config, trained on its own contrastive loss
(`return_loss=True`): two towers, nested `BaseModelOutputWithPooling`s that dynamo's graph
returns ahead of the loss (NOTE: [Output order] in remat_dsl/capture/fx.py), and
`logits_per_image`, a view of `logits_per_text` (NOTE: [Aliased outputs])."""

import torch
from transformers import CLIPConfig, CLIPModel


def build_model():
    torch.manual_seed(0)
    config = CLIPConfig(
        text_config=dict(
            vocab_size=512,
            hidden_size=64,
            intermediate_size=128,
            num_hidden_layers=2,
            num_attention_heads=4,
            max_position_embeddings=32,
            bos_token_id=1,
            eos_token_id=2,
            pad_token_id=0,
        ),
        vision_config=dict(
            hidden_size=64,
            intermediate_size=128,
            num_hidden_layers=2,
            num_attention_heads=4,
            image_size=32,
            patch_size=8,
        ),
        projection_dim=32,
    )
    return CLIPModel(config)


def sample_inputs():
    generator = torch.Generator().manual_seed(1)
    ids = torch.randint(3, 512, (4, 16), generator=generator)
    return {"input_ids": ids, "pixel_values": torch.randn(4, 3, 32, 32, generator=generator), "return_loss": True}
