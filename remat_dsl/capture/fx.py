"""Capture the forward and backward graphs of a model's training step.

We compile the model with `torch.compile(..., fullgraph=True)` and an AOTAutograd backend
whose partition function records the forward and backward FX graphs that PyTorch's own
default partition makes: the forward graph returns the buffer updates, the model outputs
and the saved tensors; the backward graph takes the saved tensors and the output
gradients (tangents) and returns one gradient per forward input.  This is the "autograd"
FB-graph: it saves what eager PyTorch saves (../shared/notes/capture-probe.md).

The model is deep-copied and the RNG state restored, so capture changes neither the
model's buffers nor the random stream.
"""

from __future__ import annotations

import contextlib
import copy
import logging
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.fx as fx
import torch.utils._pytree as pytree

from remat_dsl.plan.errors import RematError


@dataclass
class Captured:
    """The FX graphs of one training step and what their placeholders stand for.

    primal_names: for each forward placeholder, ("parameter"|"buffer"|"input", name).
    mutated: indices of forward placeholders whose buffer the forward updates, in the
    order the forward graph returns their new values.
    num_outputs: number of model outputs the forward graph returns after the updates.
    tangent_of: for each backward tangent placeholder (in order), the index of the model
    output (flat) whose gradient it is.
    out_spec: the pytree structure of the model output.
    """

    forward: fx.GraphModule
    backward: fx.GraphModule
    primal_names: list[tuple[str, str]]
    mutated: list[int]
    num_outputs: int
    tangent_of: list[int]
    out_spec: pytree.TreeSpec
    example_primals: list[torch.Tensor]


def capture(model: torch.nn.Module, inputs: tuple) -> Captured:
    """Trace `model(*inputs)` and its backward into two FX graphs.

    Raises RematError when the model cannot be captured as one graph (graph breaks,
    unsupported outputs), with the reason PyTorch gave.
    """
    model = copy.deepcopy(model)
    record: dict = {}
    with torch.random.fork_rng(devices=_cuda_devices(inputs)):
        out = _compile_and_run(model, inputs, record)
    flat, spec = pytree.tree_flatten(out)
    if not _tensors_in_tuples(out):
        raise RematError(
            f"error: the model's forward returns {_structure_name(out)}; remat-dsl plans a forward that "
            "returns a tensor or a tuple/list of tensors",
            hint="wrap the model so forward returns tensors (for Hugging Face models return `.logits`, or `.loss` with labels)",
        )
    if "backward" not in record:
        raise RematError("error: the model has no parameter that requires a gradient", hint="nothing to plan")
    names = _primal_names(model, record["example_inputs"], inputs)
    meta = record["meta"]
    mutated = [i for i, info in enumerate(meta.input_info) if info.mutates_data]
    _check_outputs(meta)
    tangent_of = [d.output.idx for d in meta.traced_tangents_descs]
    return Captured(
        forward=record["forward"],
        backward=record["backward"],
        primal_names=names,
        mutated=mutated,
        num_outputs=len(meta.output_info),
        tangent_of=tangent_of,
        out_spec=spec,
        example_primals=list(record["example_inputs"]),
    )


def _tensors_in_tuples(value) -> bool:
    if isinstance(value, (tuple, list)) and type(value) in (tuple, list):
        return all(_tensors_in_tuples(item) for item in value)
    return isinstance(value, torch.Tensor)


def _structure_name(value) -> str:
    """What a forward returned, for messages: `a dict`, `a CausalLMOutput`, `a tuple holding a None`."""
    if isinstance(value, (tuple, list)) and type(value) in (tuple, list):
        bad = next(item for item in value if not _tensors_in_tuples(item))
        return f"a {type(value).__name__} holding {_structure_name(bad)}"
    return "None" if value is None else f"a {type(value).__name__}"


def _cuda_devices(inputs: tuple) -> list[int]:
    return sorted({t.device.index or 0 for t in inputs if isinstance(t, torch.Tensor) and t.is_cuda})


def _compile_and_run(model, inputs, record):
    from torch._dynamo.backends.common import aot_autograd
    from torch._functorch.partitioners import default_partition

    def partition(joint, joint_inputs, **kwargs):
        fw, bw = default_partition(joint, joint_inputs, **kwargs)
        record["forward"], record["backward"] = fw, bw
        return fw, bw

    def forward_compiler(gm, example_inputs):
        from torch._guards import TracingContext

        record["meta"] = TracingContext.try_get().fw_metadata
        return gm

    aot = aot_autograd(fw_compiler=forward_compiler, bw_compiler=lambda gm, ex: gm, partition_fn=partition)

    def backend(gm, example_inputs):
        record["example_inputs"] = example_inputs
        return aot(gm, example_inputs)

    torch._dynamo.reset()
    try:
        with _torch_logs_silenced():
            compiled = torch.compile(model, backend=backend, fullgraph=True, dynamic=False)
            return compiled(*inputs)
    except RematError:
        raise
    except SystemExit as exc:
        raise RematError(f"error: the model's forward called sys.exit({exc.code!r}) while it was captured") from None
    except Exception as exc:
        raise _capture_error(exc) from None
    finally:
        torch._dynamo.reset()


@contextlib.contextmanager
def _torch_logs_silenced():
    """Disable torch's loggers while capturing: a failure is reported once, as a RematError,
    not as the tracebacks dynamo and fake tensors log on their way."""
    loggers = [logging.getLogger(name) for name in list(logging.root.manager.loggerDict) if name.split(".")[0] == "torch"]
    saved = [logger.disabled for logger in loggers]
    for logger in loggers:
        logger.disabled = True
    try:
        yield
    finally:
        for logger, disabled in zip(loggers, saved):
            logger.disabled = disabled


def _capture_error(exc: Exception) -> RematError:
    """`FILE:LINE:COL: error: cannot capture ...` at the user's line dynamo stopped on, with
    PyTorch's own explanation in the hint."""
    lines = [line.strip() for line in str(exc).strip().splitlines() if line.strip()]
    first = lines[0] if lines else type(exc).__name__
    explanation = next((line.removeprefix("Explanation:").strip() for line in lines if line.startswith("Explanation:")), None)
    torch_dir = str(Path(torch.__file__).resolve().parent)
    user = [f for f in getattr(exc, "real_stack", None) or () if not str(Path(f.filename).resolve()).startswith(torch_dir)]
    where = f"{user[-1].filename}:{user[-1].lineno}:{(getattr(user[-1], 'colno', None) or 0) + 1}: " if user else ""
    said = f"PyTorch says: {explanation[:400].rstrip('.')}. " if explanation else ""
    return RematError(
        f"{where}error: cannot capture the model as one graph: {first}",
        hint=f"{said}remat-dsl needs a forward that torch.compile(fullgraph=True) captures whole: no data-dependent "
        "Python control flow, no prints of tensors, and one that runs in eager PyTorch",
    )


def _primal_names(model, example_inputs, inputs) -> list[tuple[str, str]]:
    """Name each graph input by identity: a parameter, a buffer or a user input."""
    by_id: dict[int, tuple[str, str]] = {}
    for name, p in model.named_parameters():
        by_id.setdefault(id(p), ("parameter", name))
    for name, b in model.named_buffers():
        by_id.setdefault(id(b), ("buffer", name))
    for i, t in enumerate(inputs):
        by_id.setdefault(id(t), ("input", _input_name(model, i)))
    names = []
    for t in example_inputs:
        if id(t) not in by_id:
            raise RematError("error: the captured graph takes an input that is neither a parameter, a buffer nor a model input")
        names.append(by_id[id(t)])
    return names


def _input_name(model, index: int) -> str:
    import inspect

    try:
        params = [p for p in inspect.signature(model.forward).parameters.values() if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
        return params[index].name
    except (ValueError, IndexError):
        return f"input_{index}"


def _check_outputs(meta) -> None:
    from torch._functorch._aot_autograd.schemas import OutputType

    if meta.num_intermediate_bases:
        raise RematError("error: the model returns several views of one intermediate tensor", hint="return .clone() of the views")
    for info in meta.output_info:
        if info.output_type not in (OutputType.non_alias, OutputType.alias_of_intermediate_save_as_output):
            raise RematError(
                f"error: a model output is a view of an input or an intermediate ({info.output_type.name})",
                hint="return a fresh tensor (for example `.clone()`) from forward",
            )
