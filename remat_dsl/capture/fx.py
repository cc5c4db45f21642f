"""Capture the forward and backward graphs of a model's training step.

We compile the model with `torch.compile(..., fullgraph=True)` and an AOTAutograd backend
whose partition function records the forward and backward FX graphs that PyTorch's own
default partition makes: the forward graph returns the buffer updates, the model outputs
and the saved tensors; the backward graph takes the saved tensors and the output
gradients (tangents) and returns one gradient per forward input.  This is the "autograd"
FB-graph: it saves what eager PyTorch saves (the partition's forward outputs after the
model outputs are the saved tensors, the backward's inputs that are not tangents).

The model is deep-copied (unless the caller built it for the capture alone) and the RNG
state restored, so capture changes neither the model's buffers nor the random stream.

NOTE: [Stock models]
Models come as their libraries ship them (Hugging Face, torchvision), so capture takes
the forward's arguments by position and by name (`Inputs`), and any output pytree whose
leaves are tensors: tuples, lists, dicts, named tuples and registered classes such as
Hugging Face's `ModelOutput` (the plan writes them as `dict(loss=%a, ...)` or
`transformers.modeling_outputs.CausalLMOutput(loss=%a, logits=%b)`).  Arguments that are
not tensors (`use_cache=False`) are constants of the captured graph: the plan lists them
(`ConstantInput`) and the generated module refuses a call that passes another value.  A
plan is a training step, so a forward with a `use_cache` parameter that the inputs leave
out is captured with `use_cache=False` (a key/value cache is an inference output), as
Hugging Face's gradient checkpointing runs it, and the plan says so above the constant
(`Captured.defaulted`).  Eagerly with its default `use_cache=True`, a hybrid Mamba model
(Bamba, Jamba, Zamba2, Falcon-H1) takes its mixer's cache path in training too: Bamba's
slices the convolution's output (`[:, :, -seq_len:]`), which makes the gradient flowing
back through it contiguous, and `silu_backward` then rounds other last bits.  One
tensor passed as two arguments (`input_ids=ids, labels=ids`) is captured as two inputs
(the second a copy), so the plan does not assume they are the same tensor.  Logging calls
inside the forward (transformers warns once from inside `forward`) are ignored.
An argument that is a tuple, list or dict of tensors and constants (an LSTM's `(h0, c0)`)
is taken element by element (NOTE: [Nested arguments]).
Hugging Face's output capturing installs its hooks on the first forward that asks for
hidden states (SegFormer's segmentation head does), under a threading lock that dynamo
cannot trace; when a capture fails and the model has such hooks to install, capture
installs them, as transformers' backbones do in `post_init`, and traces once more
(`_output_hooks_installed`; not before the first trace: dynamo would trace the hooks of
every model, which slows every capture: docs/measured-notes.md).
"""

from __future__ import annotations

import ast
import collections
import contextlib
import copy
import functools
import inspect
import logging
import operator
import re
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import torch
import torch.fx as fx
import torch.utils._pytree as pytree

from remat_dsl.capture.checkpoints import direct_sequential, inline_checkpoints
from remat_dsl.capture.keys import NotStatic, node_key, primal_key, primal_keys
from remat_dsl.capture.model_file import Inputs
from remat_dsl.capture.recurrent import recurrent_layers
from remat_dsl.capture.stateful import (
    cumulative_averages,
    cumulative_factors,
    drop_inputs_returned,
    plain_updates,
    recomputed_weights,
)
from remat_dsl.plan.errors import RematError
from remat_dsl.plan.ir import plan_name


@dataclass
class Captured:
    """The FX graphs of one training step and what their placeholders stand for.

    primal_names: for each forward placeholder, ("parameter"|"buffer"|"input", name).
    constants: the forward's non-tensor arguments as captured, (name, value) in call order.
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
    constants: list[tuple[str, None | bool | int | float | str]] = field(default_factory=list)
    defaulted: tuple[str, ...] = ()  # constants capture filled in, that the inputs left out (`use_cache`)
    none_leaves: list[bool] = field(default_factory=list)  # per output leaf: is it None
    graph_key: tuple | None = None  # NOTE: [Capture key]: None when a shape is not static
    order: list[int] = field(default_factory=list)  # NOTE: [Output order]: the graph output each tensor leaf was
    # NOTE: [Cumulative averages] in capture/stateful.py: forward node name -> (the position of
    # its momentum argument, the node whose one-element tensor it reads there)
    averages: dict[str, tuple[int, str]] = field(default_factory=dict)

    @property
    def leaves(self) -> list[int]:
        """NOTE: [Output order]: per tensor leaf, the model output it is (outputs in the
        order leaves first show them)."""
        unique = list(dict.fromkeys(self.order))
        return [unique.index(k) for k in self.order]


def capture(
    model: torch.nn.Module,
    inputs: Inputs,
    portable: str | None = None,
    autocast: torch.dtype | None = None,
    copy_model: bool = True,
    recall: Callable[[tuple], object] | None = None,
) -> Captured | Recalled:
    """Trace `model(*inputs.args, **inputs.kwargs)` and its backward into two FX graphs
    (NOTE: [Stock models]).

    portable: the device kind the plan is for when it is not the capturing one (`cuda`
    for a CUDA plan made on this CPU): scaled-dot-product attention is captured as the
    fused kernel a CUDA device runs (NOTE: [Fused attention] in capture/attention.py), and
    for another kind as its math decomposition (matmuls and a softmax, which every device
    runs), never as this device's own kernel (`_scaled_dot_product_flash_attention_for_cpu`
    has no CUDA kernel).
    autocast: the forward runs under `torch.autocast(device, autocast)` (NOTE: [Autocast]).
    copy_model: False captures `model` itself, not a deep copy: for a caller that built
    the model for this capture alone (its buffers may then hold a forward's updates, and the
    example primals are its own tensors); it saves copying every parameter.
    recall: NOTE: [Capture key]: called with the key of dynamo's graph (`Captured.graph_key`)
    before AOTAutograd runs; what it returns, unless None, is returned as `Recalled`
    without tracing the backward (nothing is run either).

    Raises RematError when the model cannot be captured as one graph (graph breaks,
    unsupported outputs or arguments), with the reason PyTorch gave.
    """
    model = copy.deepcopy(model) if copy_model else model
    given = inputs
    inputs = training_defaults(model, inputs)
    defaulted = tuple(name for name in inputs.kwargs if name not in given.kwargs)
    named = _distinct_tensors(model, _named_arguments(model, inputs))
    flat = flat_arguments(named)  # NOTE: [Nested arguments]
    constants = [(name, value) for name, value in flat if value is None or isinstance(value, (bool, int, float, str))]
    count = len(inputs.args)
    call = Inputs(tuple(value for _, value in named[:count]), dict(named[count:]))
    tensors = {id(value): name for name, value in flat if isinstance(value, torch.Tensor)}
    record: dict = {}

    def lookup(gm, example_inputs):  # NOTE: [Capture key]: what `recall` gives for dynamo's graph
        try:
            names = _primal_names(model, example_inputs, tensors)
        except RematError:  # raised again, as the capture's error, once AOTAutograd has run
            return None
        key = record["graph_key"] = _graph_key(gm, example_inputs, names, (constants, defaulted), portable, autocast)
        return recall(key) if key is not None else None

    with torch.random.fork_rng(devices=cuda_devices(call.leaves())):
        with _portable_attention(portable), _autocast(call.leaves(), model, autocast):
            with (
                _eager_branches(model, named),
                _native_kernels(),
                recomputed_weights(model),
                cumulative_averages(model) as sentinels,  # NOTE: [Cumulative averages] in capture/stateful.py
            ):
                trace = functools.partial(
                    _compile_and_run, model, call, record, not portable, lookup if recall is not None else None
                )
                try:
                    out = trace()
                except RematError:
                    if not _output_hooks_installed(model):  # NOTE: [Stock models]: a failure they do not explain
                        raise
                    record.clear()
                    out = trace()
    _check_output_leaves(out)
    flat, spec = pytree.tree_flatten(out)
    order = _output_order(out, record.get("returned"), model)
    if "recalled" in record:
        return Recalled(record["recalled"], repr(spec), [leaf is None for leaf in flat], order)
    if "backward" not in record:
        raise RematError("error: the model has no parameter that requires a gradient", hint="nothing to plan")
    names = _primal_names(model, record["example_inputs"], tensors)
    meta = record["meta"]
    mutated = [i for i, info in enumerate(meta.input_info) if info.mutates_data]
    plain_updates(record["forward"], len(mutated))  # NOTE: [Stateful layers] in capture/stateful.py
    averages = cumulative_factors(record["forward"], record["backward"], record["example_inputs"], sentinels)
    _check_outputs(meta)
    unique = list(dict.fromkeys(order))  # the graph's outputs in the order the leaves first show them
    _reorder_outputs(record["forward"], len(mutated), unique)
    for gm in (record["forward"], record["backward"]):
        _inline_constants(gm)
    tangent_of = [unique.index(d.output.idx) for d in meta.traced_tangents_descs]
    return Captured(
        forward=record["forward"],
        backward=record["backward"],
        primal_names=names,
        mutated=mutated,
        num_outputs=len(meta.output_info),
        tangent_of=tangent_of,
        out_spec=spec,
        example_primals=list(record["example_inputs"]),
        constants=constants,
        defaulted=defaulted,
        none_leaves=[leaf is None for leaf in flat],
        graph_key=record.get("graph_key"),
        order=order,
        averages=averages,
    )


@dataclass(frozen=True)
class Recalled:
    """What `capture`'s `recall` returned for dynamo's graph (NOTE: [Capture key]), with
    the model output's structure as this run made it (`repr` of its pytree spec, per leaf
    whether it is None, and which graph output each tensor leaf is: NOTE: [Output order]):
    the caller compares them with what it stored."""

    value: Any  # the cache's JSON entry, as `recall` returned it
    out_spec: str
    none_leaves: list[bool]
    order: list[int]  # NOTE: [Output order]


# NOTE: [Capture key]
# Without a key, a warm `remat plan` (another budget, the profile and block solutions in
# the cache) would trace the model with dynamo and then its joint forward and backward
# with AOTAutograd, a fifth of its time on a Llama decoder (docs/measured-notes.md).
# AOTAutograd's graphs are a function of dynamo's graph, its example inputs and our
# settings, so the key of the whole FB-graph can be made before AOTAutograd runs:
# every node of dynamo's graph (op, name, target, arguments, module stacks, the layout of
# its example value), the example inputs' layouts, `requires_grad`, shared storages and
# integer values (as NOTE: [Profile key] in pipeline.py takes them), the bytes of the
# graph's tensor attributes (constants it folds in), the names plan inputs get, the
# non-tensor arguments, and the capture settings (portable attention, autocast).  The
# caller (`capture_graph`) adds what else the built graph depends on (torch, the machine,
# this package's capture code) and looks the key up: on a hit, dynamo's compiled forward
# returns empty outputs of the traced layouts (as NOTE: [Capture without running] does)
# and capture returns `Recalled` without running AOTAutograd.  The output object's
# structure is built by dynamo outside the graph, so it comes back with the hit and is
# compared with the stored one.  Dynamic or data-dependent shapes give no key.


def _graph_key(gm: fx.GraphModule, example_inputs, names, constants, portable: str | None, autocast) -> tuple | None:
    """NOTE: [Capture key]: what AOTAutograd's graphs of dynamo's `gm` depend on, as a
    tuple with a canonical repr, or None when a shape is not static."""
    try:
        nodes = tuple(node_key(node, "example_value") for node in gm.graph.nodes)
        primals = primal_keys(example_inputs)
        attributes = []
        for node in gm.graph.nodes:
            if node.op == "get_attr":
                value = functools.reduce(getattr, node.target.split("."), gm)
                held = primal_key(value, 0, values=True) if isinstance(value, torch.Tensor) else repr(value)
                attributes.append((node.target, held))
    except NotStatic:
        return None
    return ("dynamo graph", names, repr(constants), portable, str(autocast), primals, nodes, tuple(attributes))


def named_inputs(model, inputs: Inputs) -> list[tuple[str, object]]:
    """The arguments capture names, as it names them: (name, value) in call order, each
    container's leaves in its place (NOTE: [Nested arguments])."""
    return flat_arguments(_named_arguments(model, training_defaults(model, inputs)))


def _inline_constants(gm: fx.GraphModule) -> None:
    """A tensor constant in the forward is a graph attribute: T5's relative positions make
    `torch.tensor(0)`, Falcon's `fused_qkv[..., [-2], :]` an index tensor `tensor([-2])`.
    Each becomes the call that makes it (NOTE: [Constant tensors]), so that every op of
    the plan is a call.  Raises RematError for a constant no call makes."""
    for node in list(gm.graph.nodes):
        if node.op != "get_attr":
            continue
        value = getattr(gm, node.target)
        call = _constant_call(value)
        if call is None:
            shape = list(value.shape) if isinstance(value, torch.Tensor) else type(value).__name__
            raise RematError(
                f"{model_line(node)}error: the model's forward creates a constant tensor {shape} that no one aten call"
                " makes again; remat-dsl plans constants that `full` (all values equal), `arange` (a 1-D integer"
                f" range) or `scalar_tensor` make, contiguous, of at most {MAX_CONSTANT_ELEMENTS:,} elements",
                hint="register the constant as a buffer of the module (register_buffer) and use it from there",
            )
        with gm.graph.inserting_before(node):
            made = gm.graph.call_function(*call)
        users = list(node.users)
        made.meta.update(
            {
                k: v
                for k, v in (users[0].meta if users else node.meta).items()
                if k in ("nn_module_stack", "fwd_nn_module_stack", "stack_trace")
            }
        )
        made.meta["val"] = node.meta.get("val")
        node.replace_all_uses_with(made)
        gm.graph.erase_node(node)
    gm.graph.lint()
    gm.recompile()


MAX_CONSTANT_ELEMENTS = 1 << 16  # NOTE: [Constant tensors]: larger constants are refused, not compared


def _constant_call(value) -> tuple | None:
    """(target, args, kwargs) of the aten call that makes the constant tensor `value` again
    (NOTE: [Constant tensors]): same dtype, device, shape, strides and bytes; or None."""
    if not isinstance(value, torch.Tensor) or value.requires_grad or value.layout != torch.strided:
        return None
    if value.numel() > MAX_CONSTANT_ELEMENTS or not value.is_contiguous() or value.is_complex():
        return None
    aten = torch.ops.aten
    flat = value.detach().cpu().reshape(-1)
    place = {"dtype": value.dtype, "device": value.device}
    candidates: list[tuple[torch._ops.OpOverload, tuple, dict[str, object]]] = []
    if value.dim() == 0:
        candidates.append((aten.scalar_tensor.default, (flat[0].item(),), place))
    elif flat.numel():
        candidates.append((aten.full.default, (list(value.shape), flat[0].item()), {**place, "pin_memory": False}))
        if value.dim() == 1 and flat.numel() > 1 and not (value.is_floating_point() or value.dtype == torch.bool):
            start, step = flat[0].item(), (flat[1] - flat[0]).item()
            if step:
                end = start + step * flat.numel()
                candidates.append((aten.arange.start_step, (start, end, step), {**place, "pin_memory": False}))
    for target, args, kwargs in candidates:
        try:
            made = target(*args, **{**kwargs, "device": "cpu"})
        except (RuntimeError, OverflowError):  # an integer range past its dtype's bounds
            continue
        if made.shape == value.shape and made.stride() == value.stride() and _same_bytes(made, flat):
            return target, args, kwargs
    return None


def _same_bytes(made: torch.Tensor, flat: torch.Tensor) -> bool:
    """Whether `made` holds the bytes of the contiguous cpu tensor `flat` (-0.0 is not 0.0)."""
    if made.dtype != flat.dtype or made.numel() != flat.numel():
        return False
    return torch.equal(made.reshape(-1).view(torch.uint8), flat.view(torch.uint8))


# NOTE: [Constant tensors]
# Dynamo folds a tensor the forward makes from Python values (`torch.tensor(0)`, the index
# tensor of `x[..., [-2], :]`) into a graph attribute, and AOTAutograd keeps it as one.  A
# plan has no tensor literal: every tensor is an op's output or an input.  So a constant
# becomes the one aten call that makes it again, with its dtype and device: 0-dim ones
# `aten.scalar_tensor(value)`, ones whose values are all equal `aten.full(shape, value)`,
# 1-D integer ones that count in steps `aten.arange(start, end, step)`.  Each gives a
# contiguous tensor, so only contiguous constants (of at most MAX_CONSTANT_ELEMENTS) are
# taken, and `_constant_call` checks the values it would make; any other constant is
# refused at the model line that made it.  (Such constants are in the cache key by value:
# NOTE: [Capture key].)


def _model_frames(node: fx.Node) -> list[tuple[str, str]]:
    """(file, line) of the frames outside torch that made `node`, outermost first."""
    frames = re.findall(r'File "([^"]+)", line (\d+)', node.meta.get("stack_trace") or "")
    return [f for f in frames if not f[0].startswith(str(Path(torch.__file__).parent))]


def model_line(node: fx.Node) -> str:
    """`FILE:LINE: ` of the model's innermost frame (outside torch) that made `node`, or ''."""
    frames = _model_frames(node)
    return f"{frames[-1][0]}:{frames[-1][1]}: " if frames else ""


def training_defaults(model, inputs: Inputs) -> Inputs:
    """`use_cache=False` when the forward takes `use_cache` and the inputs leave it out
    (NOTE: [Stock models])."""
    if not _takes_use_cache(model) or "use_cache" in inputs.kwargs:
        return inputs
    bound = _bind(model, inputs)
    if bound is not None and "use_cache" in bound.arguments:
        return inputs
    return Inputs(inputs.args, {**inputs.kwargs, "use_cache": False})


def _takes_use_cache(model) -> bool:
    """Whether `model.forward` takes `use_cache`, itself or through `**kwargs` to the model it
    wraps (peft's `PeftModel.get_base_model()`)."""
    try:
        parameters = inspect.signature(model.forward).parameters
    except (TypeError, ValueError):
        return False
    if "use_cache" in parameters:
        return True
    passes_on = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values())
    base = getattr(model, "get_base_model", None)
    return passes_on and callable(base) and base() is not model and _takes_use_cache(base())


# NOTE: [Eager branches]
# A library may take another path while it is traced than when it runs eagerly, where the
# eager path reads tensor values that a trace cannot.  The plan must compute what eager
# PyTorch computes, bit for bit, so capture takes the eager path where it knows it without
# the values.  One case so far: Hugging Face's masking utilities (transformers 5) look for
# packed sequences in `position_ids` when no attention mask is given; eagerly they find
# none in positions the model made itself (consecutive: an arange) and leave the causal
# mask to SDPA (`is_causal`, and key/value heads shared inside the kernel, `enable_gqa`),
# while traced they keep an explicit mask and repeat the key/value heads, which sums the
# shared heads' gradients in another order: a Llama with grouped-query attention (4 x 128
# tokens) trained with gradients differing in the last bits.  So when the forward takes
# `position_ids` and the inputs do not give them, `find_packed_sequence_indices` answers
# None during capture, as it does eagerly for those positions (the generated module
# refuses a call that passes `position_ids`: the plan was made without that argument).
# Another: Hugging Face's audio encoders (Wav2Vec2, HuBERT, WavLM, Data2VecAudio and the
# others built on Wav2Vec2's feature encoder) set `requires_grad = True` on their input
# waveform in training mode, for gradient checkpointing; dynamo refuses that.  Eagerly it
# only makes autograd compute the waveform's gradient, which nobody reads: the parameters'
# gradients are the same without it (a stock Wav2Vec2 trains bit for bit).  So capture
# traces the encoder as `_freeze_parameters` leaves it (`_requires_grad` False; its
# parameters keep their `requires_grad`), and the plan computes no waveform gradient.
# A third: Hugging Face's Mamba mixers (Mamba, Jamba, Zamba) without their CUDA kernels
# scan the sequence with `associative_scan` when traced (`use_associative_scan`, on by
# default) and with a loop over its positions eagerly: a stock Mamba trained with every
# gradient differing in the last bits.  Capture traces the loop (`use_associative_scan`
# False on those modules), one set of ops per position, as eager runs it.


def _output_hooks_installed(model) -> bool:
    """Install Hugging Face's output-capturing hooks on each of the model's `PreTrainedModel`s
    that has none (NOTE: [Stock models]); whether any was installed (never for other models)."""
    import sys

    capturing = sys.modules.get("transformers.utils.output_capturing")
    install = getattr(capturing, "maybe_install_capturing_hooks", None)
    base = getattr(sys.modules.get("transformers.modeling_utils"), "PreTrainedModel", None)
    if install is None or base is None:
        return False
    installed = False
    for module in model.modules():
        if isinstance(module, base) and not getattr(module, "_output_capturing_hooks_installed", False):
            install(module)  # it marks the model, and the models inside it, hooked
            installed = True
    return installed


@contextlib.contextmanager
def _eager_branches(model, named: list[tuple[str, object]]):
    """NOTE: [Eager branches]: during capture, the eager answers of library checks that read
    tensor values, where they do not depend on the inputs' values."""
    import sys

    encoders = [
        m for m in model.modules() if getattr(m, "_requires_grad", None) is True and hasattr(m, "_freeze_parameters")
    ]
    for encoder in encoders:  # the audio feature encoders: their input needs no gradient here
        encoder._requires_grad = False
    scans = [m for m in model.modules() if getattr(m, "use_associative_scan", None) is True]
    for mixer in scans:  # Mamba's mixers: the loop eager runs
        mixer.use_associative_scan = False
    masking = sys.modules.get("transformers.masking_utils")
    original = getattr(masking, "find_packed_sequence_indices", None)
    try:
        takes_positions = "position_ids" in inspect.signature(model.forward).parameters
    except (TypeError, ValueError):
        takes_positions = False
    patch = original is not None and takes_positions and not any(name == "position_ids" for name, _ in named)
    if patch:
        setattr(masking, "find_packed_sequence_indices", lambda position_ids: None)  # consecutive positions: no packing
    try:
        yield
    finally:
        if patch:
            setattr(masking, "find_packed_sequence_indices", original)
        for encoder in encoders:
            encoder._requires_grad = True
        for mixer in scans:
            mixer.use_associative_scan = True


def _bind(model, inputs: Inputs):
    try:
        return inspect.signature(model.forward).bind(*inputs.args, **inputs.kwargs)
    except (TypeError, ValueError):
        return None


def _named_arguments(model, inputs: Inputs) -> list[tuple[str, object]]:
    """Each argument with the name the generated module binds it by: the forward's parameter
    name for positional ones (`input_N` when it has none), the key for keyword ones.
    Raises RematError for arguments that are neither tensors nor plain constants."""
    bound = _bind(model, inputs)
    if bound is None:
        raise RematError(
            f"error: sample_inputs() does not match the model's forward{_signature_text(model)}",
            hint="return the arguments forward takes, by position (a tuple) or by name (a dict)",
        )
    named: list[tuple[str, object]] = []
    positional = [
        n
        for n, p in inspect.signature(model.forward).parameters.items()
        if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
    ]
    for index, value in enumerate(inputs.args):
        named.append((positional[index] if index < len(positional) else f"input_{index}", value))
    named += list(inputs.kwargs.items())
    for name, value in named:
        _check_argument(name, value)
    return named


# NOTE: [Nested arguments]
# Models take some arguments as containers: an LSTM language model its state `(h0, c0)`, a
# model its batch as a dict.  Capture takes a tuple, list or dict (nested too) whose leaves
# are tensors and constants, and names each leaf after the argument and its place:
# `hidden.0`, `hidden.1`, `batch.ids` (`flat_arguments`).  Each leaf is then a plan input or
# constant of its own, and the generated module flattens the arguments of a call the same
# way (`_flat_arguments` in remat_dsl/codegen/runtime.py), so a call with another structure
# (a 3-tuple, another key) is refused by name.  A dict key must be a plan name's part:
# letters, digits and `_`.
_KEY = re.compile(r"[A-Za-z0-9_]+")


def flat_arguments(named: list[tuple[str, object]]) -> list[tuple[str, object]]:
    """Each argument's leaves as (name, value), NOTE: [Nested arguments]: a tuple's or a
    list's elements named `NAME.INDEX`, a dict's `NAME.KEY`, nested containers in turn."""
    flat: list[tuple[str, object]] = []
    for name, value in named:
        if isinstance(value, dict):
            flat += flat_arguments([(f"{name}.{key}", item) for key, item in value.items()])
        elif isinstance(value, (tuple, list)):
            flat += flat_arguments([(f"{name}.{index}", item) for index, item in enumerate(value)])
        else:
            flat.append((name, value))
    return flat


def _check_argument(name: str, value) -> None:
    """Raise RematError unless `value` is a tensor, a constant or a container of them."""
    if isinstance(value, torch.Tensor) or value is None or type(value) in (bool, int, float, str):
        return
    if isinstance(value, dict):
        for key, item in value.items():
            if not (isinstance(key, str) and _KEY.fullmatch(key)):
                raise RematError(
                    f"error: argument '{name}' is a dict with the key {key!r}; remat-dsl names each element"
                    f" '{name}.KEY', with KEY made of letters, digits and `_`",
                    hint="rename the key, or pass the element as its own argument of forward",
                )
            _check_argument(f"{name}.{key}", item)
        return
    if isinstance(value, (tuple, list)):
        for index, item in enumerate(value):
            _check_argument(f"{name}.{index}", item)
        return
    raise RematError(
        f"error: argument '{name}' is {_kind(value)}; arguments must be tensors, constants (None, bool, int,"
        " float, str), or tuples, lists and dicts of them",
        hint="pass its tensors as arguments of their own, or leave the argument out of sample_inputs()",
    )


def _signature_text(model) -> str:
    try:
        return f" {inspect.signature(model.forward)}"
    except (TypeError, ValueError):
        return ""


def _distinct_tensors(model, named: list[tuple[str, object]]) -> list[tuple[str, object]]:
    """The named arguments with every tensor its own object: a tensor passed twice is copied
    (inside containers too), and a parameter or buffer passed as an argument is refused."""
    owned = {id(t) for t in (*model.parameters(), *model.buffers())}
    seen: set[int] = set()

    def distinct(name: str, value):
        if isinstance(value, dict):
            return type(value)((key, distinct(f"{name}.{key}", item)) for key, item in value.items())
        if isinstance(value, (tuple, list)):
            items = [distinct(f"{name}.{index}", item) for index, item in enumerate(value)]
            return type(value)(*items) if hasattr(value, "_fields") else type(value)(items)
        if not isinstance(value, torch.Tensor):
            return value
        if id(value) in owned:
            raise RematError(
                f"error: argument '{name}' is one of the model's own parameters or buffers",
                hint="pass data, not the model's state",
            )
        if id(value) in seen:
            value = value.clone()
        seen.add(id(value))
        return value

    return [(name, distinct(name, value)) for name, value in named]


def _check_output_leaves(out) -> None:
    """Every leaf of the output pytree is a tensor or None, and one at least is a tensor."""
    leaves, _ = pytree.tree_flatten_with_path(out)
    if not any(isinstance(leaf, torch.Tensor) for _, leaf in leaves):
        raise RematError(
            f"error: the model's forward returns {_kind(out)}, with no tensor in it",
            hint="return the output tensors (a tensor, or a tuple, dict or dataclass of them)",
        )
    for path, leaf in leaves:
        if not isinstance(leaf, torch.Tensor) and leaf is not None:
            where = "output" + pytree.keystr(path)
            hint = "remat-dsl plans a training step: return tensors (a tuple, dict or dataclass of them)"
            if "cache" in type(leaf).__name__.lower() or "past_key_values" in where:
                hint = "pass use_cache=False in sample_inputs(): a key/value cache is an inference output"
            raise RematError(f"error: the model's forward returns {_kind(leaf)} at {where}, not a tensor", hint=hint)


def _kind(value) -> str:
    return "None" if value is None else f"a {type(value).__name__}"


@contextlib.contextmanager
def _native_kernels():
    """NOTE: [Native kernels]: during capture, the aten ops of NATIVE_KERNELS dispatch as in
    eager PyTorch, not to the Python decompositions torch registers for tracing."""
    from torch._C import DispatchKey

    ops = _native_kernel_ops()
    keys = (DispatchKey.CompositeImplicitAutograd, DispatchKey.Autograd)
    taken = [(op, key, op.py_kernels.pop(key)) for op in ops for key in keys if key in op.py_kernels]
    for op in ops:
        op._dispatch_cache.clear()
    try:
        yield
    finally:
        for op, key, kernel in taken:
            op.py_kernels[key] = kernel
        for op in ops:
            op._dispatch_cache.clear()


NATIVE_KERNELS = ("upsample_bilinear2d", "upsample_bicubic2d", "upsample_linear1d", "upsample_trilinear3d",
                  "upsample_nearest1d", "upsample_nearest2d", "upsample_nearest3d")  # fmt: skip


# NOTE: [Native kernels]
# AOTAutograd traces with the Python dispatcher on, and torch registers Python kernels
# (torch._decomp) for the upsampling ops at its CompositeImplicitAutograd and Autograd keys:
# traced, `F.interpolate(mode="bilinear")` became `_unsafe_index` gathers, multiplies and
# adds, whose backward scatters with `index_put(accumulate=True)`; eagerly it is one
# `upsample_bilinear2d` with its own backward kernel.  SegFormer's plan (and every plan of
# a model that upsamples) trained with gradients differing in the last bits.  So while
# capturing, those Python kernels of NATIVE_KERNELS are taken off (and put back after):
# the graph holds `upsample_bilinear2d` and `upsample_bilinear2d_backward`, as eager runs
# them (tests/models/constants_upsample.py).  Other ops with such Python kernels
# (matmul, batch norm, ...) gave eager's bits in every model tested and are left alone.


def _native_kernel_ops() -> list[torch._ops.OpOverload]:
    ops: list[torch._ops.OpOverload] = []
    for name in NATIVE_KERNELS:
        packet = getattr(torch.ops.aten, name)
        ops.extend(getattr(packet, overload) for overload in packet.overloads())
    return ops


def _portable_attention(kind: str | None):
    """How attention is captured for a plan of device kind `kind` made on another kind
    (None: the capturing device's own choice)."""
    if kind is None:
        return contextlib.nullcontext()
    if kind == "cuda":
        from remat_dsl.capture.attention import cuda_attention

        return cuda_attention()
    from torch.nn.attention import SDPBackend, sdpa_kernel

    return sdpa_kernel([SDPBackend.MATH])


# NOTE: [Autocast]
# A model trained under `torch.autocast(device, dtype)` is captured under it: dynamo traces
# the ambient autocast state and AOTAutograd applies it while tracing, so the forward graph
# holds every cast autocast makes (`_to_copy(w, dtype=torch.bfloat16)` before an `addmm`)
# and the tensors their real dtypes and sizes.  The backward is traced with autocast off,
# as eager runs it when `loss.backward()` is called after the autocast region (PyTorch's
# AMP recipe); AOTAutograd's default would trace it under autocast, casting the float32
# matmuls of attention's math path to bfloat16.  So every cast is an op of the plan: the
# generated module runs forward and backward with autocast off (applying it a second time
# could cast again) and gives the eager autocast step bit for bit, dropout included (NOTE:
# [Low-precision dropout]).  The plan's header records the dtype (`autocast  bfloat16`,
# ir.Autocast), sealed by the digest, and the module refuses a training call under
# another autocast state than the plan's (the template's `_check_autocast`).

# `remat plan --autocast` spellings -> torch dtype names (ir.AUTOCAST_DTYPES)
AUTOCAST_FLAGS = {"bf16": "bfloat16", "bfloat16": "bfloat16", "fp16": "float16", "float16": "float16"}


def forward_autocast(values, model, dtype: torch.dtype | None):
    """`torch.autocast` on the device kind of the model's parameters (or inputs), or nothing."""
    if dtype is None:
        return contextlib.nullcontext()
    tensors = [t for t in (*model.parameters(), *values) if isinstance(t, torch.Tensor)]
    return torch.autocast(tensors[0].device.type if tensors else "cpu", dtype=dtype)


def _autocast(values, model, dtype: torch.dtype | None):
    """`forward_autocast`, with the backward traced without autocast, as eager runs it."""
    if dtype is None:
        return contextlib.nullcontext()
    import torch._functorch.config  # imported lazily by torch.compile, which has not run yet

    stack = contextlib.ExitStack()
    stack.enter_context(forward_autocast(values, model, dtype))
    # the backward is traced as `loss.backward()` runs after the autocast region: autocast off
    stack.enter_context(torch._functorch.config.patch(backward_pass_autocast="off"))
    return stack


# NOTE: [Low-precision dropout]
# Eager PyTorch runs dropout on the CPU as `input * noise`, with `noise =
# empty_like(input).bernoulli_(1 - p).div_(1 - p)` in the input's dtype (ATen's
# `_dropout_impl`; the fused `native_dropout` serves CUDA only), and its backward is
# `grad * noise`.  Tracing decomposes dropout into `native_dropout`, which scales by
# 1 / (1 - p) in float, and `native_dropout_backward(grad, mask, scale)`: the same draws,
# the same values in float32, but in bfloat16 or float16 the scale rounds differently
# (1 / 0.9 is 1.109375 in bfloat16), so an autocast plan would not give the eager step.
# On a CPU plan, a `native_dropout` of a low-precision input is captured as eager runs it:
# `bernoulli.p` (the draws), `div.Scalar`, `mul.Tensor`, and its backward as `mul.Tensor`
# of the gradient and the noise (saved, in the input's dtype, as eager saves it).
LOW_PRECISION = (torch.bfloat16, torch.float16)
LOW_PRECISION_HINT = "run dropout as torch.nn.functional.dropout (no mask to read), or plan without --autocast"


def _eager_cpu_dropout(joint: fx.GraphModule) -> None:
    """Rewrite the joint graph's low-precision CPU `native_dropout`s as eager runs them
    (NOTE: [Low-precision dropout])."""
    from torch._guards import detect_fake_mode

    aten = torch.ops.aten
    changed = False
    for node in list(joint.graph.nodes):
        if node.target is not aten.native_dropout.default:
            continue
        x, p = node.args[0], node.args[1]
        value = x.meta.get("val")
        if value is None or value.device.type != "cpu" or value.dtype not in LOW_PRECISION or not 0 < p < 1:
            continue
        mode = detect_fake_mode([value])

        def call(target, args, like):
            with joint.graph.inserting_before(like):
                made = joint.graph.call_function(target, args)
            made.meta.update({k: v for k, v in like.meta.items() if k != "val"})
            with mode:
                made.meta["val"] = target(*[a.meta["val"] if isinstance(a, fx.Node) else a for a in args])
            return made

        order = _memory_order(value)
        if order is None:
            noise = call(aten.bernoulli.p, (x, 1 - p), node)
        else:  # NOTE: [Draws in memory order]
            drawn = call(aten.bernoulli.p, (call(aten.permute.default, (x, order), node), 1 - p), node)
            noise = call(aten.permute.default, (drawn, [order.index(d) for d in range(len(order))]), node)
        scaled = call(aten.div.Scalar, (noise, 1 - p), node)
        out = call(aten.mul.Tensor, (x, scaled), node)
        for user in list(node.users):
            if user.target is not operator.getitem:
                raise RematError(
                    "error: a native_dropout output is used whole; remat-dsl captures low-precision CPU dropout as"
                    " eager runs it (NOTE: [Low-precision dropout]) and cannot here",
                    hint=LOW_PRECISION_HINT,
                )
            if user.args[1] == 0:
                user.replace_all_uses_with(out)
                continue
            for backward in [u for u in user.users if u.target is aten.native_dropout_backward.default]:
                backward.replace_all_uses_with(call(aten.mul.Tensor, (backward.args[0], scaled), backward))
                joint.graph.erase_node(backward)
            if user.users:
                raise RematError(
                    "error: a dropout mask is used beyond its backward; remat-dsl captures low-precision CPU dropout as"
                    " eager runs it (NOTE: [Low-precision dropout]) and cannot here",
                    hint=LOW_PRECISION_HINT,
                )
        for user in list(node.users):
            joint.graph.erase_node(user)
        joint.graph.erase_node(node)
        changed = True
    if changed:
        joint.graph.lint()
        joint.recompile()


# NOTE: [Draws in memory order]
# Eager's noise is `empty_like(input)`, which keeps the strides of a dense input, and
# `bernoulli_` fills it in memory order; `bernoulli.p` draws into a contiguous tensor, in
# the order of its indices.  For a transposed input the two put the same draws at other
# places: WavLM's attention output (`out_proj(...).transpose(0, 1)`, bfloat16 under
# autocast) was dropped out with other masks than eager's, and its loss differed.  So for
# a dense input whose memory order is not its index order, the draws are made into the
# input permuted to memory order and permuted back (two views of the plan), which puts
# each draw where eager puts it.


def _memory_order(value: torch.Tensor) -> list[int] | None:
    """NOTE: [Draws in memory order]: the permutation of `value`'s dims that makes it
    contiguous, when it is not contiguous already and one does (it is dense and does not
    overlap itself), else None (`empty_like` gives other tensors contiguous strides)."""
    if value.is_contiguous():
        return None
    # by stride, largest first; size-1 dims hold no order: last, where they change nothing
    order = sorted(range(value.dim()), key=lambda d: (value.size(d) == 1, -value.stride()[d], d))
    return order if value.permute(order).is_contiguous() else None


# NOTE: [Discarded draws]
# Eager PyTorch runs every op of the forward, also those whose results nothing reads:
# CANINE's classifier reads the deep encoder's pooled output, and its final character
# encoder, dropout included, runs for a sequence output the loss discards.  Each dropout
# there draws from the generator, so the classifier's own dropout, drawn after them, gets
# other numbers.  Tracing drops dead code, random ops too (dynamo and AOTAutograd treat a
# random op as pure unless `torch._inductor.config.fallback_random` is set, and the
# partitioner's forward keeps only what the outputs and the backward need), and the plan
# trained with other dropout masks than eager, silently (a loss 0.03 off on CANINE).
# Capture therefore traces with `fallback_random` (set in `_compile_and_run`), so the
# joint graph keeps every random op and what it reads, and puts those the partitioner left
# out (`_discarded_draws`) back into the forward graph at their places in the joint
# graph's order (`_keep_discarded_draws`): the plan runs them as eager does, the
# generator advances as eagerly, and their results are deleted as soon as they are made.
# The partitioner itself runs without `fallback_random`: with it, the backward graph kept
# the forward's dropouts and recomputed what they read (GPT-2's attention scores).


# NOTE: [Data reads]
# A forward may read a Python number from a tensor: `.item()`, `bool(tensor)`, or a data
# check that dynamo keeps in the graph, as transformers' `torch_compilable_check` does
# with `torch._check_tensor_all` (Llava's count of image tokens).  Each is an
# `aten._local_scalar_dense` in the joint graph, and the step's Python then depends on the
# data.  Or it may make a tensor whose size depends on the data: GLPN's depth loss indexes
# its prediction with a boolean mask (`pred[target > 0]`), a tensor of u0 elements.  A plan
# cannot schedule either (it fixes every op and every tensor's size before the step runs),
# and they failed later, in others' words: AOTAutograd's runtime said "expected all
# symint_outs to be int/float/SymInt/SymFloat" (no model line), and profiling said that
# `aten.sym_size.int` "returns a int".  So capture refuses the first such op at the
# model's line, with the line that called it.


DATA_READ_HINT = (
    "a Python number read from a tensor (`.item()`, `bool(tensor)`, a data check such as `torch._check_tensor_all`) "
    "makes the step depend on the data; compute with tensors instead, or leave the check out of the forward "
    "(transformers leaves its own checks out with TRANSFORMERS_DISABLE_TORCH_CHECK=1)"
)


def _refuse_data_reads(joint: fx.GraphModule) -> None:
    """NOTE: [Data reads]: raise RematError at the first op that reads a number from a
    tensor (`aten._local_scalar_dense`) or makes a tensor of a data-dependent size (an
    unbacked symbolic size), naming the model's line and its caller."""
    from torch.fx.experimental.symbolic_shapes import free_unbacked_symbols

    def caller(node):
        frames = _model_frames(node)
        return f" (called from {frames[-2][0]}:{frames[-2][1]})" if len(frames) > 1 else ""

    for node in joint.graph.nodes:
        if node.op != "call_function":
            continue
        if node.target is torch.ops.aten._local_scalar_dense.default:
            raise RematError(
                f"{model_line(node)}error: the forward reads a number from a tensor{caller(node)}, which remat-dsl"
                " cannot schedule",
                hint=DATA_READ_HINT,
            )
        value = node.meta.get("val")
        if isinstance(value, torch.Tensor) and free_unbacked_symbols(value):
            raise RematError(
                f"{model_line(node)}error: operation {node.target} makes a tensor whose size depends on the data "
                f"({list(value.shape)}){caller(node)}, which remat-dsl cannot plan",
                hint="a plan fixes every tensor's size before the step runs; boolean-mask indexing (`x[mask]`), "
                "`nonzero` and `masked_select` give sizes that depend on the values: use `torch.where(mask, x, 0)` "
                "and sums weighted by the mask instead",
            )


def _discarded_draws(joint: fx.GraphModule) -> list[fx.Node]:
    """NOTE: [Discarded draws]: the forward nodes of `joint` that only feed random ops whose
    results nothing reads, with those random ops, in graph order.  A multi-output random
    op without users gets a `getitem` user (dropped again with the rest) so that the
    partitioner, which takes a node without getitem users for a tensor, accepts it."""
    live: set[fx.Node] = set()
    for node in reversed(joint.graph.nodes):
        if node.op == "output" or any(user in live for user in node.users):
            live.add(node)
    draws = [
        n
        for n in joint.graph.nodes
        if n not in live and n.op == "call_function" and getattr(n.target, "_nondeterministic_seeded", False)
    ]
    if not draws:
        return []
    needed: set[fx.Node] = set()
    todo = list(draws)
    while todo:
        node = todo.pop()
        if node in needed or node in live:
            continue
        needed.add(node)
        todo.extend(node.all_input_nodes)
    if any(n.op == "placeholder" and n.name.startswith("tangents") for n in needed):  # a draw the forward cannot run
        raise RematError(
            "error: the backward draws random numbers for a result nothing reads; the generated module could not "
            "advance the generator as eager PyTorch does",
            hint="make the draw's result part of the loss or of the output, or remove it",
        )
    for node in draws:
        if isinstance(node.meta.get("val"), (tuple, list)) and not node.users:
            with joint.graph.inserting_after(node):
                joint.graph.call_function(operator.getitem, (node, 0)).meta["val"] = node.meta["val"][0]
    return [n for n in joint.graph.nodes if n in needed]


def _keep_discarded_draws(joint: fx.GraphModule, fw: fx.GraphModule, discarded: list[fx.Node]) -> None:
    """NOTE: [Discarded draws]: copy the `discarded` nodes of `joint` into the forward graph
    `fw`, each before the first forward node that follows it in `joint`'s order."""
    if not discarded:
        return
    by_name = {n.name: n for n in fw.graph.nodes}
    env = {n: by_name[n.name] for n in joint.graph.nodes if n.name in by_name}
    anchor, anchors = fw.graph.output_node(), {}
    for node in reversed(joint.graph.nodes):  # for each node, the first forward op after it
        anchors[node] = anchor
        if node in env and env[node].op == "call_function":
            anchor = env[node]
    for node in discarded:  # in graph order: copies before one anchor keep that order
        if node not in env:
            with fw.graph.inserting_before(anchors[node]):
                env[node] = fw.graph.node_copy(node, lambda n: env[n])
    fw.graph.lint()
    fw.recompile()


def cuda_devices(values) -> list[int]:
    return sorted({t.device.index or 0 for t in values if isinstance(t, torch.Tensor) and t.is_cuda})


def _compile_and_run(model, inputs, record, eager_dropout: bool = True, lookup=None):
    """Run `inputs.call` on `model` compiled with dynamo and our AOTAutograd backend, which
    leaves the forward and backward graphs in `record`.  `lookup(gm, example_inputs)`: for
    dynamo's graph, what to return instead of tracing the backward (None: trace; NOTE:
    [Capture key])."""
    import torch._inductor.config as inductor_config  # NOTE: [Discarded draws]
    from torch._dynamo.backends.common import aot_autograd
    from torch._functorch._aot_autograd.schemas import MutationType
    from torch._functorch.partitioners import default_partition

    def partition(joint, joint_inputs, **kwargs):
        _refuse_data_reads(joint)
        if eager_dropout:
            _eager_cpu_dropout(joint)
        discarded = _discarded_draws(joint)
        with inductor_config.patch(
            fallback_random=False
        ):  # else the backward keeps, and recomputes, the forward's draws
            fw, bw = default_partition(joint, joint_inputs, **kwargs)
        _keep_discarded_draws(joint, fw, discarded)
        record["forward"], record["backward"] = fw, bw
        return fw, bw

    def forward_compiler(gm, example_inputs):
        from torch._guards import TracingContext

        meta = record["meta"] = TracingContext.try_get().fw_metadata
        mutates = any(info.mutation_type != MutationType.NOT_MUTATED for info in meta.input_info)
        return gm if mutates else _outputs_only(gm)  # NOTE: [Capture without running]

    aot = aot_autograd(fw_compiler=forward_compiler, bw_compiler=lambda gm, ex: gm, partition_fn=partition)

    def backend(gm, example_inputs):
        record["example_inputs"] = example_inputs
        inline_checkpoints(gm)  # NOTE: [User checkpointing] in remat_dsl/capture/checkpoints.py
        restore = drop_inputs_returned(gm)  # NOTE: [Stateful layers] in capture/stateful.py
        _copy_aliased_outputs(gm)
        found = lookup(gm, example_inputs) if lookup is not None else None
        if found is not None:  # NOTE: [Capture key]
            record["recalled"] = found
            compiled = _outputs_only(gm, "example_value")
        else:
            compiled = aot(gm, example_inputs)

        @functools.wraps(compiled)
        def run(*args):  # NOTE: [Output order]: what the model's output is built from
            returned = record["returned"] = compiled(*args)
            return restore(args, returned)

        return run

    torch._dynamo.reset()
    try:
        with _torch_logs_silenced():
            compiled = torch.compile(model, backend=backend, fullgraph=True, dynamic=False)
            with (
                torch._dynamo.config.patch(ignore_logging_functions=_logging_functions()),
                inductor_config.patch(fallback_random=True),
                direct_sequential(),  # NOTE: [User checkpointing] in remat_dsl/capture/checkpoints.py
                recurrent_layers(),  # NOTE: [Recurrent layers] in remat_dsl/capture/recurrent.py
            ):
                return inputs.call(compiled)
    except RematError:
        raise
    except SystemExit as exc:
        raise RematError(f"error: the model's forward called sys.exit({exc.code!r}) while it was captured") from None
    except Exception as exc:
        inner = getattr(exc, "inner_exception", None)  # dynamo's BackendCompilerFailed: our backend's own refusal
        if isinstance(inner, RematError):
            raise inner from None
        raise _capture_error(exc) from None
    finally:
        torch._dynamo.reset()


# NOTE: [Output order]
# Dynamo's graph returns each output tensor once, in the order its bytecode met them, and
# builds the model's output object from them outside the graph: not always in pytree
# order (CLIP returns its text and vision towers' outputs, made first, ahead of its loss).
# So capture records what the compiled forward returned and finds each tensor leaf of the
# output among them by identity (`_output_order`), then puts the forward graph's model
# outputs in the order the leaves first show them (`_reorder_outputs`; the tangents follow
# them), so that model output k is the k-th distinct tensor of the plan's `outputs`.  One
# tensor may stand at several leaves (a BertModel asked for its hidden states returns its
# last one twice): the plan names it at each, and the generated module returns the one
# tensor at each, as the model does (`Captured.leaves`).  A leaf that the graph did not
# return (an input returned as it is) and a graph output that is no leaf (a tensor kept on
# a module) are refused: the generated module could not return them as the model does.
# The refusal names the attributes that hold such a tensor after the forward, and the
# buffers the forward replaced by one: Wav2Vec2-Conformer's relative positions under
# autocast (`self.pe = pe.to(x.dtype)`: a new bfloat16 buffer on the first step, the same
# one on the next), where a plan of the first step is not a plan of the next.


def _output_order(out, returned, model: torch.nn.Module | None = None) -> list[int]:
    """NOTE: [Output order]: for each tensor leaf of `out` (pytree order), the index of
    the graph output (`returned`) it is.  Raises RematError for outputs the generated module
    could not return as the model does, naming the attributes of `model` that hold a tensor
    the forward kept outside its output."""
    leaves = pytree.tree_flatten_with_path(out)[0]
    paths = [("output" + pytree.keystr(path), leaf) for path, leaf in leaves if leaf is not None]
    returned = list(returned) if isinstance(returned, (list, tuple)) else []
    index = {id(value): k for k, value in reversed(list(enumerate(returned)))}
    order = []
    for where, leaf in paths:
        if id(leaf) not in index:
            raise RematError(
                f"error: the model's {where} is not computed by its forward (an input or parameter returned as it is)",
                hint="return a tensor the forward computes, or leave it out of the output",
            )
        order.append(index[id(leaf)])
    if sorted(set(order)) != list(range(len(returned))):
        placed = set(order)
        kept = {id(value) for k, value in enumerate(returned) if k not in placed}
        held, replaced = _held_tensors(model, kept) if model is not None else ([], [])
        names = held + [
            f"{name} (a buffer it replaces by a new {str(t.dtype).removeprefix('torch.')} tensor of shape"
            f" {list(t.shape)})"
            for name, t in replaced
        ]
        where = (
            f": {', '.join(names[:3])}{', ...' if len(names) > 3 else ''}" if names else " (on a module or in a global)"
        )
        raise RematError(
            f"error: the model's forward computes {len(returned) - len(set(order))} tensor(s) that it keeps outside its"
            f" output{where}, which a plan of its training step would not set",
            hint="return every tensor the forward makes for the caller in its output"
            + (
                "; for a buffer the forward replaces (a cast to autocast's dtype, a longer table), give it in"
                " build_model the value the forward makes of it, so that the forward keeps it as it is"
                if replaced
                else ""
            ),
        )
    return order


def _held_tensors(model: torch.nn.Module, kept: set[int]) -> tuple[list[str], list[tuple[str, torch.Tensor]]]:
    """NOTE: [Output order]: the paths of `model`'s plain tensor attributes, and (path,
    tensor) of its buffers, that hold one of the tensors `kept` (ids of graph outputs that
    are no output leaf) after the forward ran.  A buffer among them is one the forward
    replaced by a new tensor (`self.pe = self.pe.to(x.dtype)`), not one it updated in
    place (which AOTAutograd makes a buffer update of the plan)."""
    held = [name for name, value in tensor_attributes(model) if id(value) in kept]
    replaced = [(name, value) for name, value in model.named_buffers(remove_duplicate=False) if id(value) in kept]
    return held, replaced


def _reorder_outputs(forward: fx.GraphModule, first: int, order: list[int]) -> None:
    """NOTE: [Output order]: the forward graph's model outputs (after the `first` buffer
    updates) in the order `order` (a permutation of their indices), in place."""
    output = forward.graph.output_node()
    returned = output.args[0]
    assert isinstance(returned, (tuple, list))  # fx: the output node's one argument holds the returned values
    values = list(returned)
    outputs = values[first : first + len(order)]
    values[first : first + len(order)] = [outputs[k] for k in order]
    output.args = (type(returned)(values),)
    forward.recompile()


# NOTE: [Aliased outputs]
# A stock model may return an output that is a view of another output (CLIP's
# `logits_per_image` is `logits_per_text.t()`), two views of one intermediate, or a view
# of an input or parameter.  AOTAutograd gives such an output no tangent: its runtime
# regenerates the view from its base after the compiled forward, so the view's gradient
# reaches the base through autograd.  The generated module returns every output from one
# autograd.Function, so a gradient into such a view would be lost.  So capture copies
# each of them in dynamo's graph before AOTAutograd runs (`clone`, one op of the plan,
# named after the op that made the view): the outputs have the same values, the view's
# gradient flows through the copy into its base, and only the aliasing is gone (writing
# into one output in place no longer changes the other).  A view of an intermediate that
# no other output shares is returned as it is (AOTAutograd's `alias_of_intermediate`).


def _copy_aliased_outputs(gm: fx.GraphModule) -> None:
    """NOTE: [Aliased outputs]: a `clone` after each output of dynamo's graph `gm` that is
    a view sharing its storage with another output or with a graph input (its traced
    values in `node.meta["example_value"]`), in place."""
    from torch.multiprocessing.reductions import StorageWeakRef

    def storage(node):
        value = node.meta.get("example_value") if isinstance(node, fx.Node) else None
        return StorageWeakRef(value.untyped_storage()) if isinstance(value, torch.Tensor) else None

    output = gm.graph.output_node()
    outputs = list(dict.fromkeys(pytree.tree_leaves(output.args)))
    inputs = {storage(node) for node in gm.graph.nodes if node.op == "placeholder"} - {None}
    counts = collections.Counter(storage(node) for node in outputs)
    copies = {}
    for node in outputs:
        key, value = storage(node), getattr(node, "meta", {}).get("example_value")
        if key is None or not isinstance(value, torch.Tensor) or not value._is_view():
            continue
        if counts[key] < 2 and key not in inputs:
            continue
        with gm.graph.inserting_after(node):
            copy_ = copies[node] = gm.graph.call_function(torch.clone, (node,))
        copy_.meta.update({k: v for k, v in node.meta.items() if k != "example_value"})
        copy_.meta["example_value"] = value.clone()
    if copies:
        output.args = pytree.tree_map(lambda a: copies.get(a, a) if isinstance(a, fx.Node) else a, output.args)
        gm.graph.lint()
        gm.recompile()


# NOTE: [Capture without running]
# torch.compile traces the forward and backward on fake tensors, then runs the compiled
# forward on the real ones: a whole forward pass (a fifth of a warm `remat plan` of a
# Llama decoder on a 2-core CPU: docs/measured-notes.md) whose values nobody reads, since
# capture keeps the graphs and only the structure of the output (its pytree, which leaves
# are None).  So the compiled forward returns, instead of computing them, empty tensors
# with each output's shape, strides, dtype and device (`_outputs_only`); the model's
# output is built from them as from the real ones.  The graphs, their inputs and the
# example primals are the same; what the run did besides is kept where it matters: a
# forward that updates an input in place (BatchNorm's running statistics, its
# `num_batches_tracked`) still runs for real, so the buffers later profiled hold the
# updated values, and a fake capture (NOTE: [Fake capture] in pipeline.py) runs its fake
# forward, which costs nothing.  An error that only running shows (an index out of range)
# surfaces when the ops are profiled, in `profile_step`.


def _outputs_only(gm: fx.GraphModule, value: str = "val"):
    """The compiled forward of NOTE: [Capture without running]: `gm`'s outputs as empty
    tensors of their traced shapes, strides, dtypes and devices (their values undefined;
    the layouts from `node.meta[value]`); on fake tensors it runs `gm`."""
    from torch._subclasses.fake_tensor import FakeTensor

    outputs = gm.graph.output_node().args[0]

    def empty(node):
        if not isinstance(node, fx.Node):
            return node
        traced = node.meta[value]
        if not isinstance(traced, torch.Tensor):
            return traced
        return torch.empty_strided(traced.shape, traced.stride(), dtype=traced.dtype, device=traced.device)

    def run(*args):
        if any(isinstance(arg, FakeTensor) for arg in args):
            return gm(*args)
        return type(outputs)(empty(value) for value in outputs)

    return run


def _logging_functions() -> set:
    """The logging.Logger methods (and the `warning_once`-style helpers libraries attach to
    it) that dynamo may drop while tracing a forward (NOTE: [Stock models])."""
    names = {"debug", "info", "warning", "warn", "error", "exception", "critical", "fatal", "log"}
    found = {
        getattr(logging.Logger, n)
        for n in dir(logging.Logger)
        if n in names or n.endswith("_once") or n.startswith("warning_")
    }
    return set(torch._dynamo.config.ignore_logging_functions) | {f for f in found if callable(f)}


@contextlib.contextmanager
def _torch_logs_silenced():
    """Disable torch's loggers while capturing: a failure is reported once, as a RematError,
    not as the tracebacks dynamo and fake tensors log on their way.

    NOTE: [Unlogged function names]
    With its loggers off, dynamo still names the function of every source line that makes
    an FX node, for a `TRACE FX call` log line it then drops: the first time it meets a
    source file it tokenizes all of it (`torch._dynamo.funcname_cache`; transformers'
    modeling files are thousands of lines), a tenth or more of a decoder's trace in every
    `remat plan`, warm or cold (docs/measured-notes.md).  While the loggers are
    off, the lookup answers None (the name is left out of a line nobody sees); the FX
    graph does not depend on it.
    """
    import torch._dynamo.symbolic_convert as symbolic_convert

    loggers = [
        logging.getLogger(name) for name in list(logging.root.manager.loggerDict) if name.split(".")[0] == "torch"
    ]
    saved = [logger.disabled for logger in loggers]
    for logger in loggers:
        logger.disabled = True
    funcname = symbolic_convert.__dict__.get("get_funcname")
    if funcname is not None:
        symbolic_convert.get_funcname = _no_funcname
    try:
        yield
    finally:
        for logger, disabled in zip(loggers, saved):
            logger.disabled = disabled
        if funcname is not None:
            symbolic_convert.get_funcname = funcname


def _no_funcname(filename: str, lineno: int) -> None:
    """NOTE: [Unlogged function names]."""
    return None


_PACKAGE = Path(__file__).resolve().parent.parent  # remat_dsl/


def _capture_error(exc: Exception) -> RematError:
    """`FILE:LINE:COL: error: cannot capture ...` at the user's line dynamo stopped on, with
    PyTorch's own explanation in the hint."""
    inner = getattr(exc, "inner_exception", None)  # raised inside our backend: by AOTAutograd, or by us
    frames = traceback.extract_tb(inner.__traceback__) if inner is not None else []
    if frames and Path(frames[-1].filename).resolve().is_relative_to(_PACKAGE):
        return RematError(
            f"error: remat-dsl failed while capturing the model: {type(inner).__name__}: {inner} "
            f"({frames[-1].filename}:{frames[-1].lineno})",
            hint="this is a bug in remat-dsl, not in the model: please report it with the model file",
        )
    lines = [line.strip() for line in str(exc).strip().splitlines() if line.strip()]
    first = lines[0] if lines else type(exc).__name__
    if inner is not None and first.endswith("raised:"):  # dynamo puts the reason on the next lines, or nowhere
        reason = str(inner).strip().splitlines()
        first = f"{first} {type(inner).__name__}" + (f": {reason[0]}" if reason else "")
    explanation = next(
        (line.removeprefix("Explanation:").strip() for line in lines if line.startswith("Explanation:")), None
    )
    # the op's own error ends an explanation that lists every argument: the excerpt below cut
    # it off (StableLM with more key/value heads than query heads: NOTE: [Capture errors])
    got = re.search(r""": got (\w+)\((['"])(.*)\2\)$""", explanation or "")
    if got:
        first = f"an op fails on the sample inputs: {got[1]}: {got[3]}"
        explanation = (explanation or "")[: got.start()]
    torch_dir = str(Path(torch.__file__).resolve().parent)
    user = [
        f for f in getattr(exc, "real_stack", None) or () if not str(Path(f.filename).resolve()).startswith(torch_dir)
    ]
    where = f"{user[-1].filename}:{user[-1].lineno}:{(getattr(user[-1], 'colno', None) or 0) + 1}: " if user else ""
    refused = next((e for e in _chained(exc) if isinstance(e, RematError)), None)
    if refused is not None:  # refused by remat-dsl while dynamo ran an op on fake tensors
        return RematError(f"{where}{refused.message}", hint=refused.hint)
    said = f"PyTorch says: {explanation[:400].rstrip('.')}. " if explanation else ""
    loss = ""
    if user and _in_labels_branch(user[-1].filename, user[-1].lineno):
        loss = (
            "; this line is the model's own loss (under `if labels is not None`): leave `labels` out of "
            "sample_inputs() and compute the loss in the model file's loss_fn(output), from its logits"
        )
    return RematError(
        f"{where}error: cannot capture the model as one graph: {first}",
        hint=f"{said}remat-dsl needs a forward that torch.compile(fullgraph=True) captures whole: no data-dependent "
        f"Python control flow, no prints of tensors, and one that runs in eager PyTorch{loss}",
    )


def _chained(exc: BaseException, depth: int = 8) -> list[BaseException]:
    """`exc` and the exceptions it was raised from or during, nearest first (at most `depth`)."""
    found = [exc]
    while len(found) < depth:
        nearer = found[-1].__cause__ or found[-1].__context__
        if nearer is None:
            break
        found.append(nearer)
    return found


# NOTE: [Capture errors]
# Two things a user needs from a refused capture are not in dynamo's first line.  When an
# op fails on the sample inputs' shapes, dynamo's explanation lists every argument before
# the op's own error (`...): got RuntimeError('Attempting to broadcast ...')`), and
# StableLM's attention call is long enough that the 400 characters quoted cut the error
# off; so the error line ends with the op's own error.  When the line dynamo stops on is
# the model's loss (DeBERTa-v2's sequence classifier counts the labels to keep with
# `nonzero()` and branches on that count), the model captures whole without `labels=`, and
# the model file's `loss_fn` can compute the loss: the hint says so when the line lies in
# an `if labels ...:` block of its source (`_in_labels_branch`).


def _in_labels_branch(filename: str, lineno: int) -> bool:
    """Whether line `lineno` of the Python file lies inside an `if` whose test reads a name
    `labels` (False when the file cannot be read or parsed)."""
    try:
        tree = ast.parse(Path(filename).read_text())
    except (OSError, SyntaxError, ValueError):
        return False
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and node.lineno <= lineno <= (node.end_lineno or node.lineno):
            if any(isinstance(n, ast.Name) and n.id == "labels" for n in ast.walk(node.test)):
                return True
    return False


# NOTE: [Tensor attributes]
# A module may keep a tensor as a plain attribute, neither parameter nor buffer: VideoMAE's
# sinusoidal position table (`self.position_embeddings = get_sinusoid_encoding_table(...)`).
# Dynamo lifts it as an input of its graph, and capture refused the stock model ("an input
# that is neither a parameter, a buffer nor a model input").  The plan lists it among the
# buffers, named by its attribute path (`videomae.embeddings.position_embeddings`), and the
# generated module looks buffers up among `named_buffers()` and such attributes alike
# (`_named_buffers` in remat_dsl/codegen/runtime.py).  `model.to(device)` leaves such a tensor where it
# was, so the generated module refuses one on another device than the parameters.


def tensor_attributes(model: torch.nn.Module) -> list[tuple[str, torch.Tensor]]:
    """NOTE: [Tensor attributes]: (attribute path, tensor) of every tensor that a module of
    `model` keeps as a plain attribute, neither parameter nor buffer, in module order."""
    found = []
    for prefix, module in model.named_modules():
        for name, value in vars(module).items():
            if isinstance(value, torch.Tensor) and not isinstance(value, torch.nn.Parameter):
                found.append((f"{prefix}.{name}" if prefix else name, value))
    return found


def _primal_names(model, example_inputs, inputs: dict[int, str]) -> list[tuple[str, str]]:
    """Name each graph input by identity: a parameter, a buffer or a user input
    (`inputs`: id of each tensor argument -> its name)."""
    by_id: dict[int, tuple[str, str]] = {}
    buffers = [*model.named_buffers(), *tensor_attributes(model)]
    for kind, named in (("parameter", model.named_parameters()), ("buffer", buffers)):
        real: dict[str, str] = {}
        for name, t in named:
            plan = plan_name(name)
            if real.setdefault(plan, name) != name:
                raise RematError(
                    f"error: the model's {kind}s '{real[plan]}' and '{name}' would both be named '{plan}' in a plan",
                    hint="plan names hold letters, digits, `_` and `.`; rename one of the modules",
                )
            by_id.setdefault(id(t), (kind, plan))
    for key, name in inputs.items():
        by_id.setdefault(key, ("input", name))
    names = []
    for t in example_inputs:
        if id(t) not in by_id:
            raise RematError(
                "error: the captured graph takes an input that is neither a parameter, a buffer nor a model input"
            )
        names.append(by_id[id(t)])
    return names


def _check_outputs(meta) -> None:
    """Outputs that are views of intermediates are fine: the forward graph returns the view
    itself (AOTAutograd regenerates it only to fix autograd metadata, which the generated
    module's autograd.Function sets).  Views of inputs, several views of one base and a view
    of another output are refused: returned from one autograd.Function, autograd would
    route the view's gradient through its base as well (measured: wrong gradients)."""
    from torch._functorch._aot_autograd.schemas import OutputType

    accepted = {
        OutputType.non_alias, OutputType.unsafe_view_alias, OutputType.custom_function_view,
        OutputType.alias_of_intermediate_save_as_output, OutputType.alias_of_intermediate,
    }  # fmt: skip
    if meta.num_intermediate_bases:
        raise RematError(
            "error: the model returns several views of one intermediate tensor", hint="return .clone() of the views"
        )
    for info in meta.output_info:
        if info.output_type.name == "alias_of_intermediate_base_is_user_output":
            raise RematError("error: a model output is a view of another output", hint="return .clone() of the view")
        if info.output_type not in accepted:
            raise RematError(
                f"error: a model output is a view of a model input or parameter ({info.output_type.name})",
                hint="return a fresh tensor (for example `.clone()`) from forward",
            )
