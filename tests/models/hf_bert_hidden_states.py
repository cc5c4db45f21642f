"""Stock Hugging Face BertModel from a config, asked for its hidden states: its output
holds the last one twice, as `last_hidden_state` and as `hidden_states[-1]` (NOTE: [Output
order] in remat_dsl/capture/fx.py); the loss reads both places."""

import torch
from transformers import BertConfig, BertModel


def build_model():
    torch.manual_seed(0)
    config = BertConfig(
        num_hidden_layers=2, hidden_size=64, num_attention_heads=4, intermediate_size=128, vocab_size=512,
        max_position_embeddings=64,
    )  # fmt: skip
    return BertModel(config)


def sample_inputs():
    generator = torch.Generator().manual_seed(1)
    return {"input_ids": torch.randint(0, 512, (2, 32), generator=generator), "output_hidden_states": True}


def loss_fn(output):
    return output.last_hidden_state.square().mean() + output.hidden_states[-1].mean() + output.hidden_states[1].mean()
