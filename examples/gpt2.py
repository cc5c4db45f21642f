"""Small GPT-2 language model (Hugging Face transformers), built from a config: no download.

Model-file contract: `build_model()`, `sample_inputs()`, `loss_fn(output)`.
Other depths: `build_model(n_layer=...)`, or the factories `build_gpt2_6l` / `build_gpt2_12l`
(select one with `examples/gpt2.py:build_gpt2_12l`).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from transformers import GPT2Config, GPT2LMHeadModel

BATCH = 4
SEQ = 128
VOCAB = 1024
SEED = 0
INPUT_SEED = 1234


class GPT2LM(GPT2LMHeadModel):
    """GPT2LMHeadModel whose forward takes token ids and returns the logits tensor only.

    Subclassing (rather than wrapping) keeps the module paths `transformer.h.0...`.
    """

    def forward(self, input_ids):  # type: ignore[override]
        return super().forward(input_ids=input_ids).logits


def make_config(n_layer: int = 4) -> GPT2Config:
    return GPT2Config(
        n_layer=n_layer,
        n_embd=128,
        n_head=4,
        n_positions=SEQ,
        vocab_size=VOCAB,
        resid_pdrop=0.1,
        embd_pdrop=0.1,
        attn_pdrop=0.1,
        use_cache=False,
        bos_token_id=0,
        eos_token_id=0,
        pad_token_id=0,
        attn_implementation="eager",
    )


def build_model(n_layer: int = 4) -> torch.nn.Module:
    torch.manual_seed(SEED)
    model = GPT2LM(make_config(n_layer))
    # Without this a logger.warning_once in the loss path breaks fullgraph capture.
    model.loss_type = "ForCausalLM"
    model.train()
    return model


def build_gpt2_6l() -> torch.nn.Module:
    return build_model(n_layer=6)


def build_gpt2_12l() -> torch.nn.Module:
    return build_model(n_layer=12)


def _make_input_ids() -> torch.Tensor:
    gen = torch.Generator().manual_seed(INPUT_SEED)
    return torch.randint(0, VOCAB, (BATCH, SEQ), generator=gen, dtype=torch.long)


# The token ids used both as the model input and (shifted by one) as the loss target.
INPUT_IDS = _make_input_ids()


def sample_inputs() -> tuple:
    return (INPUT_IDS.clone(),)


def loss_fn(output: torch.Tensor) -> torch.Tensor:
    """Next-token cross entropy of `output` (logits, B x S x V) against INPUT_IDS shifted by one."""
    logits = output[:, :-1, :]
    target = INPUT_IDS[:, 1:]
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), target.reshape(-1))
