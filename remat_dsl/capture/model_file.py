"""Model files: a Python file that defines the model to plan.

Contract: `build_model() -> nn.Module`, `sample_inputs()` and optionally `loss_fn(output) ->
Tensor` (a scalar).  `sample_inputs()` returns the arguments of the model's forward: a tuple
(positional), a dict (keyword: `{"input_ids": ids, "labels": ids}`), a pair `(args, kwargs)`,
or one tensor.  Without `loss_fn` the loss is the output's `loss` (Hugging Face models given
`labels=`), else the sum of its floating tensors.  A spec `path.py:factory` selects another
factory than `build_model`.  A model trained under mixed precision says so with
`autocast = torch.bfloat16` (or `torch.float16`): it is captured and planned under
`torch.autocast(device, dtype)` (NOTE: [Autocast] in remat_dsl.capture.fx); `remat plan
--autocast` overrides it.

NOTE: [User code]
A model file is the user's code: importing it and calling its functions can raise
anything, call sys.exit, or return the wrong kind of value.  Every such call goes through
`_call`, which turns a failure into a RematError located at the innermost line of the
model file (`model.py:LINE:COL: error: build_model() raised ValueError: ...`), so the
command exits 2 with that message instead of a traceback.
"""

from __future__ import annotations

import importlib.util
import sys
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from remat_dsl.plan.errors import RematError


@dataclass(frozen=True)
class ModelFile:
    """A loaded model file: its spec (`path:factory`) and its three functions.

    Calling `build_model()`, `sample_inputs()` or `loss_fn(output)` runs the user's code
    under NOTE: [User code]: they raise RematError on any failure of it.  Another
    factory is `dataclasses.replace(model_file, spec=..., build=...)`.
    """

    spec: str
    path: Path
    factory: str
    module: Any  # the imported model file
    build: Callable[[], Any]  # the user's functions, as the file defines them
    inputs: Callable[[], Any]
    loss: Callable[[Any], Any] | None
    autocast: Any = None  # torch.bfloat16 or torch.float16: capture under torch.autocast; None: without

    def build_model(self):
        """The model, an nn.Module.  Raises RematError."""
        import torch

        model = _call(self.path, f"{self.factory}()", self.build)
        if not isinstance(model, torch.nn.Module):
            raise RematError(
                f"{self.path}: error: {self.factory}() returned {_kind(model)}, not a torch.nn.Module",
                hint=f"return the model from {self.factory}()",
            )
        return model

    def sample_inputs(self) -> "Inputs":
        """The arguments of the model's forward, as `Inputs`.  Raises RematError."""
        import torch

        inputs = _call(self.path, "sample_inputs()", self.inputs)
        if isinstance(inputs, torch.Tensor):
            return Inputs((inputs,), {})
        if isinstance(inputs, dict) and all(isinstance(k, str) for k in inputs):
            return Inputs((), dict(inputs))
        pair = (
            isinstance(inputs, tuple)
            and len(inputs) == 2
            and isinstance(inputs[0], (tuple, list))
            and isinstance(inputs[1], dict)
        )
        if pair and all(isinstance(k, str) for k in inputs[1]):
            return Inputs(tuple(inputs[0]), dict(inputs[1]))
        if isinstance(inputs, (tuple, list)):
            return Inputs(tuple(inputs), {})
        raise RematError(
            f"{self.path}: error: sample_inputs() returned {_kind(inputs)}, not the arguments of forward",
            hint="return a tuple of positional arguments (`return (x,)`), a dict of keyword arguments "
            "(`return {\"input_ids\": ids}`) or both as `(args, kwargs)`",
        )

    def loss_fn(self, output) -> Any:
        """A scalar loss from the model's output (the sum of its floating outputs by default)."""
        loss = self.loss
        if loss is None:
            return default_loss(output)
        return _call(self.path, "loss_fn(output)", lambda: loss(output))


@dataclass(frozen=True)
class Inputs:
    """The arguments of one call of the model's forward: `model(*args, **kwargs)`."""

    args: tuple = ()
    kwargs: dict = field(default_factory=dict)

    def call(self, function: Callable[..., Any]) -> Any:
        """`function(*args, **kwargs)`."""
        return function(*self.args, **self.kwargs)

    def leaves(self) -> list:
        """Every argument value, positional first, then keyword in order; the elements of a
        tuple, list or dict argument in its place (NOTE: [Nested arguments] in capture/fx.py)."""
        import torch.utils._pytree as pytree

        return pytree.tree_leaves([list(self.args), list(self.kwargs.values())])


def call_with(function: Callable[..., Any], inputs: "Inputs | tuple") -> Any:
    """`function` applied to `inputs`: an Inputs, or a tuple of positional arguments."""
    return inputs.call(function) if isinstance(inputs, Inputs) else function(*inputs)


def _kind(value: Any) -> str:
    return "None" if value is None else f"a {type(value).__name__}"


def default_loss(output: Any) -> Any:
    """The loss when a model file has no loss_fn: the output's scalar `loss` (a Hugging Face
    output given `labels=`, or a dict with a "loss" key), else the sum of every floating
    output, as float32."""
    import torch
    import torch.utils._pytree as pytree

    loss = output.get("loss") if isinstance(output, dict) else getattr(output, "loss", None)
    if isinstance(loss, torch.Tensor) and loss.dim() == 0 and torch.is_floating_point(loss):
        return loss
    return sum(
        t.float().sum()
        for t in pytree.tree_leaves(output)
        if isinstance(t, torch.Tensor) and torch.is_floating_point(t)
    )


def split_spec(spec: str) -> tuple[str, str]:
    """`examples/gpt2.py:build_gpt2_12l` -> (`examples/gpt2.py`, `build_gpt2_12l`)."""
    path, sep, factory = spec.rpartition(":")
    if not sep or "/" in factory or factory.endswith(".py"):
        return spec, "build_model"
    return path, factory


def load_model_file(spec: str) -> ModelFile:
    """Import a model file by path.

    Raises RematError (exit status 2 at the CLI) when the file is missing, fails to import
    (the message quotes the file:line:col of the failure) or lacks the required functions.
    """
    path_text, factory = split_spec(spec)
    path = Path(path_text)
    if not path.is_file():
        what = "is a directory" if path.is_dir() else "not found"
        raise RematError(
            f"{path_text}: error: model file {what}", hint="pass the path of a .py file that defines build_model()"
        )
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
            hint=(
                "add `def sample_inputs()` returning the arguments of forward: a tuple, a dict of keyword arguments, or"
                " both"
            ),
        )
    loss = getattr(module, "loss_fn", None)
    if loss is not None and not callable(loss):
        raise RematError(
            f"{path_text}:1:1: error: `loss_fn` in the model file is not a function",
            hint="define `def loss_fn(output) -> Tensor` or remove it",
        )
    canonical = path_text if factory == "build_model" else f"{path_text}:{factory}"
    return ModelFile(canonical, path, factory, module, build, inputs, loss, _autocast_of(module, path_text))


def _autocast_of(module, path_text: str):
    """The model file's `autocast` (torch.bfloat16, torch.float16 or None).  Raises RematError."""
    import torch

    value = getattr(module, "autocast", None)
    if value is None or value in (torch.bfloat16, torch.float16):
        return value
    raise RematError(
        f"{path_text}:1:1: error: `autocast` in the model file is {value!r}, not torch.bfloat16 or torch.float16",
        hint="write `autocast = torch.bfloat16` (or torch.float16) to plan under torch.autocast, or remove it",
    )


def _import(path: Path):
    name = f"remat_model_{abs(hash(str(path.resolve())))}"
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise RematError(f"{path}: error: cannot import the model file", hint="pass a .py file")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    directory = str(path.resolve().parent)
    if directory not in sys.path:  # as `python model.py` does: the file may import its neighbours
        sys.path.insert(0, directory)
    loader = spec.loader
    try:
        _call(path, "importing the model file", lambda: loader.exec_module(module))
    except RematError:
        sys.modules.pop(name, None)
        raise
    return module


def _call(path: Path, what: str, function: Callable[[], Any]) -> Any:
    """Run user code; any failure becomes a RematError at its line (NOTE: [User code])."""
    try:
        return function()
    except RematError:
        raise
    except SyntaxError as exc:
        if exc.filename and Path(exc.filename).resolve() == path.resolve():
            where = f"{path}:{exc.lineno or 1}:{exc.offset or 1}"
            raise RematError(
                f"{where}: error: the model file has a syntax error: {exc.msg}",
                hint=f"fix it (`python {path}` shows the same error), then plan again",
            ) from None
        raise _located(exc, path, what) from None
    except SystemExit as exc:
        raise RematError(
            f"{path}: error: {what} called sys.exit({exc.code!r})",
            hint="a model file must not exit; guard script code with `if __name__ == \"__main__\":`",
        ) from None
    except Exception as exc:  # any other failure of user code
        raise _located(exc, path, what) from None


def _located(exc: BaseException, path: Path, what: str) -> RematError:
    frame = _innermost_frame_in(exc, path)
    where = f"{path}:{frame.lineno}:{(frame.colno or 0) + 1}" if frame else f"{path}"
    message = f"{type(exc).__name__}: {exc}".strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    if what.startswith("importing"):
        text = f"{where}: error: the model file failed to import: {message}"
    else:
        text = f"{where}: error: {what} raised {message}"
    return RematError(
        text, hint=f"run `python {path}` or call it in Python to see the full error, fix it, and plan again"
    )


def _innermost_frame_in(exc: BaseException, path: Path):
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if Path(f.filename).resolve() == path.resolve()]
    return frames[-1] if frames else None
