"""Models that checkpoint themselves: captured through their checkpointing (NOTE: [User checkpointing])."""

from __future__ import annotations

import contextlib
import operator
from typing import Any

import torch
import torch.fx as fx
import torch.utils.checkpoint

from remat_dsl.plan.errors import RematError

# NOTE: [User checkpointing]
# Models call `torch.utils.checkpoint.checkpoint` (reentrant or not) in their forward,
# `checkpoint_sequential` over a stack of layers, or have Hugging Face's gradient
# checkpointing on (`gradient_checkpointing_enable()`: each layer calls
# `_gradient_checkpointing_func`, a `functools.partial` of `checkpoint`).  The plan decides
# what to keep and what to recompute, so such a model is captured as if it ran its
# checkpointed functions directly, and the generated module runs the plan's schedule in
# place of the user's checkpointing.
# Dynamo recognises `checkpoint` by identity, however the model reaches it (imported by
# name, bound in a `functools.partial` when checkpointing was enabled), and traces the
# function into a subgraph called through the `tag_activation_checkpoint` higher-order
# op; AOTAutograd then wraps each random op inside it in `run_and_save_rng_state`, which
# saves the generator's state (on the CPU a uint8 tensor of a size only known by running,
# an unbacked symbolic size) to replay the draws when the backward recomputes it.  That
# state is a graph output the plan cannot hold (capture refused such models with
# "SymIntArrayRef expected to contain only concrete integers"), and the op and its tags
# are the user's recomputation, not the plan's.  So the backend inlines every such
# subgraph into dynamo's graph before AOTAutograd traces it (`inline_checkpoints`):
# AOTAutograd sees the ops the function runs, named by their modules, as for the model
# without checkpointing (tests/test_user_checkpointing.py: the same plan, byte for byte).
# Swapping `torch.utils.checkpoint.checkpoint` for a direct call would miss the references
# models already hold, and dynamo would still see the original.  `checkpoint_sequential`
# is a function dynamo refuses to trace; while capture runs, its code is that of
# `_direct_sequential` (the function object stays the one every reference holds), which
# calls the layers one after the other as its last segment does.
# This trains bit for bit like eager with the user's checkpointing on: checkpointing
# computes the same forward, draws the same numbers there (its recomputation restores the
# generator state the forward had, and the stream after it: `preserve_rng_state`, on by
# default), and the backward's ops are the same; the generated module runs the plan, not
# the model's forward, in training.  With `preserve_rng_state=False` eager's
# recomputation draws other numbers than its forward did; the plan computes the gradient
# of the forward that ran.


def _direct_sequential(functions, segments, input, use_reentrant=None, **kwargs):  # noqa: A002 (torch's names)
    """`checkpoint_sequential` without checkpointing: `functions` (an `nn.Sequential` or a
    list of callables) applied in order, as its last segment runs them."""
    for function in functions:
        input = function(input)
    return input


@contextlib.contextmanager
def direct_sequential():
    """While the context runs, `torch.utils.checkpoint.checkpoint_sequential` (every
    reference to it) calls its functions directly (NOTE: [User checkpointing]); its code
    is restored on leaving, also on an error."""
    target = torch.utils.checkpoint.checkpoint_sequential
    original = target.__code__
    target.__code__ = _direct_sequential.__code__
    try:
        yield
    finally:
        target.__code__ = original


def inline_checkpoints(gm: fx.GraphModule) -> bool:
    """Replace each `tag_activation_checkpoint` call of dynamo's graph `gm` (nested ones
    too) by the ops of its subgraph (NOTE: [User checkpointing]); whether any was."""
    hop = torch.ops.higher_order.tag_activation_checkpoint
    calls = [node for node in gm.graph.nodes if node.op == "call_function" and node.target is hop]
    for call in calls:
        _inline_call(gm, call)
    if calls:
        gm.graph.eliminate_dead_code()
        gm.graph.lint()
        gm.recompile()
    return bool(calls)


def _inline_call(gm: fx.GraphModule, call: fx.Node) -> None:
    body_node, arguments = call.args[0], call.args[1:]
    assert isinstance(body_node, fx.Node) and isinstance(body_node.target, str)  # dynamo's get_attr of the subgraph
    body = getattr(gm, body_node.target)
    inline_checkpoints(body)
    env: dict[fx.Node, Any] = {}
    placeholders = [node for node in body.graph.nodes if node.op == "placeholder"]
    env.update(zip(placeholders, arguments, strict=True))
    outputs: Any = None
    with gm.graph.inserting_before(call):
        for node in body.graph.nodes:
            if node.op == "placeholder":
                continue
            if node.op == "output":
                outputs = fx.map_arg(node.args[0], env.__getitem__)
                break
            if node.op == "get_attr":
                env[node] = gm.graph.get_attr(_lift_attribute(gm, body, node.target))
                env[node].meta = dict(node.meta)
                continue
            env[node] = gm.graph.node_copy(node, env.__getitem__)
    for user in list(call.users):
        if user.op != "call_function" or user.target is not operator.getitem:
            raise RematError(
                f"error: remat-dsl failed while capturing the model: dynamo's checkpointed call {call.name} is used"
                f" by {user.format_node()}, not through its outputs",
                hint="this is a bug in remat-dsl, not in the model: please report it with the model file",
            )
        user.replace_all_uses_with(outputs[user.args[1]])
        gm.graph.erase_node(user)
    gm.graph.erase_node(call)
    if not body_node.users:
        gm.graph.erase_node(body_node)
        delattr(gm, body_node.target)


def _lift_attribute(gm: fx.GraphModule, body: fx.GraphModule, target: str) -> str:
    """A name in `gm` for the attribute `target` of the subgraph `body` (a constant it holds)."""
    name = f"{target.replace('.', '_')}_inlined"
    while hasattr(gm, name):
        name += "_"
    value = operator.attrgetter(target)(body)
    if isinstance(value, torch.nn.Parameter):
        gm.register_parameter(name, value)
    elif isinstance(value, torch.Tensor):
        gm.register_buffer(name, value)
    else:
        setattr(gm, name, value)
    return name
