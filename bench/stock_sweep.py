"""Stock Hugging Face architectures beyond tests/models, each through the user's pipeline.

For each architecture (built from a small config, two layers, used as it comes: keyword
inputs, `labels=` so that the model computes its own loss) this writes a model file into a
temporary directory and runs, through the shell as a user types it,
`remat plan MODEL --budget B --repeats 1 > m.plan && remat check m.plan && remat codegen
m.plan -o fast.py`, then trains the generated module two SGD steps against eager PyTorch
(`compare_training`: every loss, output and gradient bit for bit).  B is the budget given
(default 70% of the autograd peak); where the default solver refuses it, 110% of the
smallest feasible budget its refusal names.  Prints one line per model: the budget, the
solver `auto` chose, whether training was identical, and the seconds taken.  About 25 s
per model on this machine (Gemma-2: 3 minutes in one process, NOTE: [Chains of two
layers]; 100-111 s with its slow block ILPs in two workers, NOTE: [Parallel grid]).

DeBERTa-v2 is planned with a `loss_fn` of the model file, without `labels=`: its own loss
branches on the labels' values and cannot be captured (NOTE: [Capture errors] in
remat_dsl/capture/fx.py).

Writes its section of docs/measurements.md (bench/_common.py), unless `--no-write`.

Usage: python bench/stock_sweep.py [--budget 70%] [--no-write] [NAME ...]   (default: every model below)
"""

from __future__ import annotations

import argparse
import re
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import ROOT, Report, add_write_flag  # noqa: E402

sys.path.insert(0, str(ROOT / "tests"))

from test_stock_models import shell  # noqa: E402  (the user's shell, as the stock-model tests run it)

import remat_dsl  # noqa: E402
from remat_dsl.codegen.compare import compare_training  # noqa: E402  (no API: the tests' bit-for-bit training)

ABOUT = """Stock Hugging Face architectures built from configs of two layers, each through the
user's pipeline in the shell (`remat plan`, `remat check`, `remat codegen`) and trained two
SGD steps beside eager PyTorch (every loss, output and gradient bit for bit).  A budget the
default solver refuses is planned at 110% of the smallest feasible one its refusal names."""

LM = dict(num_hidden_layers=2, hidden_size=128, num_attention_heads=4, vocab_size=512, max_position_embeddings=128)
ENC = dict(num_hidden_layers=2, hidden_size=128, num_attention_heads=4, intermediate_size=256, vocab_size=512)
VIT = dict(num_hidden_layers=2, hidden_size=64, num_attention_heads=4, image_size=32, patch_size=8, num_labels=10)
S2S = dict(
    encoder_layers=2,
    decoder_layers=2,
    d_model=128,
    encoder_attention_heads=4,
    decoder_attention_heads=4,
    encoder_ffn_dim=256,
    decoder_ffn_dim=256,
    vocab_size=512,
    max_position_embeddings=128,
)

# name: (config class, model class, config keywords, inputs)
MODELS = {
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM", dict(LM, intermediate_size=256, num_key_value_heads=2), "lm"),
    "qwen3": (
        "Qwen3Config",
        "Qwen3ForCausalLM",
        dict(LM, intermediate_size=256, num_key_value_heads=2, head_dim=32),
        "lm",
    ),
    "mistral": ("MistralConfig", "MistralForCausalLM", dict(LM, intermediate_size=256, num_key_value_heads=2), "lm"),
    "gemma2": (
        "Gemma2Config",
        "Gemma2ForCausalLM",
        dict(LM, intermediate_size=256, num_key_value_heads=2, head_dim=32),
        "lm",
    ),
    "phi": ("PhiConfig", "PhiForCausalLM", dict(LM, intermediate_size=256), "lm"),
    "phi3": ("Phi3Config", "Phi3ForCausalLM", dict(LM, intermediate_size=256, pad_token_id=0), "lm"),
    "olmo": ("OlmoConfig", "OlmoForCausalLM", dict(LM, intermediate_size=256, pad_token_id=0), "lm"),
    "stablelm": ("StableLmConfig", "StableLmForCausalLM", dict(LM, intermediate_size=256, num_key_value_heads=4), "lm"),
    "starcoder2": (
        "Starcoder2Config",
        "Starcoder2ForCausalLM",
        dict(LM, intermediate_size=256, num_key_value_heads=2),
        "lm",
    ),
    "granite": ("GraniteConfig", "GraniteForCausalLM", dict(LM, intermediate_size=256, num_key_value_heads=2), "lm"),
    "gptj": (
        "GPTJConfig",
        "GPTJForCausalLM",
        dict(n_layer=2, n_embd=128, n_head=4, vocab_size=512, n_positions=128, rotary_dim=16),
        "lm",
    ),
    "gpt_neo": (
        "GPTNeoConfig",
        "GPTNeoForCausalLM",
        dict(
            num_layers=2,
            hidden_size=128,
            num_heads=4,
            vocab_size=512,
            max_position_embeddings=128,
            attention_types=[[["global", "local"], 1]],
            window_size=32,
        ),
        "lm",
    ),
    "gpt_bigcode": (
        "GPTBigCodeConfig",
        "GPTBigCodeForCausalLM",
        dict(n_layer=2, n_embd=128, n_head=4, vocab_size=512, n_positions=128),
        "lm",
    ),
    "codegen": (
        "CodeGenConfig",
        "CodeGenForCausalLM",
        dict(n_layer=2, n_embd=128, n_head=4, vocab_size=512, n_positions=128, rotary_dim=16),
        "lm",
    ),
    "bloom": ("BloomConfig", "BloomForCausalLM", dict(n_layer=2, hidden_size=128, n_head=4, vocab_size=512), "lm"),
    "mpt": (
        "MptConfig",
        "MptForCausalLM",
        dict(n_layers=2, d_model=128, n_heads=4, vocab_size=512, max_seq_len=128),
        "lm",
    ),
    "opt": ("OPTConfig", "OPTForCausalLM", dict(LM, ffn_dim=256, word_embed_proj_dim=128), "lm"),
    "xglm": (
        "XGLMConfig",
        "XGLMForCausalLM",
        dict(num_layers=2, d_model=128, attention_heads=4, ffn_dim=256, vocab_size=512, max_position_embeddings=128),
        "lm",
    ),
    "roberta": ("RobertaConfig", "RobertaForMaskedLM", dict(ENC, max_position_embeddings=130), "mlm"),
    "xlm_roberta": ("XLMRobertaConfig", "XLMRobertaForMaskedLM", dict(ENC, max_position_embeddings=130), "mlm"),
    "modernbert": (
        "ModernBertConfig",
        "ModernBertForMaskedLM",
        dict(
            ENC,
            max_position_embeddings=128,
            pad_token_id=0,
            eos_token_id=1,
            bos_token_id=2,
            cls_token_id=2,
            sep_token_id=1,
        ),
        "mlm",
    ),
    "electra": ("ElectraConfig", "ElectraForPreTraining", dict(ENC, embedding_size=64), "token_labels"),
    "distilbert": (
        "DistilBertConfig",
        "DistilBertForSequenceClassification",
        dict(n_layers=2, dim=128, n_heads=4, hidden_dim=256, vocab_size=512, max_position_embeddings=128),
        "classes",
    ),
    "deberta_v2": (
        "DebertaV2Config",
        "DebertaV2ForSequenceClassification",
        dict(ENC, max_position_embeddings=128),
        "classes_loss_fn",
    ),
    "bart": ("BartConfig", "BartForConditionalGeneration", S2S, "seq2seq"),
    "pegasus": (
        "PegasusConfig",
        "PegasusForConditionalGeneration",
        dict(S2S, decoder_start_token_id=0, pad_token_id=0, eos_token_id=1),
        "seq2seq",
    ),
    "mt5": (
        "MT5Config",
        "MT5ForConditionalGeneration",
        dict(
            num_layers=2,
            num_decoder_layers=2,
            d_model=128,
            d_kv=32,
            d_ff=256,
            num_heads=4,
            vocab_size=512,
            decoder_start_token_id=0,
        ),
        "seq2seq",
    ),
    "whisper": (
        "WhisperConfig",
        "WhisperForConditionalGeneration",
        dict(
            encoder_layers=2,
            decoder_layers=2,
            d_model=64,
            encoder_attention_heads=4,
            decoder_attention_heads=4,
            encoder_ffn_dim=128,
            decoder_ffn_dim=128,
            vocab_size=512,
            num_mel_bins=16,
            max_source_positions=32,
            max_target_positions=64,
            decoder_start_token_id=0,
            pad_token_id=0,
            eos_token_id=1,
            bos_token_id=2,
            suppress_tokens=None,
            begin_suppress_tokens=None,
        ),
        "audio",
    ),
    "swin": (
        "SwinConfig",
        "SwinForImageClassification",
        dict(image_size=64, patch_size=4, embed_dim=32, depths=[1, 1], num_heads=[2, 4], window_size=4, num_labels=10),
        "image64",
    ),
    "mobilevit": (
        "MobileViTConfig",
        "MobileViTForImageClassification",
        dict(image_size=64, hidden_sizes=[32, 48, 64], neck_hidden_sizes=[8, 8, 16, 16, 24, 32, 64], num_labels=10),
        "image64",
    ),
    "regnet": (
        "RegNetConfig",
        "RegNetForImageClassification",
        dict(embedding_size=16, hidden_sizes=[16, 32], depths=[1, 1], groups_width=8, num_labels=10),
        "image64",
    ),
    "dinov2": ("Dinov2Config", "Dinov2ForImageClassification", VIT, "image32"),
    "beit": (
        "BeitConfig",
        "BeitForImageClassification",
        dict(VIT, intermediate_size=128, use_relative_position_bias=True),
        "image32",
    ),
    "deit": ("DeiTConfig", "DeiTForImageClassification", dict(VIT, intermediate_size=128), "image32"),
}

INPUTS = {
    "lm": 'ids = torch.randint(0, 512, (2, 128), generator=g)\n    return {"input_ids": ids, "labels": ids}',
    "mlm": (
        'ids = torch.randint(0, 512, (2, 128), generator=g)\n    return {"input_ids": ids, "attention_mask":'
        ' torch.ones_like(ids), "labels": ids}'
    ),
    "token_labels": (
        'ids = torch.randint(0, 512, (2, 128), generator=g)\n    return {"input_ids": ids, "labels": torch.randint(0,'
        " 2, (2, 128), generator=g)}"
    ),
    "classes": (
        'ids = torch.randint(0, 512, (2, 128), generator=g)\n    return {"input_ids": ids, "attention_mask":'
        ' torch.ones_like(ids), "labels": torch.tensor([0, 1])}'
    ),
    "classes_loss_fn": (
        'ids = torch.randint(0, 512, (2, 128), generator=g)\n    return {"input_ids": ids, "attention_mask":'
        " torch.ones_like(ids)}\n\n\ndef loss_fn(output):\n    return torch.nn.functional.cross_entropy(output.logits,"
        " torch.tensor([0, 1]))"
    ),
    "seq2seq": (
        'ids = torch.randint(3, 512, (2, 64), generator=g)\n    return {"input_ids": ids, "labels": torch.randint(3,'
        " 512, (2, 64), generator=g)}"
    ),
    "audio": (
        'return {"input_features": torch.randn(2, 16, 64, generator=g), "labels": torch.randint(3, 512, (2, 32),'
        " generator=g)}"
    ),
    "image64": 'return {"pixel_values": torch.randn(2, 3, 64, 64, generator=g), "labels": torch.tensor([1, 7])}',
    "image32": 'return {"pixel_values": torch.randn(2, 3, 32, 32, generator=g), "labels": torch.tensor([1, 7])}',
}


def model_file(name: str) -> str:
    config, model, keywords, inputs = MODELS[name]
    return (
        f"import torch\nfrom transformers import {config}, {model}\n\n\ndef build_model():\n    torch.manual_seed(0)\n "
        f"   return {model}({config}(**{keywords!r}))\n\n\ndef sample_inputs():\n    g ="
        f" torch.Generator().manual_seed(1)\n    {INPUTS[inputs]}\n"
    )


def run(name: str, budget: str, where: Path) -> str:
    start = time.perf_counter()
    work = where / name
    work.mkdir()
    path = work / f"hf_{name}.py"
    path.write_text(model_file(name))
    pipeline = (
        "remat plan {model} --budget {budget} --repeats 1 > m.plan && remat check m.plan > report.txt && remat codegen"
        " m.plan -o fast.py"
    )
    result = shell(pipeline.format(model=path, budget=budget), work)
    if result.returncode == 2 and "is infeasible" in result.stderr:
        found = re.search(r"smallest feasible budget is [^(]*\((\d+) B\)", result.stderr)
        if found is None:
            return (
                f"{name:12s} {budget:>10s}  refused, no smallest budget named:"
                f" {result.stderr.strip().splitlines()[-1][:200]}"
            )
        budget = f"{int(found.group(1)) * 11 // 10}B"
        result = shell(pipeline.format(model=path, budget=budget), work)
    if result.returncode:
        return f"{name:12s} {budget:>10s}  FAILED (exit {result.returncode}): {result.stderr.strip()[-600:]}"
    solver = re.search(r'^  solver +"([^"]*)"', (work / "m.plan").read_text(), re.M)
    comparison = compare_training(remat_dsl.model_of(str(path)), remat_dsl.load_module(work / "fast.py"), steps=2)
    verdict = "identical" if comparison.identical else f"DIFFERENT {comparison.mismatched[:3]}"
    chosen = solver.group(1).split()[1] if solver else "?"
    return f"{name:12s} {budget:>10s}  {chosen:10s} {verdict}  {time.perf_counter() - start:5.0f} s"


def main() -> int:
    parser = add_write_flag(argparse.ArgumentParser(description=__doc__.splitlines()[0]))
    parser.add_argument("names", nargs="*", help=f"of: {', '.join(MODELS)}")
    parser.add_argument("--budget", default="70%")
    args = parser.parse_args()
    unknown = [n for n in args.names if n not in MODELS]
    if unknown:
        parser.error(f"unknown model {', '.join(unknown)}; choose from {', '.join(MODELS)}")
    report = Report("bench/stock_sweep.py", "Stock Hugging Face architectures", ABOUT)
    failed, start = 0, time.perf_counter()
    with tempfile.TemporaryDirectory() as where:
        for name in args.names or list(MODELS):
            line = run(name, args.budget, Path(where))
            failed += "identical" not in line.split()
            report.line(line)
    report.line(
        f"{len(args.names or MODELS) - failed} of {len(args.names or MODELS)} identical,"
        f" {time.perf_counter() - start:.0f} s in all"
    )
    report.write(args)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
