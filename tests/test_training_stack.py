"""The generated module in a real training stack (issue 12): autocast and torch.compile.

autocast: models planned with `remat plan M --autocast bf16 ... > m.plan` (a shell
redirection, as users type it) train bit for bit like eager PyTorch under
`torch.autocast("cpu", dtype=torch.bfloat16)`; the plan's header says `autocast bfloat16`,
its tensors have their real dtypes, the header round-trips and is sealed by the digest,
and the module refuses a call under another autocast state.

torch.compile: `torch.compile(FastModel(model), fullgraph=True)` traces the generated
forward and backward (any graph break fails fullgraph), and two SGD steps of it are
compared with two steps of the compiled eager model: bit for bit with `aot_eager`; with
`inductor`, within the deviation that compiling the eager model itself shows, measured
here: the largest relative deviation from eager (max |x - eager| / max |eager| over the
loss and every gradient of both steps) is no larger than the compiled eager model's.
Inductor runs with `fallback_random` so that dropout draws what eager draws.

Default runs stay small (the tiny MLP, with a recomputed dropout; the stock 2-layer Llama,
given one tensor as two arguments, with `aot_eager`; GPT-2 with 2 layers and BERT under
autocast); the four examples with both backends run with `pytest -m slow`
(about 12 minutes on 2 cores, inductor's compilation most of it).
"""

from __future__ import annotations

import dataclasses
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from remat_dsl.capture.cost import load_device
from remat_dsl.capture.model_file import load_model_file
from remat_dsl.capture.pipeline import capture_graph
from remat_dsl.check.verify import verify
from remat_dsl.codegen.compare import compare_training, load_generated
from remat_dsl.codegen.generate import generate
from remat_dsl.plan.parser import parse
from remat_dsl.plan.printer import print_plan
from remat_dsl.solve.driver import make_plan, smallest_budget
from test_stock_models import EAGER_WARNING

ROOT = Path(__file__).resolve().parent.parent

# name -> (model file, keyword arguments of build_model: a small config)
EXAMPLES = {
    "gpt2": ("examples/gpt2.py", {"n_layer": 1}),
    "transformer": ("examples/transformer.py", {"layers": 1}),
    "resnet": ("examples/resnet.py", {}),
    "unet": ("examples/unet.py", {}),
    "tiny_mlp": ("tests/models/tiny_mlp.py", {}),
    "hf_llama_gqa": ("tests/models/hf_llama_gqa.py", {}),  # stock, called with labels=input_ids
}


def model_file_of(name: str):
    path, build = EXAMPLES[name]
    model_file = load_model_file(str(ROOT / path))
    if build:
        model_file = dataclasses.replace(model_file, build=lambda: model_file.module.build_model(**build))
    return model_file


def generated_module(model_file, tmp_path: Path):
    """Plan `model_file` with rotor at its smallest feasible budget (the most recomputation;
    costs predicted for this CPU: nothing is timed), round-trip the plan text, generate and
    import the module."""
    captured = capture_graph(model_file, repeats=1, device_model=load_device("cpu"))
    budget = smallest_budget(captured.graph, captured.device, "rotor")
    plan = make_plan(captured.graph, model=model_file.spec, device=captured.device, budget=budget, solver="rotor")
    path = tmp_path / "fast_model.py"
    path.write_text(generate(verify(parse(print_plan(plan), "model.plan")), "model.plan"))
    return load_generated(path)


@dataclasses.dataclass
class Run:
    """What `steps` SGD steps gave: the losses, each step's gradients by parameter name
    (None where a parameter got none), the buffers at the end."""

    losses: list[torch.Tensor]
    grads: list[dict[str, torch.Tensor | None]]
    buffers: dict[str, torch.Tensor]


def train(model_file, wrap, steps: int = 2) -> Run:
    """`steps` SGD steps (lr 0.1) of `wrap(model)` on a fresh model, seeded as compare_training
    does.  Steps after the first run with torch.compile's stance `fail_on_recompile`: a
    compiled module that traced once must not trace again."""
    model = model_file.build_model()
    module = wrap(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    inputs = model_file.sample_inputs()
    run = Run([], [], {})
    for step in range(steps):
        optimizer.zero_grad(set_to_none=True)
        torch.manual_seed(1000 + step)
        with torch.compiler.set_stance("fail_on_recompile" if step else "default"):
            loss = model_file.loss_fn(inputs.call(module))
        loss.backward()
        run.losses.append(loss.detach().clone())
        run.grads.append({n: None if p.grad is None else p.grad.clone() for n, p in model.named_parameters()})
        optimizer.step()
    run.buffers = {n: b.clone() for n, b in model.named_buffers()}
    return run


def compiled(backend: str, fast=None):
    """A wrap for `train`: torch.compile(fullgraph=True) of the model, or of `fast.FastModel(model)`."""

    def wrap(model):
        torch._dynamo.reset()
        return torch.compile(model if fast is None else fast.FastModel(model), backend=backend, fullgraph=True)

    return wrap


def assert_identical(a: Run, b: Run) -> None:
    assert all(torch.equal(x, y) for x, y in zip(a.losses, b.losses)), (a.losses, b.losses)
    for step, (ga, gb) in enumerate(zip(a.grads, b.grads)):
        for name in ga:
            assert (ga[name] is None) == (gb[name] is None), f"step {step}: gradient of {name}"
            assert ga[name] is None or torch.equal(ga[name], gb[name]), f"step {step}: gradient of {name} differs"
    for name in a.buffers:
        assert torch.equal(a.buffers[name], b.buffers[name]), f"buffer {name} differs"


def deviations(run: Run, reference: Run) -> list[float]:
    """For the loss and every gradient of every step: max |run - reference| / max |reference|."""
    pairs = list(zip(run.losses, reference.losses))
    pairs += [(g[n], r[n]) for g, r in zip(run.grads, reference.grads) for n in r if r[n] is not None]
    return [((x - y).abs().max() / y.abs().max().clamp_min(1e-30)).item() for x, y in pairs]


def check_compiled(name: str, backend: str, tmp_path: Path) -> None:
    """The compiled generated module trains like the compiled eager model (see the module docstring)."""
    model_file = model_file_of(name)
    fast = generated_module(model_file, tmp_path)
    if name in ("gpt2", "tiny_mlp"):  # dropout that the plan recomputes: its draws are replayed
        assert "_replay(" in Path(fast.__file__).read_text()
    with torch._inductor.config.patch(fallback_random=True):
        reference = train(model_file, compiled(backend))
        ours = train(model_file, compiled(backend, fast))
    torch._dynamo.reset()
    if backend == "aot_eager":
        assert_identical(ours, reference)
        return
    eager = train(model_file, lambda model: model)
    tolerance = max(deviations(reference, eager))
    assert max(deviations(ours, eager)) <= tolerance, (max(deviations(ours, eager)), tolerance)


@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
def test_compiled_module_trains_like_compiled_eager(backend, tmp_path):
    check_compiled("tiny_mlp", backend, tmp_path)  # the examples: test_compiled_examples, -m slow


def test_compiled_module_takes_one_tensor_given_as_two_arguments(tmp_path):
    """The stock Llama's inputs pass one tensor as `input_ids` and `labels`; dynamo refuses an
    autograd.Function that takes a tensor twice, so the module passes it once (NOTE:
    [Repeated inputs] in remat_dsl/codegen/runtime.py) and traces whole."""
    inputs = model_file_of("hf_llama_gqa").sample_inputs()
    assert inputs.kwargs["input_ids"] is inputs.kwargs["labels"]
    check_compiled("hf_llama_gqa", "aot_eager", tmp_path)


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
@pytest.mark.parametrize("name", ["gpt2", "transformer", "resnet", "unet"])
def test_compiled_examples(name, backend, tmp_path):
    check_compiled(name, backend, tmp_path)


# --- autocast ----------------------------------------------------------------------

REMAT = str(Path(sys.executable).with_name("remat"))
GPT2_SMALL = f"""
import sys
sys.path.insert(0, {str(ROOT / "examples")!r})
import gpt2
from gpt2 import sample_inputs, loss_fn  # noqa: F401


def build_model():  # examples/gpt2.py with 2 layers
    return gpt2.build_model(n_layer=2)
"""


def shell(command: str, cwd: Path) -> subprocess.CompletedProcess:
    """`command` run by the shell in `cwd`, as a user types it."""
    return subprocess.run(
        command, shell=True, cwd=cwd, capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(ROOT)}
    )


def plan_and_generate(model: str, flags: str, tmp_path: Path) -> tuple[str, Path]:
    """(plan text, generated module path) of `remat plan MODEL FLAGS > m.plan; remat codegen m.plan`."""
    planned = shell(f"{shlex.quote(REMAT)} plan {shlex.quote(model)} {flags} > m.plan", tmp_path)
    assert planned.returncode == 0, planned.stderr
    assert EAGER_WARNING not in planned.stderr, planned.stderr  # NOTE: [Eager agreement]: the traced step is eager's
    generated = shell(f"{shlex.quote(REMAT)} codegen m.plan -o fast_m.py", tmp_path)
    assert generated.returncode == 0, generated.stderr
    return (tmp_path / "m.plan").read_text(), tmp_path / "fast_m.py"


@pytest.mark.parametrize(
    "name, model, flags",
    [
        ("gpt2", None, "--autocast bf16 --budget 60% --solver rotor --device cpu"),
        ("bert", "tests/models/hf_bert.py", "--autocast bf16 --budget 75% --solver rotor --device cpu"),
        ("transposed", "tests/models/transposed_dropout.py", "--autocast bf16 --budget 70% --device cpu"),
    ],
)
def test_autocast_plan_trains_exactly_like_eager_autocast(name, model, flags, tmp_path):
    if model is None:
        (tmp_path / "gpt2_small.py").write_text(GPT2_SMALL)
        model = str(tmp_path / "gpt2_small.py")
    else:
        model = str(ROOT / model)
    text, module = plan_and_generate(model, flags, tmp_path)
    assert re.search(r"^  autocast +bfloat16$", text, re.M)
    assert re.search(r"^  \S+\._to_copy\S* +\[[0-9, ]+\] +bfloat16 ", text, re.M)  # the casts, with their real dtypes
    assert re.search(r"^  recompute ", text, re.M)
    generated = load_generated(module)
    assert generated.AUTOCAST is torch.bfloat16
    if name == "gpt2":  # dropout that the plan recomputes, in bf16: captured as eager runs it, draws replayed
        assert "_replay(" in module.read_text() and "aten_bernoulli_p" in module.read_text()
    model_file = dataclasses.replace(load_model_file(model), autocast=torch.bfloat16)
    comparison = compare_training(model_file, generated, steps=2)
    assert comparison.identical, comparison.mismatched[:5]


TINY_BF16 = f"""
import sys
sys.path.insert(0, {str(ROOT / "tests" / "models")!r})
import torch
from tiny_mlp import build_model, sample_inputs, loss_fn  # noqa: F401

autocast = torch.bfloat16
"""


@pytest.fixture(scope="module")
def tiny_bf16(tmp_path_factory):
    """(directory, plan text, generated module) of tests/models/tiny_mlp.py in a model file
    that declares `autocast = torch.bfloat16`, planned without --autocast."""
    directory = tmp_path_factory.mktemp("tiny_bf16")
    (directory / "tiny_bf16.py").write_text(TINY_BF16)
    text, module = plan_and_generate(str(directory / "tiny_bf16.py"), "--budget 100% --device cpu", directory)
    return directory, text, load_generated(module)


def test_model_file_declares_autocast(tiny_bf16):
    directory, text, generated = tiny_bf16
    assert re.search(r"^  autocast +bfloat16$", text, re.M)
    assert re.search(r"^  fc1\.addmm +\[16, 64\] +bfloat16 +2 KiB", text, re.M)  # real dtype and size
    model_file = load_model_file(str(directory / "tiny_bf16.py"))
    assert model_file.autocast is torch.bfloat16
    comparison = compare_training(model_file, generated, steps=2)  # under the file's autocast
    assert comparison.identical, comparison.mismatched[:5]
    checked = shell(
        f"{shlex.quote(REMAT)} check m.plan --model", directory
    )  # a fresh capture, under the plan's autocast
    assert checked.returncode == 0, checked.stderr
    assert re.search(r"autocast +│ +bfloat16", checked.stdout)


def test_module_refuses_another_autocast_state(tiny_bf16, tmp_path):
    directory, _, generated = tiny_bf16
    model_file = load_model_file(str(directory / "tiny_bf16.py"))
    x = model_file.sample_inputs().args[0]
    fast = generated.FastModel(model_file.build_model())
    with pytest.raises(
        RuntimeError, match=r"made under torch.autocast\('cpu', dtype=torch.bfloat16\) and autocast is off"
    ):
        fast(x)
    with (
        torch.autocast("cpu", dtype=torch.float16),
        pytest.raises(RuntimeError, match="autocast is on with torch.float16"),
    ):
        fast(x)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert fast(x).dtype == torch.bfloat16
    fast.eval()  # eval mode runs the model's own forward: any autocast state
    assert fast(x).dtype == torch.float32
    # --autocast none overrides the model file: a float32 plan, which refuses a call under autocast
    text, module = plan_and_generate(
        str(directory / "tiny_bf16.py"), "--autocast none --budget 100% --device cpu", tmp_path
    )
    assert "autocast" not in text.split("\nforward\n")[0] and " bfloat16 " not in text
    fp32 = load_generated(module)
    assert fp32.AUTOCAST is None
    with (
        torch.autocast("cpu", dtype=torch.bfloat16),
        pytest.raises(RuntimeError, match=r"plan again under it \(remat plan ... --autocast bf16\)"),
    ):
        fp32.FastModel(model_file.build_model())(x)


def test_autocast_header_round_trips_and_is_sealed(tiny_bf16, tmp_path):
    from remat_dsl.plan import ir
    from remat_dsl.plan.errors import PlanError

    _, text, _ = tiny_bf16
    plan = parse(text, "m.plan")
    assert plan.graph.autocast == ir.Autocast("bfloat16")
    assert print_plan(plan) == text and parse(print_plan(plan)) == plan
    line = next(line for line in text.split("\n") if line.startswith("  autocast"))
    for edited, message in (
        (text.replace(line, "  autocast    float16"), "the header's `autocast` line was edited"),
        (text.replace(line + "\n", ""), "the header's `autocast` line was removed"),
    ):
        with pytest.raises(PlanError, match=message):
            verify(parse(edited, "m.plan"))
    made_in_code = dataclasses.replace(
        plan, graph=dataclasses.replace(plan.graph, autocast=ir.Autocast("float8")), section_spans=(), digest=None
    )
    with pytest.raises(PlanError, match="unknown autocast dtype `float8`"):
        verify(made_in_code)


def test_bad_autocast_is_one_message(tmp_path):
    bad_flag = shell(
        f"{shlex.quote(REMAT)} plan {ROOT / 'tests/models/tiny_mlp.py'} --autocast fp8 --budget 50% > m.plan", tmp_path
    )
    assert bad_flag.returncode == 2 and "Traceback" not in bad_flag.stderr
    assert "error: unknown --autocast dtype 'fp8'" in bad_flag.stderr and "hint: " in bad_flag.stderr
    assert (tmp_path / "m.plan").read_text() == ""
    (tmp_path / "bad.py").write_text(TINY_BF16.replace("autocast = torch.bfloat16", 'autocast = "bf16"'))
    bad_file = shell(f"{shlex.quote(REMAT)} plan bad.py --budget 50%", tmp_path)
    assert bad_file.returncode == 2 and "Traceback" not in bad_file.stderr
    assert (
        "bad.py:1:1: error: `autocast` in the model file is 'bf16', not torch.bfloat16 or torch.float16"
        in bad_file.stderr
    )


def test_compiled_module_under_autocast_trains_exactly_like_eager_autocast(tiny_bf16):
    directory, _, generated = tiny_bf16
    model_file = load_model_file(str(directory / "tiny_bf16.py"))

    def step(wrap):
        model = model_file.build_model()
        torch.manual_seed(0)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = model_file.loss_fn(model_file.sample_inputs().call(wrap(model)))
        loss.backward()
        return [loss.detach()] + [p.grad for p in model.parameters()]

    torch._dynamo.reset()
    eager = step(lambda model: model)
    ours = step(lambda model: torch.compile(generated.FastModel(model), backend="aot_eager", fullgraph=True))
    torch._dynamo.reset()
    assert all(torch.equal(a, b) for a, b in zip(eager, ours))
