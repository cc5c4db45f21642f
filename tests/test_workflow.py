"""The Python API (remat_dsl.workflow, exported by `import remat_dsl`): a model built in a
script, with no model file, is planned, checked, generated and trained exactly; a model file
gives the plan `remat plan` prints; bad arguments are refused with RematError."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

import remat_dsl

ROOT = Path(__file__).resolve().parent.parent

SCRIPT = '''
import sys
import torch
import remat_dsl


class Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.up = torch.nn.Linear(32, 128)
        self.gate = torch.nn.Linear(32, 128)
        self.down = torch.nn.Linear(128, 32)
        self.drop = torch.nn.Dropout(0.1)

    def forward(self, x):
        h = self.drop(torch.nn.functional.silu(self.gate(x)) * self.up(x))
        return self.down(h) + x


class Gated(torch.nn.Module):  # built here, in the user's script: no model file
    def __init__(self):
        super().__init__()
        self.blocks = torch.nn.Sequential(*(Block() for _ in range(6)))

    def forward(self, x, scale=1.0):
        return self.blocks(x) * scale


def loss_fn(out):
    return out.square().mean()


torch.manual_seed(0)
model, twin = Gated(), Gated()
twin.load_state_dict(model.state_dict())
x = torch.randn(256, 32, generator=torch.Generator().manual_seed(1))
before = {k: v.clone() for k, v in model.state_dict().items()}
plan = remat_dsl.plan_model(model, (x,), budget="60%", loss_fn=loss_fn, solver="rotor", repeats=1)
assert all(torch.equal(v, model.state_dict()[k]) for k, v in before.items()), "planning changed the model"
assert plan.header.peak_bytes <= plan.header.budget and plan.header.model == "python:Gated", plan.header
text = remat_dsl.plan_text(plan)
open("gated.plan", "w").write(text)
assert remat_dsl.read_plan("gated.plan") == remat_dsl.check_plan("gated.plan")
remat_dsl.check_plan(plan, model, (x,))
open("fast_gated.py", "w").write(remat_dsl.generate_module("gated.plan"))
fast = remat_dsl.load_module("fast_gated.py").FastModel(twin)
optimizers = [torch.optim.AdamW(m.parameters(), lr=1e-3) for m in (model, twin)]
for step in range(3):
    losses = []
    for module, optimizer in zip((model, fast), optimizers):
        optimizer.zero_grad(set_to_none=True)
        torch.manual_seed(100 + step)
        loss = loss_fn(module(x))
        loss.backward()
        optimizer.step()
        losses.append(loss.detach())
    assert torch.equal(*losses), (step, losses)
assert all(torch.equal(a, b) for a, b in zip(model.parameters(), twin.parameters()))
print("trained exactly", plan.header.solver, plan.header.peak_bytes, plan.header.budget)
'''


def test_a_model_built_in_a_script_is_planned_generated_and_trained_exactly(tmp_path):
    """As a user writes it: a script (run as a program, its own directory) builds an
    nn.Module, plans it with the API at 60% of its autograd peak, checks the plan (as text
    and against the model), writes the module and trains three AdamW steps (dropout on)
    beside the eager model: losses and parameters equal bit for bit."""
    (tmp_path / "train_gated.py").write_text(SCRIPT)
    result = subprocess.run(
        [sys.executable, "train_gated.py"], cwd=tmp_path, capture_output=True, text=True, timeout=600
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "trained exactly rotor" in result.stdout, result.stdout
    assert "import remat_dsl" not in (tmp_path / "fast_gated.py").read_text()


def test_a_model_file_gives_the_plan_remat_plan_prints(tmp_path):
    """With predicted costs (no measurement), the API's plan of a model file and the
    command's are the same bytes."""
    model = ROOT / "tests/models/tiny_mlp.py"
    plan = remat_dsl.plan_model(str(model), budget="100%", solver="rotor", device="a100")
    command = [
        sys.executable,
        "-m",
        "remat_dsl",
        "plan",
        str(model),
        "--budget",
        "100%",
        "--solver",
        "rotor",
        "--device",
        "a100",
    ]
    result = subprocess.run(command, cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr
    assert remat_dsl.plan_text(plan) == result.stdout


@pytest.mark.parametrize(
    "call, message",
    [
        (lambda m, x: remat_dsl.plan_model(m, None), "no inputs given"),
        (lambda m, x: remat_dsl.plan_model(m, (x,), budget=50), "the budget must be more than 0 bytes|is infeasible"),
        (lambda m, x: remat_dsl.plan_model(m, (x,), budget="half"), "budget"),
        (lambda m, x: remat_dsl.plan_model(m, (x,), budget=1.5), "the budget is a float"),
        (lambda m, x: remat_dsl.plan_model(m, (x,), solver="fastest"), "unknown solver 'fastest'"),
        (lambda m, x: remat_dsl.plan_model("no/such/model.py"), "model file not found"),
        (lambda m, x: remat_dsl.plan_model(str(ROOT / "tests/models/tiny_mlp.py"), (x,)), "gives its own inputs"),
        (lambda m, x: remat_dsl.plan_model(object(), (x,)), "not a torch.nn.Module"),
    ],
)
def test_bad_arguments_are_refused_with_a_message(call, message):
    model, x = torch.nn.Linear(4, 4), torch.randn(2, 4)
    with pytest.raises(remat_dsl.RematError, match=message):
        call(model, x)


def test_the_api_is_exported_without_importing_torch():
    code = "import sys, remat_dsl; assert 'torch' not in sys.modules; print(sorted(remat_dsl.__all__))"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    for name in ("plan_model", "capture_model", "solve_captured", "check_plan", "generate_module", "load_module"):
        assert name in result.stdout
