"""Stock models as their libraries ship them (issue 10, part 1), and plans that run on any
device of their kind (part 4).

Hugging Face models built from configs, no wrapper: keyword inputs, `labels=` so the
model computes its own loss, `use_cache` at its default, attention masks, tied embeddings,
`ModelOutput` results.  Each goes through the shell as a user types it (`remat plan ... >
m.plan && remat check m.plan && remat codegen m.plan -o fast.py`), at 100% of the autograd
peak and at 110% of the smallest feasible budget `remat plan` reports, then trains two SGD
steps bit for bit against eager and returns the model's own output type, each output bit for
bit at its place.  GPT-2 (the smallest budget), BERT, a Llama with grouped-query attention and
CLIP (100%) run in `make test` (T5's partition and solve: test_large_blocks.py); the rest,
GPT-2 at 100%, T5, ViT, GPT-NeoX and the CNNs (ResNet, ConvNeXt, MobileNetV2) among them, with
`-m slow`.  torchvision's models run with `-m slow` where torchvision imports (its PyPI wheel
needs a CUDA build of torch: on this machine's CPU torch it does not).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from remat_dsl.capture.measure import peak_bytes, step_peak
from remat_dsl.capture.model_file import load_model_file
from remat_dsl.codegen.compare import compare_training, load_generated
from remat_dsl.plan import ir
from remat_dsl.plan.parser import parse

ROOT = Path(__file__).resolve().parent.parent
MODELS = ROOT / "tests" / "models"
# The `remat` of the interpreter running pytest (.venv/bin under `make test`; another
# virtualenv's where torchvision imports), not always /work/main/.venv/bin.
BIN = Path(sys.executable).parent


def shell(script: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}", "HF_HUB_OFFLINE": "1"}
    return subprocess.run(
        ["bash", "-c", "set -eo pipefail\n" + script], cwd=cwd, env=env, capture_output=True, text=True, timeout=900
    )


def smallest_budget(model: Path, cwd: Path, options: str = "") -> int:
    """The smallest feasible budget (bytes) that `remat plan` names when refusing 1%, or
    when 1% is below the proven bound (refused before the solve: NOTE: [Budgets below the
    bound] in remat_dsl/solve/driver.py), when refusing the bound, which is the smallest
    when it has a plan (`options`: more `remat plan` options); refused with exit 2, no
    output, no traceback."""
    result = shell(f"remat plan {model} --budget 1% --repeats 1 {options} > refused.plan", cwd)
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr[-2000:]
    assert (cwd / "refused.plan").read_text() == ""
    bound = re.search(r"no plan can peak below [^(]*\((\d+) B\)", result.stderr)
    if bound:
        result = shell(f"remat plan {model} --budget {bound[1]}B --repeats 1 {options} > refused.plan", cwd)
        if result.returncode == 0:
            return int(bound[1])
        assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr[-2000:]
    found = re.search(r"smallest feasible budget is [^(]*\((\d+) B\)", result.stderr)
    assert found, result.stderr[-2000:]
    return int(found.group(1))


EAGER_WARNING = "warning: eagerly, on the sample inputs, the model computes other bits"


def plan_and_train(model: Path, budget: str, cwd: Path, options: str = "", steps: int = 2):
    """The user's pipeline through the shell (`options`: more `remat plan` options); then
    `steps` SGD steps against eager."""
    result = shell(
        f"remat plan {model} --budget {budget} --repeats 1 {options} > m.plan\nremat check m.plan > report.txt\nremat"
        " codegen m.plan -o fast.py",
        cwd,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert EAGER_WARNING not in result.stderr, result.stderr[-3000:]  # NOTE: [Eager agreement]: no false alarm
    text = (cwd / "m.plan").read_text()
    assert text.startswith("remat-plan 2\n")
    model_file = load_model_file(str(model))
    generated = load_generated(cwd / "fast.py")
    comparison = compare_training(model_file, generated, steps=steps)
    assert comparison.identical, comparison.mismatched[:10]
    torch.manual_seed(0)
    eager_out = model_file.sample_inputs().call(model_file.build_model())
    torch.manual_seed(0)
    fast_out = model_file.sample_inputs().call(generated.FastModel(model_file.build_model()))
    assert type(fast_out) is type(eager_out)
    pairs = [(eager_out, fast_out)]
    if isinstance(eager_out, dict):
        assert list(fast_out.keys()) == [k for k, v in eager_out.items() if k != "past_key_values"]
        pairs = [(eager_out[k], fast_out[k]) for k in fast_out]
    for eager_value, fast_value in pairs:  # every output at its place (NOTE: [Output order] in fx.py), bit for bit
        eager_leaves, eager_spec = torch.utils._pytree.tree_flatten(eager_value)
        fast_leaves, fast_spec = torch.utils._pytree.tree_flatten(fast_value)
        assert repr(fast_spec) == repr(eager_spec)
        for a, b in zip(eager_leaves, fast_leaves, strict=True):
            assert (a is None and b is None) or (a.shape == b.shape and torch.equal(a, b))
    return text, (cwd / "fast.py").read_text()


def run_stock(name: str, tmp_path: Path, budgets=("100%", "min")) -> None:
    """`name`: a file of tests/models without `.py`, or `FILE.py:FUNCTION`."""
    model = MODELS / name if ":" in name else MODELS / f"{name}.py"
    for budget in budgets:
        if budget == "min":
            budget = f"{smallest_budget(model, tmp_path) * 11 // 10}B"
        text, _ = plan_and_train(model, budget, tmp_path)
        if "use_cache" in text:  # NOTE: [Stock models]: filled in, and said so, where the inputs leave it out
            assert re.search(r"^  use_cache = False$", text, re.M)
            given = "use_cache" in load_model_file(str(model)).sample_inputs().kwargs
            assert ("# left out by sample_inputs()" in text) is not given


@pytest.mark.parametrize("name, budgets", [
        ("hf_gpt2", ("min",)), ("hf_bert", ("100%",)), ("hf_llama_gqa", ("100%",)), ("hf_clip", ("100%",)),
    ])  # fmt: skip
def test_stock_hugging_face_models(name, budgets, tmp_path):
    run_stock(name, tmp_path, budgets)


def test_arguments_in_containers_are_inputs_of_their_own(tmp_path):
    """NOTE: [Nested arguments] in remat_dsl/capture/fx.py: a dict batch holding a list of
    tensors and a flag plans, names each element, and trains bit for bit."""
    text, _ = plan_and_train(MODELS / "dict_batch.py", "100%", tmp_path)
    inputs = text.split("\ninputs\n", 1)[1].split("\n\n", 1)[0]
    names = [line.split()[0] for line in inputs.splitlines() if line.strip() and not line.lstrip().startswith("#")]
    assert sorted(names) == ["batch.features.0", "batch.features.1", "batch.input_ids", "batch.mask", "batch.pool"]
    assert re.search(r"^  batch.pool = True$", inputs, re.M), inputs


@pytest.mark.parametrize("budget", ["100%", "min"])
def test_outputs_that_alias_repeat_or_go_undifferentiated(budget, tmp_path):
    """NOTE: [Aliased outputs] and [Output order] in remat_dsl/capture/fx.py, [Absent output
    gradients] in remat_dsl/codegen/runtime.py: views of other outputs and of the input come back as copies
    with eager's values and gradients, a tensor at two places as one tensor, and a parameter
    that only an undifferentiated output depends on keeps `.grad` None."""
    model = MODELS / "aliased_outputs.py"
    if budget == "min":
        budget = f"{smallest_budget(model, tmp_path) * 11 // 10}B"
    text, _ = plan_and_train(model, budget, tmp_path)
    outputs = text.split("\noutputs\n", 1)[1].split("\n\n", 1)[0]
    h = re.search(r"dict\(h=(%[\w.:]+), h_t=%clone,", outputs)
    assert h and re.search(rf"pair=\(%[\w.:]+, {h[1]}\)", outputs), outputs
    model_file = load_model_file(str(model))
    fast = load_generated(tmp_path / "fast.py").FastModel(model_file.build_model())
    out = model_file.sample_inputs().call(fast)
    assert out["pair"][1] is out["h"] and out["h_t"]._base is None and out["x_t"]._base is None
    model_file.loss_fn(out).backward()
    assert fast.model.side.weight.grad is None and fast.model.fc.weight.grad is not None


def test_an_absent_logits_gradient_is_not_held(tmp_path):
    """NOTE: [Gradient zeros] in remat_dsl/capture/fbgraph.py: `loss.backward()` on a causal
    LM gives no gradient for its logits.  The module held autograd's zeros for them through
    its backward (256 KiB here), which neither eager nor the plan's memory counts; it now
    makes none (the sum with the loss's gradient is that gradient).  Measured, the step
    peaks at the prediction plus the loss's own gradient, the 4-byte scalar autograd's
    engine makes (the caller's, like the logits' when given)."""
    model = MODELS / "hf_llama_gqa.py"
    text, _ = plan_and_train(model, "100%", tmp_path)
    plan = parse(text)
    assert ir.gradient_zeros(plan.graph) == {"bwd.nll_loss_backward": 4, "bwd.add": 2 * 128 * 256 * 4}
    model_file = load_model_file(str(model))
    fast = load_generated(tmp_path / "fast.py").FastModel(model_file.build_model())
    inputs = model_file.sample_inputs()

    def step():
        model_file.loss_fn(inputs.call(fast)).backward()

    with torch.random.fork_rng():
        step()
        fast.zero_grad(set_to_none=True)
        measured = peak_bytes(step)
    assert measured == plan.header.peak_bytes + 4
    fast.zero_grad(set_to_none=True)
    assert step_peak(fast, inputs) == plan.header.peak_bytes  # every output's gradient given


@pytest.mark.parametrize("budget", ["100%", "min"])
def test_a_discarded_branch_draws_its_dropout_as_eagerly(budget, tmp_path):
    """NOTE: [Discarded draws] in remat_dsl/capture/fx.py: tracing dropped the dropout of a
    branch whose output the head discards, so the head's dropout drew other numbers than
    eagerly and the plan trained on another loss (stock CANINE, 0.03 off); the plan now
    runs that dropout where eager does and deletes its result at once."""
    model = MODELS / "discarded_branch.py"
    if budget == "min":
        budget = f"{smallest_budget(model, tmp_path) * 11 // 10}B"
    text, _ = plan_and_train(model, budget, tmp_path)
    forward = text.split("\nforward\n", 1)[1].split("\n\n", 1)[0].split()
    draws = [
        forward[k + 1] for k in range(0, len(forward), 2) if forward[k] == "compute" and "dropout" in forward[k + 1]
    ]
    assert len(draws) == 2, forward
    assert forward.index("branch") < forward.index(draws[0]) < forward.index("pooler") < forward.index(draws[1])


def test_a_layer_module_run_for_every_layer_reaches_a_low_budget(tmp_path):
    """ALBERT runs one layer module for all its layers: each run's backward must stay with
    that run's block (NOTE: [Modules run several times] in remat_dsl/solve/solvers/chain/partition.py),
    or every run's backward went to the last run's block and the smallest feasible budget
    was 70-75% of the autograd peak.  It is now under 55%, and the plan at 110% of it trains
    bit for bit."""
    model = MODELS / "hf_albert.py"
    result = shell(f"remat plan {model} --budget 1% --repeats 1 > refused.plan", tmp_path)
    one_percent = int(re.search(r"budget [^(]*\((\d+) B\) is infeasible", result.stderr).group(1))
    smallest = smallest_budget(model, tmp_path)
    assert smallest < 0.55 * one_percent * 100, (smallest, one_percent)
    plan_and_train(model, f"{smallest * 11 // 10}B", tmp_path)


def test_a_stock_decoder_of_two_layers_plans_as_a_chain(tmp_path):
    """NOTE: [Chains of two layers] in remat_dsl/solve/solvers/chain/partition.py: OLMo built with
    two layers has an attention block of a third of its forward ops, so `auto` gave it
    HiRemate's H-ILP root, whose smallest budget was 61-64% of the autograd peak, and 55%
    was refused.  As Rockmate's chain its smallest is under 50% (48.5% when this was
    written), and the plan at 55% trains bit for bit."""
    text, _ = plan_and_train(MODELS / "hf_olmo.py", "55%", tmp_path)
    assert re.search(r'^  solver +"auto: rockmate ', text, re.M), text[:800]


@pytest.mark.slow
@pytest.mark.parametrize("name, budgets", [
        ("hf_gpt2", ("100%",)), ("hf_bert", ("min",)), ("hf_t5", ("100%", "min")), ("hf_vit", ("100%", "min")),
        ("hf_resnet", ("100%", "min")),
        ("hf_convnext", ("100%", "min")), ("hf_mobilenet", ("100%", "min")), ("hf_gpt_neox", ("100%", "min")),
        ("hf_resnet_deep", ("min",)), ("hf_clip", ("min",)), ("hf_bert_hidden_states", ("100%", "min")),
        ("hf_wav2vec2", ("100%", "min")), ("hf_canine", ("100%", "min")), ("hf_mamba", ("100%", "min")),
        ("hf_videomae", ("100%", "min")), ("hf_bamba", ("100%", "min")), ("hf_mixtral_batched_mm", ("100%", "min")),
    ])
def test_stock_hugging_face_models_slow(name, budgets, tmp_path):
    run_stock(name, tmp_path, budgets)


TORCHVISION = ["resnet50", "densenet121", "mobilenet_v3_small", "efficientnet_b0", "convnext_tiny", "regnet_y_400mf",
               "googlenet", "vit_b_16", "swin_t", "efficientnet_v2_s"]  # fmt: skip


@pytest.mark.slow
@pytest.mark.parametrize("name", TORCHVISION)
def test_stock_torchvision_models(name, tmp_path):
    pytest.importorskip("torchvision", reason="torchvision does not import beside this torch")
    run_stock(f"torchvision_models.py:build_{name}", tmp_path)


@pytest.fixture(scope="module")
def dict_model(tmp_path_factory):
    cwd = tmp_path_factory.mktemp("dict")
    text, source = plan_and_train(MODELS / "dict_outputs.py", "90%", cwd)
    return text, source, load_generated(cwd / "fast.py")


def test_pytree_outputs_keyword_inputs_and_constants(dict_model):
    text, source, generated = dict_model
    assert re.search(r"^  scale = 0\.5$", text, re.M)  # the non-tensor argument, as captured
    assert re.search(r"^  target +float32\[4, 10, 16\]$", text, re.M)  # passed as x too: its own input
    outputs = text.split("\noutputs\n", 1)[1].split("\n\n", 1)[0]
    assert outputs.lstrip().startswith("dict(loss=%") and "nothing=None" in outputs and "pair=(" in outputs
    model_file = load_model_file(str(MODELS / "dict_outputs.py"))
    x = model_file.sample_inputs().args[0]
    fast = generated.FastModel(model_file.build_model())
    out = fast(x, target=x.clone(), scale=0.5)
    assert set(out) == {"loss", "y", "nothing", "pair"} and out["nothing"] is None
    assert out["y"].shape == (4, 10, 16) and out["pair"][1].shape == (4, 16, 10)
    with pytest.raises(ValueError, match=r"the plan was made with scale=0\.5, not 2\.0"):
        fast(x, x, scale=2.0)
    with pytest.raises(TypeError, match="the plan was made without the argument 'mask'"):
        fast(x, x, mask=x)
    fast(x, x)  # the constant left out: the plan's value


def test_the_module_runs_on_the_models_device_of_the_plans_kind(dict_model):
    text, source, generated = dict_model
    assert re.search(r"^  device +cpu$", text, re.M)
    assert 'DEVICE_KIND = "cpu"' in source
    assert not re.search(r"cuda:\d|torch\.device\(\"cpu\"\)", source)  # no device index, no fixed device
    model_file = load_model_file(str(MODELS / "dict_outputs.py"))
    model = model_file.build_model().to("meta")
    x = torch.empty(4, 10, 16, device="meta")
    with pytest.raises(ValueError, match="the model is on meta but the plan was made for cpu"):
        generated.FastModel(model)(x, x)


def test_module_names_a_plan_name_cannot_hold(tmp_path):
    """`block1-0`, `conv 1`, `out+head` (torchvision's RegNet names its blocks so) read
    `block1_0` ... in the plan; the generated module finds the model's own tensors."""
    text, source = plan_and_train(MODELS / "odd_names.py", "100%", tmp_path)
    assert re.search(r"^  blocks\.block1_0\.weight +float32\[16, 8\]$", text, re.M)
    assert re.search(r"^  compute +blocks\.conv_1$", text, re.M) and re.search(
        r"^  scale_factor +float32\[16\]$", text, re.M
    )


def test_two_names_that_would_read_alike_are_refused(tmp_path):
    model = tmp_path / "clash.py"
    model.write_text(
        "import torch\nfrom torch import nn\n\nclass Clash(nn.Module):\n    def __init__(self):\n       "
        " super().__init__()\n        self.m = nn.ModuleDict({'a-b': nn.Linear(2, 2), 'a_b': nn.Linear(2, 2)})\n\n   "
        " def forward(self, x):\n        return self.m['a_b'](self.m['a-b'](x)).sum()\n\ndef build_model():\n    return"
        " Clash()\n\ndef sample_inputs():\n    return (torch.ones(1, 2),)\n\ndef loss_fn(output):\n    return output\n"
    )
    result = shell(f"remat plan {model} --budget 100% > m.plan", tmp_path)
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr[-2000:]
    assert "parameters 'm.a-b.weight' and 'm.a_b.weight' would both be named 'm.a_b.weight'" in result.stderr
    assert (tmp_path / "m.plan").read_text() == ""


@pytest.mark.parametrize(
    "solver",
    ["rotor", pytest.param("rockmate", marks=pytest.mark.slow), pytest.param("twremat", marks=pytest.mark.slow)],
)
def test_constants_upsampling_and_a_drop_path_train_bit_for_bit(solver, tmp_path):
    """A constant index tensor (`x[..., [-2], :]`, as Falcon splits its fused projection), an
    integer range and a 0-dim constant become calls of the plan (NOTE: [Constant tensors]);
    bilinear upsampling keeps its eager backward kernel (NOTE: [Native kernels]: the
    decomposition traced by default gave other gradient bits); a drop path drawn by
    `rand(shape)` after a dropout stays after it (NOTE: [Random ops in the prelude]: every
    chain solver's plan at a low budget was refused).  At 110% of the smallest budget,
    through the shell."""
    model = MODELS / "constants_upsample.py"
    smallest = smallest_budget(model, tmp_path, f"--solver {solver}")
    text, _ = plan_and_train(model, f"{smallest * 11 // 10}B", tmp_path, f"--solver {solver}")
    assert re.search(r"= aten\.full\.default\(\s*\[1\],\s*-2,", text) and re.search(
        r"= aten\.arange\.start_step\(\s*0,\s*4,\s*1,", text
    )
    assert "= aten.upsample_bilinear2d_backward.default(" in text and "_unsafe_index" not in text


@pytest.mark.parametrize(
    "value, call",
    [
        (torch.tensor(0.5), "aten.scalar_tensor.default (0.5,)"),
        (torch.tensor([-2]), "aten.full.default ([1], -2)"),
        (torch.zeros(2, 3, dtype=torch.bool), "aten.full.default ([2, 3], False)"),
        (torch.tensor([5, 3, 1]), "aten.arange.start_step (5, -1, -2)"),
        (torch.tensor([1, 2, 4]), None),  # no one call makes it
        (torch.tensor([0.0, -0.0]), None),  # equal, but not the same bits
        (torch.tensor([1.0, 2.0]), None),  # a float range: arange's floats may round otherwise
        (torch.ones(2, 4)[:, :2], None),  # not contiguous
    ],
)
def test_a_constant_is_made_by_a_call_only_when_that_call_gives_its_bits(value, call):
    from remat_dsl.capture.fx import _constant_call

    made = _constant_call(value)
    assert (None if made is None else f"{made[0]} {made[1]}") == call
    if made is not None:
        again = made[0](*made[1], **made[2])
        assert again.dtype == value.dtype and again.shape == value.shape and again.stride() == value.stride()
        assert torch.equal(again.view(-1).view(torch.uint8), value.reshape(-1).view(torch.uint8))


def test_remat_plan_refuses_a_custom_operator_naming_its_op(tmp_path):
    """Mixtral's experts call `transformers.grouped_mm_fallback`: `remat plan` wrote it into a
    plan that `remat check` refused (`unknown operator`); `remat plan` now refuses it
    (NOTE: [Custom operators] in remat_dsl/check/verify.py), naming the op: exit 2, no
    output, no traceback."""
    result = shell(f"remat plan {MODELS / 'hf_mixtral.py'} --budget 100% > m.plan", tmp_path)
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr[-2000:]
    assert (tmp_path / "m.plan").read_text() == ""
    expected = (
        r"error: op 'model\.layers\.0\.mlp\.experts\.grouped_mm_fallback' calls"
        r" `transformers\.grouped_mm_fallback\.default`"
    )
    assert re.search(expected + ", which is not an aten operator", result.stderr), result.stderr[-2000:]
    assert 'experts_implementation="batched_mm"' in result.stderr  # the option that plans it: hf_mixtral_batched_mm.py


@pytest.mark.slow
@pytest.mark.parametrize("name", ["hf_falcon", "hf_segformer"])
@pytest.mark.parametrize("solver", ["auto", "twremat"])
def test_stock_models_with_constants_upsampling_and_drop_paths(name, solver, tmp_path):
    """Falcon (a constant index tensor) was refused; SegFormer did not capture (transformers'
    output hooks), then trained with other gradient bits (bilinear upsampling), then had
    every chain solver's plan refused at low budgets (its drop path)."""
    model = MODELS / f"{name}.py"
    smallest = smallest_budget(model, tmp_path, f"--solver {solver}")
    for budget in ("100%", str(smallest * 11 // 10)):
        plan_and_train(model, budget, tmp_path, f"--solver {solver}")


def test_a_step_traced_other_than_eager_is_said(tmp_path):
    """NOTE: [Eager agreement] in remat_dsl/capture/agreement.py: tests/models/traced_branch.py
    adds its mask of ones to the attention scores only while traced, as stock BigBird does;
    under its bfloat16 autocast the traced step rounds elsewhere.  `remat plan` says so on
    stderr and above the plan's header, again from the cache, and the module it generates
    indeed trains otherwise than eager; in float32 (adding zeros) the two agree and nothing
    is said."""
    model = MODELS / "traced_branch.py"
    result = shell(
        f"remat plan {model} --budget 100% --repeats 1 > m.plan\nremat check m.plan > report.txt\nremat codegen m.plan"
        " -o fast.py",
        tmp_path,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert EAGER_WARNING in result.stderr
    text = (tmp_path / "m.plan").read_text()
    assert text.startswith("# warning: eagerly, on the sample inputs")
    header = text.split("remat-plan 2\n")[0]
    assert "7 of 7 parameter gradients (embed.weight, attention.qkv.weight, attention.qkv.bias and 4 more)" in " ".join(
        line.removeprefix("# ") for line in header.splitlines()
    )
    assert "as torch.compile(model) does: a library takes another path while traced than eagerly" in " ".join(
        line.removeprefix("# ") for line in header.splitlines()
    )
    comparison = compare_training(load_model_file(str(model)), load_generated(tmp_path / "fast.py"), steps=1)
    assert not comparison.identical  # the warning is true: the module computes the traced step
    again = shell(f"remat plan {model} --budget 100% --repeats 1 > again.plan", tmp_path)
    assert "op costs from the cache" in again.stderr and EAGER_WARNING in again.stderr
    assert (tmp_path / "again.plan").read_text() == text
    single = shell(f"remat plan {model} --budget 100% --repeats 1 --autocast none > single.plan", tmp_path)
    assert single.returncode == 0, single.stderr[-3000:]  # float32: they agree, and nothing is said
    assert EAGER_WARNING not in single.stderr and (tmp_path / "single.plan").read_text().startswith("remat-plan 2\n")


def test_a_weight_autocast_casts_once_eagerly_is_named_in_the_warning(tmp_path):
    """NOTE: [Eager agreement]: tests/models/shared_weight.py applies one Linear twice under
    bfloat16 autocast, as ALBERT shares its layers.  Eagerly autocast casts the weight once
    and sums the gradients of both uses in bfloat16; the captured step casts it at each use.
    The warning names that cause, the gradients that differ are the shared layer's, and
    the module indeed trains otherwise than eager."""
    model = MODELS / "shared_weight.py"
    result = shell(f"remat plan {model} --budget 100% --repeats 1 > m.plan\nremat codegen m.plan -o fast.py", tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    warning = " ".join(line for line in result.stderr.splitlines() if line.startswith("warning: eagerly"))
    assert "2 of 6 parameter gradients (layer.weight, layer.bias) differ" in warning, result.stderr[-3000:]
    assert "each of those parameters cast to the autocast dtype at more than one op of the captured step" in warning
    comparison = compare_training(load_model_file(str(model)), load_generated(tmp_path / "fast.py"), steps=1)
    assert not comparison.identical


def test_a_failure_of_remat_dsl_inside_the_capture_backend_is_called_a_bug(monkeypatch):
    """An exception raised by our own code inside torch.compile's backend (here a broken
    `_memory_order`, which the capture of tests/models/transposed_dropout.py reaches under
    bfloat16 autocast) is said as a remat-dsl bug with its type, text and line, not as a
    model that cannot be captured with an empty reason."""
    from remat_dsl.capture import fx
    from remat_dsl.plan.errors import RematError

    model_file = load_model_file(str(MODELS / "transposed_dropout.py"))
    monkeypatch.setattr(fx, "_memory_order", lambda value: fx.tensor_attributes(None))
    with pytest.raises(RematError) as raised:
        fx.capture(model_file.build_model(), model_file.sample_inputs(), autocast=torch.bfloat16)
    assert str(raised.value).startswith("error: remat-dsl failed while capturing the model: AttributeError: ")
    assert "remat_dsl/capture/fx.py:" in str(raised.value) and "a bug in remat-dsl" in raised.value.hint
