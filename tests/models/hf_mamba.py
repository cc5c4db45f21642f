"""Stock Hugging Face MambaForCausalLM from a config, without its CUDA kernels (not
installed here): traced, transformers scans the sequence with `associative_scan`, eagerly
with a loop over its positions, which capture traces instead (NOTE: [Eager branches] in
remat_dsl/capture/fx.py) so that the plan trains bit for bit."""

import torch
from transformers import MambaConfig, MambaForCausalLM


def build_model():
    torch.manual_seed(0)
    return MambaForCausalLM(MambaConfig(vocab_size=512, hidden_size=64, num_hidden_layers=2, state_size=8))


def sample_inputs():
    ids = torch.randint(3, 500, (2, 64), generator=torch.Generator().manual_seed(1))
    return {"input_ids": ids, "labels": ids}
