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

import copy
from dataclasses import dataclass

import torch
import torch.fx as fx
import torch.utils._pytree as pytree

from remat_dsl.errors import RematError


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
    if not all(isinstance(t, torch.Tensor) for t in flat):
        raise RematError(
            "error: the model's forward must return a tensor or a tuple/list of tensors",
            hint="wrap the model so forward returns tensors (for HF models return `.logits`)",
        )
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
        compiled = torch.compile(model, backend=backend, fullgraph=True, dynamic=False)
        out = compiled(*inputs)
    except RematError:
        raise
    except Exception as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise RematError(
            f"error: cannot capture the model as one graph: {first}",
            hint="remat-dsl needs a forward without graph breaks (no data-dependent Python control flow, "
            "no prints of tensors); see the PyTorch message above",
        ) from None
    finally:
        torch._dynamo.reset()
    if "backward" not in record:
        raise RematError("error: the model has no parameter that requires a gradient", hint="nothing to plan")
    return out


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
