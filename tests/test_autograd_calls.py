"""Every autograd call people make on a training step, through the generated module and
through eager PyTorch (issue 45, part 5): exact, or refused with a RuntimeError.

`loss.backward(inputs=[...])`, `torch.autograd.grad(...)` with and without
`allow_unused`, `retain_graph=True` twice, a second backward without it, `create_graph=True`
and a double backward, on the GPT-2 example (dropout, recomputed) and a stock Hugging Face
Llama, each planned and generated as a user does it (`remat plan`, `remat codegen`) at a
budget where the plan recomputes and releases gradients mid-backward (NOTE: [Autograd nodes]
in templates/module.py.jinja).  Eager and generated run from the same parameters and seeds;
results, and every `.grad` afterwards, are compared with torch.equal (None with None).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

from remat_dsl.capture.model_file import load_model_file
from remat_dsl.codegen.compare import _deterministic, load_generated

ROOT = Path(__file__).resolve().parent.parent
MODELS = {"gpt2": ("examples/gpt2.py", "60%"), "llama": ("tests/models/hf_llama.py", "70%")}


def remat(*args: str, cwd: Path) -> None:
    result = subprocess.run([sys.executable, "-m", "remat_dsl", *args], cwd=cwd, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr[-3000:]


# the GPT-2 example (a Rockmate plan; 35 s) runs with `pytest -m slow`: the stock Llama's plan
# recomputes and releases gradients early as well
@pytest.fixture(scope="module", params=[pytest.param("gpt2", marks=pytest.mark.slow), "llama"])
def planned(request, tmp_path_factory):
    """(model file, generated module) of a model of MODELS, planned at its budget."""
    path, budget = MODELS[request.param]
    where = tmp_path_factory.mktemp(request.param)
    remat("plan", str(ROOT / path), "--budget", budget, "--repeats", "1", "-o", "model.plan", cwd=where)
    remat("codegen", "model.plan", "-o", "fast_model.py", cwd=where)
    module = load_generated(where / "fast_model.py")
    source = (where / "fast_model.py").read_text()
    assert module.RELEASES and "(recompute)" in source  # gradients released mid-backward, values recomputed
    return load_model_file(str(ROOT / path)), module


def run(planned, call):
    """`call(loss, params)` on eager and on the generated module, from the same state and
    seeds: ((result or the exception), {name: .grad}) for each."""
    model_file, module = planned
    outcomes = []
    for fast in (False, True):
        model = model_file.build_model()
        runner = module.FastModel(model) if fast else model
        params = [p for _, p in model.named_parameters()]
        with _deterministic():
            torch.manual_seed(11)
            loss = model_file.loss_fn(model_file.sample_inputs().call(runner))
            try:
                result = call(loss, params)
            except RuntimeError as error:
                result = error
        outcomes.append((result, {n: None if p.grad is None else p.grad.clone() for n, p in model.named_parameters()}))
    return outcomes


def same(a, b) -> bool:
    if a is None or b is None:
        return a is None and b is None
    return torch.equal(a, b)


def assert_exact(planned, call):
    (eager, eager_grads), (ours, our_grads) = run(planned, call)
    assert not isinstance(eager, Exception), eager
    assert not isinstance(ours, Exception), ours
    if eager is not None:
        assert len(eager) == len(ours) and all(same(a, b) for a, b in zip(eager, ours))
    assert eager_grads.keys() == our_grads.keys()
    differ = [n for n in eager_grads if not same(eager_grads[n], our_grads[n])]
    assert not differ, differ
    return eager_grads


def test_backward(planned):
    grads = assert_exact(planned, lambda loss, params: loss.backward())
    assert all(g is not None for g in grads.values())


@pytest.mark.parametrize("which", ["first", "middle", "last", "three"])
def test_backward_with_inputs_accumulates_only_those(planned, which):
    """A parameter of each kind of node: a group released early, the last one (handed over
    at the end), and several at once."""

    def pick(params):
        return {
            "first": params[:1],
            "middle": params[len(params) // 2 : len(params) // 2 + 1],
            "last": params[-1:],
        }.get(which, params[::5][:3])

    grads = assert_exact(planned, lambda loss, params: loss.backward(inputs=pick(params)))
    assert 1 <= sum(g is not None for g in grads.values()) <= 3


def test_autograd_grad_returns_eager_gradients_and_writes_no_grad(planned):
    grads = assert_exact(planned, lambda loss, params: torch.autograd.grad(loss, params))
    assert all(g is None for g in grads.values())


def test_autograd_grad_of_some_parameters(planned):
    assert_exact(planned, lambda loss, params: torch.autograd.grad(loss, params[1::3]))


def test_autograd_grad_allow_unused(planned):
    """A tensor the loss does not use gets None, as eagerly; without allow_unused both raise."""
    unused = torch.zeros(3, requires_grad=True)
    assert_exact(planned, lambda loss, params: torch.autograd.grad(loss, [*params, unused], allow_unused=True))
    (eager, _), (ours, _) = run(planned, lambda loss, params: torch.autograd.grad(loss, [*params, unused]))
    assert isinstance(eager, RuntimeError) and isinstance(ours, RuntimeError)
    assert "appears to not have been used in the graph" in str(ours)


def test_retain_graph_twice(planned):
    def twice(loss, params):
        loss.backward(retain_graph=True)
        loss.backward()

    assert_exact(planned, twice)


def test_retain_graph_then_autograd_grad(planned):
    def both(loss, params):
        loss.backward(retain_graph=True)
        return torch.autograd.grad(loss, params[:2])

    assert_exact(planned, both)


def test_a_second_backward_without_retain_graph_raises_as_eager_does(planned):
    def twice(loss, params):
        loss.backward()
        loss.backward()

    (eager, eager_grads), (ours, our_grads) = run(planned, twice)
    assert isinstance(eager, RuntimeError) and isinstance(ours, RuntimeError)
    assert "backward through the graph a second time" in str(ours)
    assert all(same(eager_grads[n], our_grads[n]) for n in eager_grads)  # the first backward's


def test_create_graph_and_double_backward_are_refused(planned):
    def create_graph(loss, params):
        loss.backward(create_graph=True)

    def double(loss, params):
        grads = torch.autograd.grad(loss, params, create_graph=True)
        return torch.autograd.grad(sum(g.square().sum() for g in grads), params)

    for call in (create_graph, double):  # eager PyTorch runs them (GPT-2) or not (the Llama's CPU attention)
        (_, _), (ours, our_grads) = run(planned, call)
        assert (
            isinstance(ours, RuntimeError)
            and "not differentiable" in str(ours)
            and "call the model itself" in str(ours)
        )
        assert all(g is None for g in our_grads.values())  # refused before any gradient was written
