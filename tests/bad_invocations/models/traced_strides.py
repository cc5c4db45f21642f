"""Stock Hugging Face Doge from a small config: torch.compile's trace expects other strides
of `softplus_backward`'s result than the operator gives (a PyTorch bug in torch 2.13;
`torch.compile(model, backend="aot_eager", fullgraph=True)` fails on it too), so the
captured graph's next `view` fails on real values.  Refused with both strides named, not
blamed on the sample inputs."""

import torch
from transformers import DogeConfig, DogeForCausalLM


def build_model():
    torch.manual_seed(0)
    config = DogeConfig(
        vocab_size=512, hidden_size=64, num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=2,
        intermediate_size=128, pad_token_id=0,
    )  # fmt: skip
    return DogeForCausalLM(config)


def sample_inputs():
    ids = torch.randint(3, 500, (2, 64), generator=torch.Generator().manual_seed(1))
    return {"input_ids": ids, "labels": ids}
