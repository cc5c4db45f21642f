"""Models that checkpoint themselves (issue 49, part 1): NOTE: [User checkpointing] in
remat_dsl/capture/checkpoints.py.

Each model file goes through the shell as a user types it (`remat plan ... > m.plan && remat
check m.plan && remat codegen m.plan -o fast.py`), then `compare_training` trains it against
eager with the user's checkpointing on, bit for bit: a residual MLP that calls
`checkpoint(block, x, use_reentrant=False)` per block (dropout inside; at 100% of the
autograd peak and 110% of the smallest budget), the same with `use_reentrant=True` and with
`checkpoint_sequential` (100%), and a stock Hugging Face Llama after
`gradient_checkpointing_enable()` with attention dropout (100%).  With `-m slow`: those at
the other budget, and the Llama with each `use_reentrant` in `gradient_checkpointing_kwargs`.
All were refused with "SymIntArrayRef expected to contain only concrete integers"."""

from __future__ import annotations

import re

import pytest
import torch
import torch.utils.checkpoint

from remat_dsl.capture.checkpoints import direct_sequential
from test_stock_models import MODELS, plan_and_train, shell, smallest_budget

BLOCKS = MODELS / "checkpointed_blocks.py"
LLAMA = MODELS / "hf_llama_checkpointing.py"


def plan_within(spec: str, budget: str, tmp_path) -> str:
    """The plan of `spec` at `budget` (`min`: 110% of the smallest), trained against eager.
    How long planning takes is bench/planning_time.py's to measure (MODEL.py arguments), on
    an idle machine: tests check behaviour, not timings."""
    if budget == "min":
        budget = f"{smallest_budget(spec, tmp_path) * 11 // 10}B"
    text, _ = plan_and_train(spec, budget, tmp_path)
    return text


@pytest.mark.parametrize("spec, budgets", [
        (f"{BLOCKS}", ("100%", "min")), (f"{BLOCKS}:build_reentrant", ("100%",)),
        (f"{BLOCKS}:build_sequential", ("100%",)), (f"{LLAMA}", ("100%",)),
    ])  # fmt: skip
def test_checkpointed_models_plan_and_train_bit_for_bit(spec, budgets, tmp_path):
    for budget in budgets:
        text = plan_within(spec, budget, tmp_path)
        assert not re.search(r"rng_state|tag_activation|wrap_body", text)  # the model's own ops, named by module
        forward = text.split("\nforward\n", 1)[1].split("\n\n", 1)[0]
        assert re.search(r"^  compute +\S*(dropout|self_attn)", forward, re.M), forward  # draws, in the ops planned
        if budget == "min" and spec.startswith(str(BLOCKS)):  # a draw made again in the backward, as eager's
            assert re.search(r"^  recompute +blocks\.\d\.dropout$", text, re.M), text


@pytest.mark.slow
@pytest.mark.parametrize("spec, budget", [
        (f"{BLOCKS}:build_reentrant", "min"), (f"{BLOCKS}:build_sequential", "min"), (f"{LLAMA}", "min"),
        (f"{LLAMA}:build_non_reentrant", "100%"), (f"{LLAMA}:build_reentrant", "min"),
    ])  # fmt: skip
def test_checkpointed_models_at_other_budgets(spec, budget, tmp_path):
    plan_within(spec, budget, tmp_path)


def test_a_checkpointed_model_plans_what_the_same_model_without_checkpointing_plans(tmp_path):
    """The user's checkpointing is replaced, not kept: the plan of the checkpointed model
    at 60% is the plan of the same model calling its blocks directly, but for the model's
    name in its header (and the digest, which seals the header's model line too)."""
    plain = tmp_path / "plain.py"
    plain.write_text(BLOCKS.read_text().replace("x = checkpoint(block, x, use_reentrant=False)", "x = block(x)"))
    assert plain.read_text() != BLOCKS.read_text()
    plans = []
    for model in (BLOCKS, plain):
        result = shell(f"remat plan {model} --budget 60% --repeats 1", tmp_path)
        assert result.returncode == 0, result.stderr[-3000:]
        plans.append(re.sub(r"^  model .*$", "", result.stdout.split("\ndigest\n")[0], flags=re.M))
    assert plans[0] == plans[1]
    assert re.search(r"^  recompute +blocks\.\d\.up$", plans[0], re.M), plans[0]


def test_checkpoint_sequential_is_restored_after_capture_and_on_error():
    """`direct_sequential` swaps the code of `checkpoint_sequential` for the capture only."""
    original = torch.utils.checkpoint.checkpoint_sequential.__code__
    layers = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU())
    x = torch.randn(2, 4)
    with direct_sequential():
        assert torch.equal(torch.utils.checkpoint.checkpoint_sequential(layers, 2, x, use_reentrant=False), layers(x))
    assert torch.utils.checkpoint.checkpoint_sequential.__code__ is original
    with pytest.raises(ZeroDivisionError), direct_sequential():
        1 / 0
    assert torch.utils.checkpoint.checkpoint_sequential.__code__ is original
