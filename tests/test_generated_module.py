"""The generated module is never silently wrong: mode, grad mode, in-place changes,
argument order and names, and the model it is given are all checked.

Plans: the tiny MLP's checked-in plans (dropout), the tiny conv net's (BatchNorm running
statistics), and a rotor plan of the encoder-decoder Transformer whose two inputs have
the same shape here, so that swapping them could not be caught by a shape check.
"""

from __future__ import annotations

import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from remat_dsl.capture.model_file import load_model_file
from remat_dsl.capture.pipeline import capture_graph
from remat_dsl.plan.printer import print_plan
from remat_dsl.solve.driver import autograd_peak, make_plan
from remat_dsl.codegen.compare import load_generated

ROOT = Path(__file__).resolve().parent.parent
PLANS = ROOT / "tests" / "plans"


def generated(plan_path: Path, tmp_path: Path):
    out = tmp_path / f"fast_{plan_path.stem}.py"
    result = subprocess.run(
        [sys.executable, "-m", "remat_dsl", "codegen", str(plan_path), "-o", str(out)], capture_output=True, text=True
    )
    assert result.returncode == 0, result.stderr
    return load_generated(out)


@pytest.fixture(scope="module")
def mlp(tmp_path_factory):
    return load_model_file(str(ROOT / "tests/models/tiny_mlp.py")), generated(
        PLANS / "tiny_mlp_recompute.plan", tmp_path_factory.mktemp("mlp")
    )


@pytest.fixture(scope="module")
def cnn(tmp_path_factory):
    return load_model_file(str(ROOT / "tests/models/tiny_cnn.py")), generated(
        PLANS / "tiny_cnn_checkmate.plan", tmp_path_factory.mktemp("cnn")
    )


def test_eval_mode_and_no_grad_run_the_models_own_forward(cnn):
    model_file, module = cnn
    x = model_file.sample_inputs().args
    eager, twin = model_file.build_model(), model_file.build_model()
    fast = module.FastModel(twin)
    eager.eval(), fast.eval()
    assert not twin.training
    assert torch.equal(fast(*x), eager(*x))
    assert all(torch.equal(a, b) for a, b in zip(eager.buffers(), twin.buffers()))
    # FastModel(model.eval()): the model's mode decides
    twin = model_file.build_model().eval()
    assert torch.equal(module.FastModel(twin)(*x), eager(*x))
    # train mode without grad: what the model does, running statistics included
    eager, twin = model_file.build_model(), model_file.build_model()
    fast = module.FastModel(twin)
    with torch.no_grad():
        torch.manual_seed(5)
        a = eager(*x)
        torch.manual_seed(5)
        b = fast(*x)
    assert torch.equal(a, b)
    assert all(torch.equal(p, q) for p, q in zip(eager.buffers(), twin.buffers()))


def test_an_in_place_change_between_forward_and_backward_raises(mlp):
    model_file, module = mlp
    model = model_file.build_model()
    fast = module.FastModel(model)
    loss = model_file.loss_fn(fast(*model_file.sample_inputs().args))
    with torch.no_grad():
        model.fc2.weight.add_(1.0)  # an optimizer step between forward and backward
    with pytest.raises(RuntimeError, match="modified by an inplace operation: 'fc2.weight'"):
        loss.backward()
    # eager PyTorch raises too
    eager = model_file.build_model()
    loss = model_file.loss_fn(eager(*model_file.sample_inputs().args))
    with torch.no_grad():
        eager.fc2.weight.add_(1.0)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        loss.backward()


def test_the_model_must_be_the_plans(mlp, cnn):
    _, module = mlp
    cnn_file, _ = cnn
    with pytest.raises(ValueError, match="the model has no parameter 'fc1.weight'"):
        module.FastModel(cnn_file.build_model())
    wider = torch.nn.Module()
    wider.fc1, wider.fc2, wider.head = torch.nn.Linear(32, 65), torch.nn.Linear(64, 64), torch.nn.Linear(64, 8)
    with pytest.raises(
        ValueError, match=r"parameter 'fc1.weight' is float32\[65, 32\], the plan's is float32\[64, 32\]"
    ):
        module.FastModel(wider)


def plan_module(model_file, tmp_path: Path, percent: int = 100, solver: str = "rotor"):
    """Capture, plan at `percent` of the autograd peak, print, generate and import."""
    captured = capture_graph(model_file, repeats=1)
    budget = autograd_peak(captured.graph, "cpu") * percent // 100
    path = tmp_path / "t.plan"
    path.write_text(
        print_plan(make_plan(captured.graph, model=model_file.spec, device="cpu", budget=budget, solver=solver))
    )
    return generated(path, tmp_path)


def test_frozen_parameters_and_inputs_that_require_grad_are_refused(mlp, tmp_path):
    model_file, module = mlp
    fast = module.FastModel(model_file.build_model())
    (x,) = model_file.sample_inputs().args
    with pytest.raises(ValueError, match="input 'x' requires grad"):
        fast(x.clone().requires_grad_())

    def frozen_bias():
        model = model_file.build()
        model.fc1.bias.requires_grad_(False)
        return model

    module = plan_module(replace(model_file, build=frozen_bias), tmp_path)
    torch.manual_seed(0)
    model_file.loss_fn(module.FastModel(frozen_bias())(x)).backward()  # as planned: fine
    with pytest.raises(ValueError, match="parameter 'fc1.bias' requires grad, but the plan was made with it frozen"):
        module.FastModel(model_file.build_model())(x)


def test_an_unused_parameter_keeps_no_gradient_and_a_frozen_one_no_line(tmp_path):
    """NOTE: [Frozen and unused parameters]: a branch whose output the head discards (as
    CANINE's and BigBird's classifiers do) requires grad and gets none, as eagerly; frozen
    when planned, it has no gradients line, and unfrozen since, it is refused."""
    from remat_dsl.codegen.compare import compare_training

    model_file = load_model_file(str(ROOT / "tests/models/discarded_branch.py"))
    (tmp_path / "a").mkdir(), (tmp_path / "b").mkdir()
    module = plan_module(model_file, tmp_path / "a")
    assert [g.value for g in module_plan(tmp_path / "a").graph.gradients if g.parameter.startswith("branch")] == [
        None,
        None,
    ]
    fast = module.FastModel(model_file.build_model())
    model_file.loss_fn(fast(*model_file.sample_inputs().args)).backward()
    assert fast.model.branch.weight.grad is None and fast.model.head.weight.grad is not None
    assert compare_training(model_file, module, steps=2).identical

    def frozen_branch():
        model = model_file.build()
        model.branch.requires_grad_(False)
        return model

    module = plan_module(replace(model_file, build=frozen_branch), tmp_path / "b")
    assert not [g for g in module_plan(tmp_path / "b").graph.gradients if g.parameter.startswith("branch")]
    module.FastModel(frozen_branch())(*model_file.sample_inputs().args)
    with pytest.raises(
        ValueError, match="parameter 'branch.weight' requires grad, but the plan was made with it frozen"
    ):
        module.FastModel(model_file.build_model())(*model_file.sample_inputs().args)


def test_a_tensor_kept_as_a_plain_attribute_is_a_buffer_of_the_plan(tmp_path):
    """NOTE: [Tensor attributes]: a position table that is neither parameter nor buffer (as
    VideoMAE's) is listed among the plan's buffers by its attribute path and read from the
    model; one left on another device than the parameters is refused."""
    from remat_dsl.codegen.compare import compare_training

    model_file = load_model_file(str(ROOT / "tests/models/tensor_attribute.py"))
    module = plan_module(model_file, tmp_path)
    assert [b.name for b in module_plan(tmp_path).graph.buffers] == ["embeddings.table"]
    assert compare_training(model_file, module, steps=2).identical
    model = model_file.build_model()
    model.embeddings.table = model.embeddings.table.to("meta")
    with pytest.raises(ValueError, match="buffer 'embeddings.table' is on meta but the model's parameters are on cpu"):
        module.FastModel(model)(*model_file.sample_inputs().args)


def module_plan(tmp_path: Path):
    from remat_dsl.plan.parser import parse

    return parse((tmp_path / "t.plan").read_text())


def test_inputs_bind_by_the_forwards_names_not_the_graphs_order(tmp_path):
    """An encoder-decoder whose src and tgt have the same shape: swapped, they would train
    on the wrong inputs without any shape error."""
    model_file = load_model_file(str(ROOT / "examples/transformer.py"))
    src, _ = model_file.sample_inputs().args
    tgt = torch.randn(src.shape, generator=torch.Generator().manual_seed(9))
    same = replace(model_file, inputs=lambda: (src.clone(), tgt.clone()))
    module = plan_module(same, tmp_path, percent=70)
    expected = []
    for first, second in ((src, tgt), (tgt, src)):
        eager = same.build_model()
        torch.manual_seed(3)
        expected.append(eager(first, second))
    assert not torch.equal(*expected)  # a swap would have mattered
    for call in (
        lambda m: m(src, tgt),
        lambda m: m(src=src, tgt=tgt),
        lambda m: m(tgt=tgt, src=src),
        lambda m: m(src, tgt=tgt),
    ):
        fast = module.FastModel(same.build_model())
        torch.manual_seed(3)
        assert torch.equal(call(fast), expected[0])
    with pytest.raises(TypeError, match="unexpected keyword argument 'memory'"):
        module.FastModel(same.build_model())(src, tgt, memory=src)


OPTIONAL_ARGUMENT_MODEL = """
import torch
from torch import nn


class Scaled(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 8)

    def forward(self, x, scale=None):
        y = self.fc(x)
        return y if scale is None else y * scale


def build_model():
    torch.manual_seed(0)
    return Scaled()


def sample_inputs():
    return (torch.randn(4, 8, generator=torch.Generator().manual_seed(1)),)
"""


def test_an_argument_the_plan_was_made_without_is_refused(tmp_path):
    path = tmp_path / "scaled.py"
    path.write_text(OPTIONAL_ARGUMENT_MODEL)
    model_file = load_model_file(str(path))
    module = plan_module(model_file, tmp_path)
    (x,) = model_file.sample_inputs().args
    fast = module.FastModel(model_file.build_model())
    assert torch.equal(fast(x), model_file.build_model()(x))
    with pytest.raises(TypeError, match="the plan was made without the argument 'scale': pass only x"):
        fast(x, scale=torch.tensor(2.0))


def test_other_input_shapes_say_which_shapes_the_plan_is_for(mlp):
    model_file, module = mlp
    fast = module.FastModel(model_file.build_model())
    with pytest.raises(ValueError, match=r"input 'x' is float32\[8, 32\] but the plan was made for float32\[16, 32\]"):
        fast(torch.randn(8, 32))


NESTED_NAMES_MODEL = """
import torch
from torch import nn


class Inner(nn.Module):
    def __init__(self):
        super().__init__()
        self.model = nn.Linear(6, 6)  # named as FastModel's own submodule
        self.norm = nn.BatchNorm1d(6)  # running statistics and a version in the metadata

    def forward(self, x):
        return self.norm(self.model(x)).relu()


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.model = Inner()
        self.head = nn.Linear(6, 3)

    def forward(self, x):
        return self.head(self.model(x))


def build_model():
    torch.manual_seed(0)
    return Net()


def sample_inputs():
    return (torch.randn(5, 6, generator=torch.Generator().manual_seed(1)),)
"""


def _train(module, x, steps: int, seed: int) -> list[torch.Tensor]:
    optimizer = torch.optim.SGD(module.parameters(), lr=0.1, momentum=0.9)
    losses = []
    for step in range(steps):
        optimizer.zero_grad(set_to_none=True)
        torch.manual_seed(seed + step)
        loss = module(x).square().mean()
        loss.backward()
        optimizer.step()
        losses.append(loss.detach())
    return losses


def test_a_checkpoint_saved_from_the_module_loads_into_the_model_and_trains_on_exactly(tmp_path):
    """NOTE: [State dict keys]: FastModel.state_dict() has the model's keys, in the model's
    order (a model whose own submodules are named `model`, with BatchNorm's running
    statistics); torch.save of it loads into a fresh model and into a fresh FastModel, and
    both train on exactly alike; a state dict saved from the model loads into FastModel."""
    path = tmp_path / "nested.py"
    path.write_text(NESTED_NAMES_MODEL)
    model_file = load_model_file(str(path))
    module = plan_module(model_file, tmp_path, percent=100)
    (x,) = model_file.sample_inputs().args
    model = model_file.build_model()
    fast = module.FastModel(model)
    _train(fast, x, 2, seed=10)
    saved = fast.state_dict()
    assert list(saved) == list(model.state_dict()), list(saved)
    assert "model.model.weight" in saved and "model.norm.num_batches_tracked" in saved
    torch.save(saved, tmp_path / "checkpoint.pt")
    loaded = torch.load(tmp_path / "checkpoint.pt", weights_only=True)

    def fresh():
        other = model_file.build_model()
        with torch.no_grad():
            for tensor in other.state_dict().values():
                tensor.add_(1) if tensor.is_floating_point() else tensor.zero_()  # not the checkpoint's
        return other

    eager = fresh()
    assert not eager.load_state_dict(loaded).missing_keys
    twin = fresh()
    again = module.FastModel(twin)
    result = again.load_state_dict(loaded)
    assert not result.missing_keys and not result.unexpected_keys
    for a, b, c in zip(model.state_dict().values(), eager.state_dict().values(), twin.state_dict().values()):
        assert torch.equal(a, b) and torch.equal(a, c)
    eager_losses, fast_losses = _train(eager, x, 3, seed=20), _train(again, x, 3, seed=20)
    assert all(torch.equal(a, b) for a, b in zip(eager_losses, fast_losses))
    for (name, a), b in zip(eager.state_dict().items(), twin.state_dict().values()):
        assert torch.equal(a, b), name
    # the other way: the model's own state dict into a FastModel, and under a parent module
    third = module.FastModel(fresh())
    third.load_state_dict(model.state_dict())
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), third.state_dict().values()))
    parent = torch.nn.Sequential(module.FastModel(model))
    assert list(parent.state_dict()) == ["0." + key for key in model.state_dict()]
    module.FastModel(fresh()).load_state_dict(saved)
    torch.nn.Sequential(module.FastModel(fresh())).load_state_dict(parent.state_dict())
