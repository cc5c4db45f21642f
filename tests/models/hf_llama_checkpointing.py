"""Stock Hugging Face LlamaForCausalLM with gradient checkpointing on, as users turn it on
by habit: `model.gradient_checkpointing_enable()` (each decoder layer then runs through
`torch.utils.checkpoint`).  Attention dropout, so that the checkpointed layers draw random
numbers.  `build_non_reentrant` passes `gradient_checkpointing_kwargs={"use_reentrant": False}`,
`build_reentrant` `{"use_reentrant": True}`."""

import warnings

import torch
from transformers import LlamaConfig, LlamaForCausalLM


def _llama(**kwargs):
    torch.manual_seed(0)
    config = LlamaConfig(
        num_hidden_layers=2, hidden_size=64, intermediate_size=128, num_attention_heads=4, num_key_value_heads=2,
        vocab_size=256, max_position_embeddings=64, attention_dropout=0.1,
    )  # fmt: skip
    model = LlamaForCausalLM(config)
    with warnings.catch_warnings():  # transformers 5 names it activation_checkpointing_enable
        warnings.simplefilter("ignore", FutureWarning)
        model.gradient_checkpointing_enable(**kwargs)
    return model.train()


def build_model():
    return _llama()


def build_non_reentrant():
    return _llama(gradient_checkpointing_kwargs={"use_reentrant": False})


def build_reentrant():
    return _llama(gradient_checkpointing_kwargs={"use_reentrant": True})


def sample_inputs():
    ids = torch.randint(0, 256, (2, 32), generator=torch.Generator().manual_seed(1))
    return {"input_ids": ids, "labels": ids}
