"""The example model files in examples/ keep the model-file contract and capture fullgraph."""

from __future__ import annotations

import importlib.util
import math
from pathlib import Path

import pytest
import torch
from torch import nn
from functorch.compile import make_boxed_func
from torch._dynamo.backends.common import aot_autograd

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
NAMES = ["gpt2", "transformer", "resnet"]


def load(name: str):
    path = EXAMPLES / f"{name}.py"
    spec = importlib.util.spec_from_file_location(f"_example_{name}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module", params=NAMES)
def example(request):
    return request.param, load(request.param)


def test_build_model_deterministic(example):
    _, m = example
    a, b = m.build_model().state_dict(), m.build_model().state_dict()
    assert a.keys() == b.keys()
    for key in a:
        assert torch.equal(a[key], b[key]), key


def test_sample_inputs_deterministic(example):
    _, m = example
    a, b = m.sample_inputs(), m.sample_inputs()
    assert isinstance(a, tuple) and len(a) >= 1
    assert len(a) == len(b)
    for x, y in zip(a, b):
        assert isinstance(x, torch.Tensor)
        assert torch.equal(x, y)


def test_eager_forward_backward(example):
    _, m = example
    model = m.build_model()
    assert model.training
    out = model(*m.sample_inputs())
    assert isinstance(out, torch.Tensor) or (
        isinstance(out, tuple) and all(isinstance(t, torch.Tensor) for t in out)
    )
    loss = m.loss_fn(out)
    assert isinstance(loss, torch.Tensor) and loss.dim() == 0
    assert math.isfinite(float(loss.detach()))
    loss.backward()
    grads = [p.grad for p in model.parameters() if p.requires_grad]
    assert grads and all(g is not None for g in grads)
    assert all(torch.isfinite(g).all() for g in grads)


def test_train_mode_layers(example):
    name, m = example
    model = m.build_model()
    if name == "resnet":
        bns = [mod for mod in model.modules() if isinstance(mod, nn.BatchNorm2d)]
        assert bns and all(bn.training for bn in bns)
        assert not any(getattr(mod, "inplace", False) for mod in model.modules())
    else:
        drops = [mod for mod in model.modules() if isinstance(mod, nn.Dropout)]
        assert drops and all(d.training and d.p == pytest.approx(0.1) for d in drops)
        if name == "gpt2":
            # attention dropout is a module too; the config carries all three probabilities
            cfg = model.config
            assert cfg.resid_pdrop == cfg.embd_pdrop == cfg.attn_pdrop == pytest.approx(0.1)


def test_fullgraph_capture_aot_autograd(example):
    _, m = example
    model = m.build_model()
    inputs = m.sample_inputs()
    graphs = []

    def fw(gm, example_inputs):
        graphs.append(gm)
        return make_boxed_func(gm)

    be = aot_autograd(fw_compiler=fw, bw_compiler=lambda gm, ex: make_boxed_func(gm))
    torch._dynamo.reset()
    try:
        out = torch.compile(model, backend=be, fullgraph=True, dynamic=False)(*inputs)
        loss = m.loss_fn(out)
        loss.backward()
    finally:
        torch._dynamo.reset()
    assert len(graphs) == 1
    assert math.isfinite(float(loss.detach()))


def test_gpt2_depth_factories():
    m = load("gpt2")
    assert m.build_model().config.n_layer == 4
    assert m.build_model(n_layer=2).config.n_layer == 2
    assert m.build_gpt2_6l().config.n_layer == 6
    big = m.build_gpt2_12l()
    assert big.config.n_layer == 12
    assert "transformer.h.11.attn.c_attn.weight" in big.state_dict()
    logits = big(*m.sample_inputs())
    assert logits.shape == (4, 128, 1024)
