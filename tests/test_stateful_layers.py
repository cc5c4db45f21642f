"""Layers that update buffers in the forward (issue 49, part 1; NOTE: [Stateful layers] in
remat_dsl/capture/stateful.py): spectral norm (the parametrization and the older hook),
InstanceNorm with running statistics, one BatchNorm applied twice in a forward, norms with
`momentum=None` (NOTE: [Cumulative averages]).  Each model
goes through the shell as a user types it (`remat plan`, `remat check`, `remat codegen`),
then trains SGD steps bit for bit against eager: losses, gradients, parameters, and every
buffer after every step (`compare_training`)."""

from __future__ import annotations

import pytest

from remat_dsl.capture.model_file import load_model_file
from remat_dsl.codegen.compare import compare_training, load_generated
from test_stock_models import MODELS, plan_and_train, shell, smallest_budget


@pytest.mark.parametrize("name, budgets", [
        ("spectral_norm_gan", ("100%",)), pytest.param("spectral_norm_gan", ("min",), marks=pytest.mark.slow),
        ("instance_norm_stats", ("100%",)),
        pytest.param("instance_norm_stats", ("min",), marks=pytest.mark.slow),
        ("spectral_norm_hook", ("100%",)), ("batch_norm_twice", ("100%",)),
    ])  # fmt: skip
def test_stateful_layers_train_bit_for_bit(name, budgets, tmp_path):
    model = MODELS / f"{name}.py"
    for budget in budgets:
        if budget == "min":
            budget = f"{smallest_budget(model, tmp_path) * 11 // 10}B"
        text, _ = plan_and_train(model, budget, tmp_path)
        assert "\nupdates\n" in text  # the running statistics and power iteration are buffer updates


def test_buffer_updates_are_compared_after_each_step(tmp_path):
    """compare_training fails a module that leaves its buffers as they were: the check
    of the tests above can fail."""
    model = MODELS / "spectral_norm_gan.py"
    result = shell(f"remat plan {model} --budget 100% --repeats 1 > m.plan\nremat codegen m.plan -o fast.py", tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    fast = tmp_path / "fast.py"
    lines = [line for line in fast.read_text().splitlines() if "__u.copy_(" not in line]
    fast.write_text("\n".join(lines) + "\n")
    comparison = compare_training(load_model_file(str(model)), load_generated(fast), steps=2)
    assert not comparison.buffers_equal
    assert any(m.startswith("step 0 buffer net.0.parametrizations.weight.0._u") for m in comparison.mismatched)


def test_a_recompute_that_reads_an_updated_buffer_is_refused(tmp_path):
    """The module writes a buffer's new value where the forward computes it: an op that
    reads the buffer and runs again after that would read the next step's value.  Such a
    hand-edited plan is refused, and solvers' plans never hold one (`buffer_readers`)."""
    model = MODELS / "spectral_norm_gan.py"
    result = shell(f"remat plan {model} --budget 100% --repeats 1 > m.plan", tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    lines = (tmp_path / "m.plan").read_text().splitlines()
    update = next(
        i for i, line in enumerate(lines) if line.split() == ["compute", "net.0.parametrizations.weight.0.div_1"]
    )
    reader = "net.0.parametrizations.weight.0.mv"  # W @ v, from the buffer _v that div_1 updates
    assert any(line.split() == ["compute", reader] for line in lines[:update])
    lines[update + 1 : update + 1] = [f"  recompute {reader}", f"  delete   {reader}"]
    (tmp_path / "bad.plan").write_text("\n".join(lines) + "\n")
    result = shell("remat check bad.plan", tmp_path)
    assert result.returncode == 2
    assert (
        f"bad.plan:{update + 2}:13: error: '{reader}' reads buffer 'net.0.parametrizations.weight.0._v'"
        in result.stderr
    )
    assert f"line {update + 1}" in result.stderr


# --- cumulative averages (NOTE: [Cumulative averages] in remat_dsl/capture/stateful.py) ---

READ = "aten._local_scalar_dense.default"  # NOTE: [Scalar reads] in remat_dsl/plan/operators.py


@pytest.mark.parametrize("name", ["batch_norm_cumulative", "batch_norm_cumulative_twice", "instance_norm_cumulative"])
def test_cumulative_average_norms_train_bit_for_bit(name, tmp_path):
    """BatchNorm with `momentum=None` (a CNN; one applied twice a step, whose count grows by
    two), and InstanceNorm with running statistics and `momentum=None` (PyTorch passes it
    momentum 0.0): three SGD steps, every buffer compared after every step."""
    text, _ = plan_and_train(MODELS / f"{name}.py", "100%", tmp_path, steps=3)
    norm = {"batch_norm_cumulative": "1", "batch_norm_cumulative_twice": "bn"}.get(name)
    if norm is None:  # no count to read: InstanceNorm's momentum is the constant 0.0
        assert READ not in text and ", 0.0, 1e-05)" in text
        return
    assert f"{norm}.reciprocal = aten.reciprocal.default(%{norm}._to_copy)" in text
    assert f"{READ}(%{norm}.reciprocal)" in text
    if name == "batch_norm_cumulative_twice":  # the second use reads the count after the first
        assert "bn.add_1 = aten.add.Tensor(%bn.add, 1)" in text
        assert f"{READ}(%bn.reciprocal_1)" in text
        assert "bn.num_batches_tracked = %bn.add_1" in text


@pytest.fixture(scope="module")
def recomputing_plan(tmp_path_factory):
    """The MLP with two BatchNorm1d(momentum=None) planned at 110% of its smallest budget,
    where the solver recomputes the first norm in the backward: (folder, plan text)."""
    cwd = tmp_path_factory.mktemp("cumulative")
    model = MODELS / "batch_norm_cumulative_mlp.py"
    budget = smallest_budget(model, cwd) * 11 // 10
    result = shell(f"remat plan {model} --budget {budget}B --repeats 1 > m.plan\nremat codegen m.plan -o fast.py", cwd)
    assert result.returncode == 0, result.stderr[-3000:]
    return cwd, (cwd / "m.plan").read_text()


def test_a_recomputed_cumulative_norm_reads_the_steps_factor(recomputing_plan):
    """The recompute of the norm reads the factor of the step's count, kept from the
    forward, and the module trains three steps bit for bit, buffers included."""
    cwd, text = recomputing_plan
    lines = text.splitlines()
    recompute = lines.index("  recompute  net.1._native_batch_norm_legit_functional")
    deleted = lines.index("  delete     net.1.reciprocal")
    assert lines.index("backward") < recompute < deleted
    assert "  delete   net.1.reciprocal" not in lines  # kept from the forward to the recompute
    assert not any(line.split()[:2] == ["recompute", "net.1.add"] for line in lines)  # reads the updated buffer
    model_file = load_model_file(str(MODELS / "batch_norm_cumulative_mlp.py"))
    comparison = compare_training(model_file, load_generated(cwd / "fast.py"), steps=3)
    assert comparison.identical, comparison.mismatched[:10]


def test_a_factor_deleted_before_the_recompute_is_refused(recomputing_plan, tmp_path):
    """A hand edit that deletes the factor in the forward leaves the recompute without it:
    refused at the recompute's line."""
    _, text = recomputing_plan
    lines = text.splitlines()
    lines.remove("  delete     net.1.reciprocal")
    computed = lines.index("  compute  net.1._native_batch_norm_legit_functional")
    lines.insert(computed + 1, "  delete   net.1.reciprocal")
    (tmp_path / "bad.plan").write_text("\n".join(lines) + "\n")
    result = shell("remat check bad.plan", tmp_path)
    assert result.returncode == 2 and "Traceback" not in result.stderr
    line = lines.index("  recompute  net.1._native_batch_norm_legit_functional") + 1
    assert f"bad.plan:{line}:14: error: saved tensor 'net.1.reciprocal' is missing" in result.stderr
    assert f"it was deleted at line {computed + 2}" in result.stderr


@pytest.mark.parametrize("old, new, message", [
        (f"{READ}(%net.1.reciprocal)", f"{READ}(%net.1.num_batches_tracked)",
         f"`{READ}` reads '%net.1.num_batches_tracked', which no op of the plan makes"),
        ("aten.relu.default(%net.1._native_batch_norm_legit_functional)", f"aten.relu.default({READ}(%net.1.add))",
         f"`{READ}` gives a number where `aten.relu` takes `Tensor` (argument `self`)"),
    ], ids=["the count buffer", "a tensor argument"])  # fmt: skip
def test_a_scalar_read_misused_is_refused_where_it_is(recomputing_plan, tmp_path, old, new, message):
    """Hand edits of the read, sealed again (so that the digest does not refuse them
    first): reading the count buffer itself (a recompute would read the next step's count),
    and a number where the operator takes a tensor.  Refused at file:line:col."""
    from remat_dsl.plan.parser import parse
    from remat_dsl.plan.printer import print_plan

    _, text = recomputing_plan
    assert text.count(old) == 1
    (tmp_path / "bad.plan").write_text(print_plan(parse(text.replace(old, new))))
    result = shell("remat check bad.plan", tmp_path)
    assert result.returncode == 2 and "Traceback" not in result.stderr
    first = result.stderr.splitlines()[0]
    assert first.startswith("bad.plan:") and f": error: {message}" in first, result.stderr


def test_a_cumulative_norm_follows_the_batch(tmp_path):
    """`--dynamic batch` on the CNN: one plan trains at batch 4, 3 and 2, three steps each,
    bit for bit; a module given another momentum fails the comparison of the buffers (the
    check above can fail)."""
    import dataclasses

    model = MODELS / "batch_norm_cumulative.py"
    result = shell(
        f"remat plan {model} --budget 100% --repeats 1 --dynamic batch > m.plan\nremat codegen m.plan -o fast.py",
        tmp_path,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "  input  float32[B <= 4, 3, 8, 8]\n" in (tmp_path / "m.plan").read_text()
    model_file = load_model_file(str(model))
    generated = load_generated(tmp_path / "fast.py")
    for batch in (4, 3, 2):
        at = dataclasses.replace(model_file, inputs=lambda b=batch: tuple(x[:b].clone() for x in model_file.inputs()))
        comparison = compare_training(at, generated, steps=3)
        assert comparison.identical, (batch, comparison.mismatched[:10])
    source = (tmp_path / "fast.py").read_text()
    read = "aten__local_scalar_dense_default(v_1_reciprocal)"
    assert source.count(read) == 1
    (tmp_path / "fixed.py").write_text(source.replace(read, "0.1"))
    comparison = compare_training(model_file, load_generated(tmp_path / "fixed.py"), steps=2)
    assert comparison.losses_equal and comparison.gradients_equal and not comparison.buffers_equal
    assert "step 0 buffer 1.running_mean" in comparison.mismatched


def test_capture_gives_norms_their_momentum_back():
    """The sentinel momentum lives only while capturing, also when the capture fails."""
    import torch

    from remat_dsl.capture.fx import capture
    from remat_dsl.capture.model_file import Inputs
    from remat_dsl.plan.errors import RematError

    class Failing(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.bn = torch.nn.BatchNorm1d(4, momentum=None)

        def forward(self, x):
            y = self.bn(x)
            return y.nonzero()  # a size that depends on the data: refused

    model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.BatchNorm1d(4, momentum=None))
    captured = capture(model, Inputs((torch.randn(5, 3),), {}), copy_model=False)
    assert model[1].momentum is None and list(captured.averages.values())[0][0] == 6
    failing = Failing()
    with pytest.raises(RematError):
        capture(failing, Inputs((torch.randn(5, 4),), {}), copy_model=False)
    assert failing.bn.momentum is None
