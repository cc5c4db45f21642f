"""Stock Hugging Face T5ForConditionalGeneration (2 encoder + 2 decoder layers) from a
config: an encoder-decoder whose decoder inputs come from `labels`, a `Seq2SeqLMOutput`."""

import torch
from transformers import T5Config, T5ForConditionalGeneration


def build_model():
    torch.manual_seed(0)
    config = T5Config(
        num_layers=2, num_decoder_layers=2, d_model=64, d_ff=128, num_heads=4, d_kv=16, vocab_size=512,
        decoder_start_token_id=0, pad_token_id=0,
    )  # fmt: skip
    return T5ForConditionalGeneration(config)


def sample_inputs():
    generator = torch.Generator().manual_seed(1)
    return {
        "input_ids": torch.randint(0, 512, (2, 32), generator=generator),
        "labels": torch.randint(0, 512, (2, 16), generator=generator),
    }
