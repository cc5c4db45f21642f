"""Stock Hugging Face CanineForSequenceClassification from a config: its classifier reads
the deep encoder's pooled output, and the final character encoder runs, dropout
included, for a sequence output the classifier discards.  Eagerly those dropouts draw
from the generator before the classifier's does (NOTE: [Discarded draws] in
remat_dsl/capture/fx.py), and that encoder's parameters require grad but get none (NOTE:
[Frozen and unused parameters] in remat_dsl/plan/ir.py)."""

import torch
from transformers import CanineConfig, CanineForSequenceClassification


def build_model():
    torch.manual_seed(0)
    config = CanineConfig(
        hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128, num_labels=3
    )
    return CanineForSequenceClassification(config)


def sample_inputs():
    generator = torch.Generator().manual_seed(1)
    ids = torch.randint(3, 500, (2, 64), generator=generator)
    return {"input_ids": ids, "labels": torch.randint(0, 3, (2,), generator=generator)}
