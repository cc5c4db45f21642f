"""Layers that update buffers in the forward (issue 49, part 1; NOTE: [Stateful layers] in
remat_dsl/capture/stateful.py): spectral norm (the parametrization and the older hook),
InstanceNorm with running statistics, one BatchNorm applied twice in a forward.  Each model
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


def test_a_cumulative_average_norm_is_refused_with_pytorchs_reason(tmp_path):
    """`BatchNorm2d(momentum=None)` reads a tensor into a Python float each step, which
    torch.compile cannot trace either: the refusal quotes PyTorch and names the norm."""
    model = MODELS / "batch_norm_cumulative.py"
    result = shell(f"remat plan {model} --budget 100% > m.plan", tmp_path)
    assert result.returncode == 2
    assert "Traceback" not in result.stderr
    assert "data-dependent expression" in result.stderr  # PyTorch's own words
    assert "the model's '1' has momentum=None" in result.stderr
    assert "hint: give each a momentum" in result.stderr
