"""Whether eager PyTorch computes the traced training step's bits (NOTE: [Eager agreement]).

NOTE: [Eager agreement]
A plan runs the step that capture traced, and its module gives that step's loss and
gradients bit for bit.  Where a library takes another path while it is traced than when it
runs eagerly, the traced step is not the eager one, and the module would differ from the
model in the last bits without anyone being told.  Capture takes the eager path where it
knows it (NOTE: [Eager branches] in capture/fx.py); this check finds the paths it does not
know.  When `remat plan` profiles a step on real tensors for the device kind it runs on
(capture_graph's `check_eager`), the first run of every op leaves the traced step's model
outputs and gradients (tangents of ones, as profiling runs the backward); the model then
runs the same step eagerly, from the same random-number state, with the inputs capture
called it with (`use_cache=False` where it filled that in), its forward under the same
autocast, and `backward` with the same tangents.  Each output and each parameter's gradient
is compared bit for bit.  Where they differ, and a second eager run agrees with the first
(an op without a deterministic kernel, such as the CPU's `index_put` with `accumulate`,
gives other bits from run to run, and then neither run says anything), `disagreement`
returns comment lines that name what differs and by how much: `remat plan` prints them as a
warning and writes them above the plan's header.  It costs one eager step (two where they
differ) in a plan that profiles; a plan whose profile comes from the cache takes the lines
from there.  Each eager run starts from the buffers the traced one read (a training step
updates batch norm's running statistics), which are put back after it.

Known causes of a disagreement (the models found, and how each cause was shown:
docs/measured-notes.md):
- transformers' masking utilities keep an attention mask of ones (zeros added to the
  scores) when traced and leave it out eagerly, so under bfloat16 autocast the traced
  attention is float32 where the eager one is bfloat16; which path eager takes depends on
  the mask's values, which a plan for other batches cannot assume, so capture keeps the
  traced path and says so;
- transformers' `is_tracing()` branches;
- autocast's cache of a weight's cast, which the warning names where a differing
  gradient's parameter is cast at more than one op (`_cast_more_than_once`,
  tests/models/shared_weight.py).

Not checked: captures with fake tensors (no values), and plans for another device kind than
the one capturing (their ops are not this device's: NOTE: [Fake capture] in
capture/pipeline.py).
"""

from __future__ import annotations

import textwrap
from typing import Any

import torch
import torch.utils._pytree as pytree

from remat_dsl.capture.fx import Captured, cuda_devices, forward_autocast, training_defaults
from remat_dsl.capture.model_file import Inputs

SHOWN = 3  # names listed per kind of difference
WIDTH = 96  # characters per comment line


def disagreement(model: torch.nn.Module, inputs: Inputs, captured: Captured, outputs: list, gradients: list,
                 autocast: torch.dtype | None) -> tuple[str, ...]:  # fmt: skip
    """NOTE: [Eager agreement]: comment lines saying which of the traced step's model
    `outputs` (the forward graph's, in its order) and `gradients` (the backward graph's
    outputs, one per forward placeholder) eager PyTorch computes with other bits, or () when
    it computes them all alike (or gives other bits from run to run itself).  Runs `model`
    eagerly twice at most; afterwards its parameters' `.grad` are None and its buffers hold
    what they held before.  Raises nothing: an eager run that fails is said in the lines."""
    state = _rng_state(inputs, model)
    try:
        first = _eager_step(model, inputs, captured, autocast, state)
    except Exception as exc:  # the trace ran; eagerly the model fails
        text = str(exc).strip().splitlines()
        reason = text[0] if text else type(exc).__name__
        return (f"warning: eager PyTorch could not run the captured step, to compare its bits with it: {reason}",)
    differ = _differences(captured, first, outputs, gradients)
    if not differ:
        return ()
    try:
        second = _eager_step(model, inputs, captured, autocast, state)
    except Exception:
        return ()
    if _differences(captured, first, second[0], second[1]):  # eager itself is not deterministic here
        return ()
    return _lines(differ, captured, _cast_more_than_once(captured, autocast))


def _rng_state(inputs: Inputs, model) -> tuple:
    devices = cuda_devices([*inputs.leaves(), *model.parameters()])
    return torch.get_rng_state(), [torch.cuda.get_rng_state(d) for d in devices], devices


def _eager_step(model, inputs: Inputs, captured: Captured, autocast, state) -> tuple[list, list]:
    """(outputs in the forward graph's order, gradients per forward placeholder) of one eager
    step from random-number `state`, tangents of ones."""
    cpu, cuda, devices = state
    for p in model.parameters():
        p.grad = None
    buffers = [(b, b.detach().clone()) for b in model.buffers()]
    call = training_defaults(model, inputs)
    try:
        with torch.random.fork_rng(devices=devices):
            torch.set_rng_state(cpu)
            for d, s in zip(devices, cuda):
                torch.cuda.set_rng_state(s, d)
            with forward_autocast(call.leaves(), model, autocast):
                out = call.call(model)
            leaves = [leaf for leaf in pytree.tree_leaves(out) if leaf is not None]
            by_output: dict[int, Any] = {}
            for leaf, k in zip(leaves, captured.leaves):
                by_output.setdefault(k, leaf)
            outputs = [by_output.get(k) for k in range(captured.num_outputs)]
            tangents = [by_output[k] for k in captured.tangent_of]
            torch.autograd.backward(tangents, [torch.ones_like(t) for t in tangents])
        gradients = [
            (p.grad if p.grad is None else p.grad.detach().clone()) if kind == "parameter" else None
            for (kind, _), p in zip(captured.primal_names, captured.example_primals)
        ]
        return [o.detach() if isinstance(o, torch.Tensor) else o for o in outputs], gradients
    finally:
        for p in model.parameters():
            p.grad = None
        with torch.no_grad():
            for b, value in buffers:
                b.copy_(value)


def _same(a, b) -> bool:
    if a is None or b is None:  # no gradient on one side: the other must be none or zeros
        other = b if a is None else a
        return other is None or (isinstance(other, torch.Tensor) and not other.any())
    if not (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)):
        return a == b
    return a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b)


def _differences(
    captured: Captured, eager: tuple[list, list], outputs: list, gradients: list
) -> list[tuple[str, str, float]]:
    """(kind, name, largest relative difference) for each output and parameter gradient that differs."""
    eager_outputs, eager_gradients = eager
    found = []
    for k, (a, b) in enumerate(zip(eager_outputs, outputs)):
        if not _same(a, b):
            found.append(("output", _output_name(captured, k), _relative(a, b)))
    for (kind, name), primal, a, b in zip(captured.primal_names, captured.example_primals, eager_gradients, gradients):
        if kind == "parameter" and primal.requires_grad and not _same(a, b):
            found.append(("gradient", name, _relative(a, b)))
    return found


def _output_name(captured: Captured, k: int) -> str:
    paths = [pytree.keystr(path) for path, leaf in pytree.tree_flatten_with_path(
        pytree.tree_unflatten([object()] * len(captured.none_leaves), captured.out_spec))[0]]  # fmt: skip
    tensor_paths = [p for p, none in zip(paths, captured.none_leaves) if not none]
    for path, output in zip(tensor_paths, captured.leaves):
        if output == k:
            return "output" + path
    return f"output {k}"


def _relative(a, b) -> float:
    if not (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)) or a.shape != b.shape:
        return float("inf")
    a, b = a.detach().double(), b.detach().double()
    scale = torch.maximum(a.abs(), b.abs()).max().item()
    return (a - b).abs().max().item() / scale if scale > 0 else 0.0


def _cast_more_than_once(captured: Captured, autocast: torch.dtype | None) -> set[str]:
    """The parameters (plan names) that the captured forward casts to `autocast`'s dtype at
    more than one op: eagerly autocast casts such a weight once and reuses the cast (its
    cache of leaf casts), so the gradients of its uses are summed in that dtype and cast back
    once; the trace casts it at each use, and casts each use's gradient back before summing."""
    if autocast is None:
        return set()
    placeholders = [n for n in captured.forward.graph.nodes if n.op == "placeholder"]
    found = set()
    for node, (kind, name) in zip(placeholders, captured.primal_names):
        casts = [
            u for u in node.users if u.target is torch.ops.aten._to_copy.default and u.kwargs.get("dtype") == autocast
        ]
        if kind == "parameter" and len(casts) > 1:
            found.add(name)
    return found


def _lines(differ: list[tuple[str, str, float]], captured: Captured, cast_twice: set[str]) -> tuple[str, ...]:
    outputs = [name for kind, name, _ in differ if kind == "output"]
    grads = [name for kind, name, _ in differ if kind == "gradient"]
    trainable = sum(
        1
        for (kind, _), p in zip(captured.primal_names, captured.example_primals)
        if kind == "parameter" and p.requires_grad
    )
    largest = max(r for _, _, r in differ)
    parts = [_listed(outputs)] if outputs else []
    if grads:
        parts.append(f"{len(grads)} of {trainable} parameter gradients ({_listed(grads)})")
    shared = [name for name in grads if name in cast_twice]
    cause = (
        ("each of those parameters" if shared == grads else f"{_listed(shared)} {'is' if len(shared) == 1 else 'are'}")
        + " cast to the autocast dtype at more than one op of the captured step, where eager autocast casts a weight "
        "once and sums the gradients of its uses in that dtype"
        if shared else "a library takes another path while traced than eagerly"
    )  # fmt: skip
    text = (
        "warning: eagerly, on the sample inputs, the model computes other bits than the step captured here: "
        f"{' and '.join(parts)} differ, by up to {largest:.2g} of their largest magnitude.  The plan, and the "
        f"module generated from it, compute the captured step, as torch.compile(model) does: {cause} (NOTE: "
        "[Eager agreement] in remat_dsl/capture/agreement.py)."
    )
    return tuple(textwrap.wrap(text, WIDTH, break_long_words=False, break_on_hyphens=False))


def _listed(names: list[str]) -> str:
    shown = ", ".join(names[:SHOWN])
    return shown + (f" and {len(names) - SHOWN} more" if len(names) > SHOWN else "")
