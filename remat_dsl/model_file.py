"""Model files: a Python file that defines the model to plan.

Contract: `build_model() -> nn.Module`, `sample_inputs() -> tuple` (positional arguments of
the model's forward) and optionally `loss_fn(output) -> Tensor` (a scalar).  A spec
`path.py:factory` selects another factory than `build_model`.
"""

from __future__ import annotations

import importlib.util
import sys
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from remat_dsl.errors import RematError


@dataclass(frozen=True)
class ModelFile:
    """A loaded model file: its spec (`path:factory`) and its three functions."""

    spec: str
    build_model: Callable[[], Any]
    sample_inputs: Callable[[], tuple]
    loss_fn: Callable[[Any], Any]


def default_loss(output: Any) -> Any:
    """Sum of every floating output, as float32: the loss when a model file has no loss_fn."""
    import torch

    leaves = output if isinstance(output, (tuple, list)) else (output,)
    return sum(t.float().sum() for t in leaves if torch.is_floating_point(t))


def split_spec(spec: str) -> tuple[str, str]:
    """`examples/gpt2.py:build_gpt2_12l` -> (`examples/gpt2.py`, `build_gpt2_12l`)."""
    path, sep, factory = spec.rpartition(":")
    if not sep or "/" in factory or factory.endswith(".py"):
        return spec, "build_model"
    return path, factory


def load_model_file(spec: str) -> ModelFile:
    """Import a model file by path.

    Raises RematError (exit status 2 at the CLI) when the file is missing, fails to import
    (the message quotes the file:line of the failure) or lacks the required functions.
    """
    path_text, factory = split_spec(spec)
    path = Path(path_text)
    if not path.is_file():
        raise RematError(f"{path_text}: error: model file not found", hint="pass the path of a .py file that defines build_model()")
    module = _import(path)
    build = getattr(module, factory, None)
    if not callable(build):
        raise RematError(
            f"{path_text}:1:1: error: the model file defines no function '{factory}'",
            hint=f"add `def {factory}() -> nn.Module` or select a factory with {path_text}:NAME",
        )
    inputs = getattr(module, "sample_inputs", None)
    if not callable(inputs):
        raise RematError(
            f"{path_text}:1:1: error: the model file defines no function 'sample_inputs'",
            hint="add `def sample_inputs() -> tuple` returning the positional inputs of forward",
        )
    loss = getattr(module, "loss_fn", None) or default_loss
    canonical = path_text if factory == "build_model" else f"{path_text}:{factory}"
    return ModelFile(canonical, build, inputs, loss)


def _import(path: Path):
    name = f"remat_model_{abs(hash(str(path.resolve())))}"
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except Exception as exc:  # any failure of user code becomes one clear message
        frame = _innermost_frame_in(exc, path)
        where = f"{path}:{frame.lineno}:1" if frame else f"{path}"
        raise RematError(
            f"{where}: error: the model file failed to import: {type(exc).__name__}: {exc}",
            hint="run `python " + str(path) + "` to see the full error, fix it, and plan again",
        ) from None
    return module


def _innermost_frame_in(exc: BaseException, path: Path):
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if Path(f.filename).resolve() == path.resolve()]
    return frames[-1] if frames else None


def check_plan_matches(plan, model_file: ModelFile) -> None:
    """Raise PlanError at the first input or parameter declaration of `plan` that the model
    file's `sample_inputs()` / `build_model()` contradicts (another model, other shapes)."""
    import torch

    from remat_dsl.errors import PlanError

    inputs = [t for t in model_file.sample_inputs() if isinstance(t, torch.Tensor)]
    hint = f"plan again for this model: remat plan {model_file.spec} --budget ..."
    if len(inputs) != len(plan.graph.inputs):
        first = plan.graph.inputs[0].span if plan.graph.inputs else None
        raise PlanError(f"the plan takes {len(plan.graph.inputs)} inputs but {model_file.spec} gives {len(inputs)}", span=first, hint=hint)
    for decl, tensor in zip(plan.graph.inputs, inputs):
        _check_value(decl, tensor, "input", model_file.spec, hint)
    params = dict(model_file.build_model().named_parameters())
    for decl in plan.graph.parameters:
        if decl.name not in params:
            raise PlanError(f"the plan is for another model: {model_file.spec} has no parameter '{decl.name}'", span=decl.span, hint=hint, length=len(decl.name))
        _check_value(decl, params[decl.name], "parameter", model_file.spec, hint)


def _check_value(decl, tensor, what: str, spec: str, hint: str) -> None:
    from remat_dsl.errors import PlanError

    actual = f"{str(tensor.dtype).removeprefix('torch.')}{list(tensor.shape)}"
    expected = f"{decl.dtype}{list(decl.shape)}"
    if actual != expected:
        raise PlanError(
            f"the plan was made for {what} '{decl.name}' {expected}, but {spec} gives {actual}",
            span=decl.span, hint=hint, length=len(decl.name),
        )
