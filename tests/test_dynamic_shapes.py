"""One plan for every batch size up to its sample inputs' (`remat plan --dynamic batch`):
NOTE: [Sizes that vary] and NOTE: [Size expressions] in remat_dsl/plan/ir.py, NOTE: [Size
probe] in remat_dsl/capture/shapes.py.  Through the shell, as users type it; trained against eager
bit for bit at each batch size, the measured peak at most the plan's."""

from __future__ import annotations

import dataclasses
import re

import pytest
import torch

from remat_dsl.capture.measure import step_peak
from remat_dsl.capture.model_file import load_model_file
from remat_dsl.codegen.compare import compare_training, load_generated
from remat_dsl.plan.parser import parse
from test_stock_models import MODELS, shell, smallest_budget

MLP = MODELS / "dynamic_mlp.py"
PINNED = MODELS / "batch_pinned.py"


def _at_batch(model_file, batch: int):
    """`model_file` whose sample inputs are its own cut to their first `batch` rows."""
    return dataclasses.replace(model_file, inputs=lambda: tuple(x[:batch].clone() for x in model_file.inputs()))


@pytest.mark.parametrize("budget", ["100%", "min"])
def test_one_plan_trains_every_batch_up_to_its_own(budget, tmp_path):
    if budget == "min":
        budget = f"{smallest_budget(MLP, tmp_path, '--dynamic batch') * 11 // 10}B"
    result = shell(
        f"remat plan {MLP} --budget {budget} --repeats 1 --dynamic batch > m.plan\nremat check m.plan > report.txt\n"
        "remat check m.plan --model > model.txt\nremat codegen m.plan -o fast.py",
        tmp_path,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    text = (tmp_path / "m.plan").read_text()
    assert re.search(r"^inputs\n  x  float32\[B <= 8, 64\]\n", text, re.M), text
    assert re.search(r"^tangents\n  grad_output\.0  float32\[B, 10\]\n", text, re.M), text
    plan = parse(text)
    if budget != "100%":  # the small budget recomputes dropout: at a smaller batch it must draw eager's bits
        assert any(i.verb == "recompute" and i.target.startswith("drop.") for i in plan.backward), text
    assert plan.graph.inputs[0].dims == ("B", None) and plan.graph.inputs[0].shape == (8, 64)
    model_file = load_model_file(str(MLP))
    generated = load_generated(tmp_path / "fast.py")
    for batch in (8, 5, 1):
        at = _at_batch(model_file, batch)
        assert at.sample_inputs().args[0].shape == (batch, 64)
        comparison = compare_training(at, generated, steps=3)
        assert comparison.identical, (batch, comparison.mismatched[:10])
        peak = step_peak(generated.FastModel(at.build_model()), at.sample_inputs())
        assert 0 < peak <= plan.header.peak_bytes, (batch, peak, plan.header.peak_bytes)
    fast = generated.FastModel(model_file.build_model())
    with pytest.raises(
        ValueError, match=r"float32\[9, 64\].*B <= 8.*B = 9 is above the largest the plan allows, B = 8"
    ):
        fast(torch.randn(9, 64))
    with pytest.raises(ValueError, match=r"float32\[5, 63\] but the plan was made for float32\[B <= 8, 64\]"):
        fast(torch.randn(5, 63))


def test_a_plan_without_dynamic_takes_its_shape_alone(tmp_path):
    result = shell(f"remat plan {MLP} --budget 100% --repeats 1 > m.plan\nremat codegen m.plan -o fast.py", tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    text = (tmp_path / "m.plan").read_text()
    assert "  x  float32[8, 64]\n" in text and "B" not in text.partition("\ninputs\n")[2].partition("\ntensors\n")[0]
    generated = load_generated(tmp_path / "fast.py")
    with pytest.raises(ValueError, match=r"input 'x' is float32\[5, 64\] but the plan was made for float32\[8, 64\]"):
        generated.FastModel(load_model_file(str(MLP)).build_model())(torch.randn(5, 64))


def test_the_op_that_pins_the_batch_is_named(tmp_path):
    result = shell(f"remat plan {PINNED} --budget 100% --repeats 1 --dynamic batch > m.plan", tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    reason = (
        r"the batch size cannot vary: aten\.mul\.Tensor \(\S*batch_pinned\.py:16\) takes %, 0\.125 at B=8"
        r" and %, 0\.14285714285714285 at B=7"
    )
    assert re.search(f"warning: {reason}; the plan is for its sample sizes alone", result.stderr), result.stderr
    text = (tmp_path / "m.plan").read_text()
    assert re.search(f"^inputs\n  # {reason}\n  x  float32\\[8, 64\\]\n", text, re.M), text
    check = shell("remat check m.plan > report.txt", tmp_path)
    assert check.returncode == 0, check.stderr[-3000:]


def test_dynamic_batch_needs_a_batch_to_cut(tmp_path):
    model = tmp_path / "one.py"
    model.write_text(MLP.read_text().replace("torch.randn(8, 64,", "torch.randn(1, 64,"))
    result = shell(f"remat plan {model} --budget 100% --repeats 1 --dynamic batch > m.plan", tmp_path)
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr[-3000:]
    assert "error: --dynamic needs a sample batch of 2 or more" in result.stderr
    assert "hint: give sample_inputs() the largest batch" in result.stderr
    assert (tmp_path / "m.plan").read_text() == ""


@pytest.fixture(scope="module")
def dynamic_plan(tmp_path_factory) -> str:
    cwd = tmp_path_factory.mktemp("dynamic")
    result = shell(f"remat plan {MLP} --budget 100% --repeats 1 --dynamic batch > m.plan", cwd)
    assert result.returncode == 0, result.stderr[-3000:]
    return (cwd / "m.plan").read_text()


def test_sizes_round_trip_through_fmt(dynamic_plan, tmp_path):
    (tmp_path / "m.plan").write_text(dynamic_plan)
    result = shell("remat fmt m.plan\nremat check m.plan > report.txt", tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "all were canonical already" in result.stderr
    assert (tmp_path / "m.plan").read_text() == dynamic_plan


@pytest.mark.parametrize(
    "old, new, message, hint",
    [
        (
            "grad_output.0  float32[B, 10]",
            "grad_output.0  float32[S, 10]",
            "size symbol 'S' is not declared by the inputs",
            "the inputs declare B",
        ),
        (
            "grad_output.0  float32[B, 10]",
            "grad_output.0  float32[B <= 9, 10]",
            "size symbol 'B' bounded by 9 here and by 8 in the inputs",
            "write `B` alone",
        ),
        ("x  float32[B <= 8, 64]", "x  float32[B, 64]", "size symbol 'B' has no bound", "`B <= N`"),
        (
            "float32[512, 64]",  # fc1.weight
            "float32[B, 64]",
            "size symbol 'B' in the parameters",
            "parameters and buffers have fixed shapes",
        ),
        ("x  float32[B <= 8, 64]", "x  float32[B <= 7, 64]", "", "digest"),  # the digest covers the bound
    ],
)
def test_hostile_sizes_are_refused_with_where_and_how(dynamic_plan, tmp_path, old, new, message, hint):
    assert old in dynamic_plan
    (tmp_path / "m.plan").write_text(dynamic_plan.replace(old, new, 1))
    result = shell("remat check m.plan > report.txt", tmp_path)
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr[-3000:]
    line = dynamic_plan.partition(old)[0].count("\n") + 1
    if message:
        assert re.search(rf"m\.plan:{line}:\d+: error: {re.escape(message)}", result.stderr), result.stderr
    assert hint in result.stderr, result.stderr


TWO_OUTPUTS = """
import torch
from torch import nn


class Two(nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Linear(16, 8), nn.Linear(16, 4)

    def forward(self, x):
        return torch.relu(self.a(x)), self.b(x) * 2


def build_model():
    torch.manual_seed(0)
    return Two()


def sample_inputs():
    return (torch.randn(6, 16, generator=torch.Generator().manual_seed(1)),)


def loss_fn(output):
    return output[0].square().mean()
"""


def test_two_outputs_one_unused_by_the_loss_follow_the_batch(tmp_path):
    model = tmp_path / "two.py"
    model.write_text(TWO_OUTPUTS)
    result = shell(
        f"remat plan {model} --budget 100% --repeats 1 --dynamic batch > m.plan\nremat codegen m.plan -o f.py", tmp_path
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "grad_output.1  float32[B, 4]\n" in (tmp_path / "m.plan").read_text()
    model_file, generated = load_model_file(str(model)), load_generated(tmp_path / "f.py")
    for batch in (6, 3, 1):
        comparison = compare_training(_at_batch(model_file, batch), generated, steps=2)
        assert comparison.identical, (batch, comparison.mismatched[:10])


GPT2 = MODELS / "hf_gpt2_dynamic.py"
SEQ_FIRST = MODELS / "seq_first_dynamic.py"
SEQ_PINNED = MODELS / "seq_pinned.py"


def _at_sizes(model_file, sizes: dict[int, int]):
    """`model_file` whose sample inputs are its own cut to `sizes` ({dim: size})."""

    def cut(value):
        if not isinstance(value, torch.Tensor):
            return value
        for dim, size in sizes.items():
            value = value.narrow(dim, 0, size) if value.dim() > dim else value
        return value.clone()

    def inputs():
        return torch.utils._pytree.tree_map(cut, model_file.inputs())  # inside tuples, lists and dicts too

    return dataclasses.replace(model_file, inputs=inputs)


def _trains_exactly_within_the_peak(model_file, generated, plan, sizes: dict[int, int]) -> None:
    at = _at_sizes(model_file, sizes)
    comparison = compare_training(at, generated, steps=2)
    assert comparison.identical, (sizes, comparison.mismatched[:10])
    peak = step_peak(generated.FastModel(at.build_model()), at.sample_inputs())
    assert 0 < peak <= plan.header.peak_bytes, (sizes, peak, plan.header.peak_bytes)


def test_tensors_inside_a_dict_argument_follow_the_sizes(tmp_path):
    """NOTE: [Nested arguments] in remat_dsl/capture/fx.py: a collated dict batch holding a
    list of tensors varies in B and S like plain arguments."""
    model = MODELS / "dict_batch.py"
    result = shell(f"remat plan {model} --budget 100% --repeats 1 --dynamic batch,seq > m.plan\n"
                   "remat codegen m.plan -o fast.py", tmp_path)  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    plan = parse((tmp_path / "m.plan").read_text())
    shapes = {d.name: d.dims for d in plan.graph.inputs}
    assert shapes["batch.features.1"] == ("B", "S", None) and shapes["batch.mask"] == ("B", "S"), shapes
    generated = load_generated(tmp_path / "fast.py")
    for b, s in ((5, 11), (2, 6)):
        _trains_exactly_within_the_peak(load_model_file(str(model)), generated, plan, {0: b, 1: s})


@pytest.mark.parametrize(
    "sample, shapes",
    [((4, 64), [(4, 64), (3, 64), (4, 40), (1, 17)]), ((8, 512), [(8, 512), (5, 512), (8, 300), (1, 17)])],
    ids=["4x64", "8x512"],
)
def test_a_causal_lm_trains_every_batch_and_sequence_up_to_its_own(sample, shapes, tmp_path):
    model = GPT2
    if sample != (8, 512):
        model = tmp_path / "gpt2.py"
        model.write_text(GPT2.read_text().replace("(8, 512)", str(sample)))
    full = sample == (8, 512)
    against_model = "remat check m.plan --model > model.txt\n" if full else ""  # 4x64: ~20 s more
    solver = "" if full else "--solver twremat"  # no ILP: 4x64 spends 40 s solving with auto
    result = shell(
        f"remat plan {model} --budget 60% {solver} --repeats 1 --dynamic batch,seq > m.plan\n"
        "remat check m.plan > report.txt\n"
        f"{against_model}remat codegen m.plan -o fast.py\ncp m.plan f.plan\nremat fmt f.plan",
        tmp_path,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    text = (tmp_path / "m.plan").read_text()
    assert (tmp_path / "f.plan").read_text() == text  # one canonical form of the size expressions
    batch, seq = sample
    assert f"  input_ids  int64[B <= {batch}, S <= {seq}]\n" in text, text[:3000]
    assert "B*S" in text and "[B, S, 128]" in text, text
    plan = parse(text)
    assert any(i.verb == "recompute" for i in plan.backward), text
    model_file, generated = load_model_file(str(model)), load_generated(tmp_path / "fast.py")
    for b, s in shapes:
        _trains_exactly_within_the_peak(model_file, generated, plan, {0: b, 1: s})
    fast = generated.FastModel(model_file.build_model())
    for b, s, symbol, bound in ((batch + 1, seq, "B", batch), (batch, seq + 1, "S", seq)):
        ids = torch.zeros(b, s, dtype=torch.int64)
        with pytest.raises(ValueError, match=rf"{symbol} = {b if symbol == 'B' else s} is above the largest the plan"
                           rf" allows, {symbol} = {bound}"):  # fmt: skip
            fast(input_ids=ids, labels=ids)


def test_a_sequence_first_model_varies_dim_0_as_s_and_dim_1_as_b(tmp_path):
    result = shell(
        f"remat plan {SEQ_FIRST} --budget 100% --repeats 1 --dynamic S=0,B=1 > m.plan\nremat codegen m.plan -o f.py",
        tmp_path,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    text = (tmp_path / "m.plan").read_text()
    assert "  tokens  int64[S <= 20, B <= 6]\n" in text and "  grad_output.0  float32[S, B, 50]\n" in text, text
    plan = parse(text)
    model_file, generated = load_model_file(str(SEQ_FIRST)), load_generated(tmp_path / "f.py")
    for s, b in ((20, 6), (20, 3), (11, 6), (5, 1)):
        _trains_exactly_within_the_peak(model_file, generated, plan, {0: s, 1: b})


def test_the_op_that_pins_the_sequence_is_named_and_the_batch_still_varies(tmp_path):
    result = shell(f"remat plan {SEQ_PINNED} --budget 100% --repeats 1 --dynamic batch,seq > m.plan", tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    reason = (
        r"the sequence length cannot vary: aten\.slice\.Tensor \(\S*seq_pinned\.py:16\) takes %, 1, 0, 5 at B=4, S=10"
        r" and %, 1, 0, 4 at B=4, S=9"
    )
    assert re.search(f"warning: {reason}; the plan is for its sample S alone", result.stderr), result.stderr
    text = (tmp_path / "m.plan").read_text()
    assert re.search(f"^inputs\n  # {reason}\n  tokens  int64\\[B <= 4, 10\\]\n", text, re.M), text


@pytest.mark.parametrize("value", ["seq", "B=0,B=1", "T=1"])
def test_dynamic_is_refused_before_the_model_is_imported(value, tmp_path):
    model = tmp_path / "loud.py"
    model.write_text("raise SystemExit('imported')\n")
    result = shell(f"remat plan {model} --budget 100% --dynamic '{value}' > m.plan", tmp_path)
    assert result.returncode == 2 and "Traceback" not in result.stderr and "imported" not in result.stderr
    assert f"error: --dynamic '{value}'" in result.stderr and "hint: " in result.stderr, result.stderr
    assert (tmp_path / "m.plan").read_text() == ""


def test_offloaded_activation_at_a_smaller_batch(tmp_path, rows=5):
    """The hand-written offload plan of tests/plans with its batch declared: the host
    buffer is sized at batch 16 and holds the smaller activation at batch 5 (at 16, the
    plan runs as tests/test_runtime.py runs it)."""
    from remat_dsl.plan.printer import print_plan

    plan = parse((MODELS.parent / "plans" / "tiny_mlp_offload.plan").read_text())
    assert any(ins.verb == "offload" for ins in plan.forward)
    graph = plan.graph
    graph = dataclasses.replace(
        graph,
        inputs=(dataclasses.replace(graph.inputs[0], dims=("B", None)),),
        tangents=(dataclasses.replace(graph.tangents[0], dims=("B", None)),),
    )
    (tmp_path / "off.plan").write_text(print_plan(dataclasses.replace(plan, graph=graph)))
    result = shell("remat check off.plan > report.txt\nremat codegen off.plan -o off.py", tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "  x  float32[B <= 16, 32]\n" in (tmp_path / "off.plan").read_text()
    model_file = _at_batch(load_model_file(str(MODELS / "tiny_mlp.py")), rows)
    generated = load_generated(tmp_path / "off.py")
    comparison = compare_training(model_file, generated, steps=3)
    assert comparison.identical, comparison.mismatched[:10]
    measured = step_peak(generated.FastModel(model_file.build_model()), model_file.sample_inputs())
    assert measured <= plan.header.peak_bytes, (rows, measured, plan.header.peak_bytes)
