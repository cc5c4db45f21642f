"""Stock Hugging Face MixtralForCausalLM (mixture of experts) from a small config with
`experts_implementation="batched_mm"`: its experts gather each token's expert weights and
run torch operations (`bmm`), not the custom operator of the default implementation
(`tests/models/hf_mixtral.py`, refused).  The backward of the gather is `index_put` with
`accumulate`, which the CPU sums in a run-to-run order unless
`torch.use_deterministic_algorithms(True)`: the comparison with eager trains both under it
(`compare_training`)."""

import torch
from transformers import MixtralConfig, MixtralForCausalLM


def build_model():
    torch.manual_seed(0)
    config = MixtralConfig(
        num_hidden_layers=2, hidden_size=64, intermediate_size=128, num_attention_heads=4, num_key_value_heads=2,
        vocab_size=256, max_position_embeddings=64, num_local_experts=4, num_experts_per_tok=2,
        experts_implementation="batched_mm",
    )  # fmt: skip
    return MixtralForCausalLM(config)


def sample_inputs():
    ids = torch.randint(0, 256, (2, 32), generator=torch.Generator().manual_seed(1))
    return {"input_ids": ids, "labels": ids}
