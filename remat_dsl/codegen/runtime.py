"""The runtime of a generated module: what it runs that does not depend on the plan.

remat_dsl.codegen.generate inlines this file's source, below its docstring, into every module it
writes (between `# --- remat-dsl runtime` markers), so the module stays standalone: it imports
torch and the standard library, never remat_dsl.  The plan's own values (its inputs, parameters,
device kind, host bytes, ...) are the generated module's constants, passed to these functions as
arguments; the plan's functions (`_forward`, `_backward`), its autograd nodes and `FastModel`
are written by the template (templates/module.py.jinja).  Every global name here is reserved:
no plan value takes it (NOTE: [Generated names] in remat_dsl.codegen.generate).
"""

import functools
import inspect
import linecache
import re
import sys
import threading
import warnings
import weakref

import torch


class _Tensors:
    """Tensors by attribute (`p.fc1_weight`): the parameters or buffers of the plan."""

    def __init__(self, attrs, tensors):
        self.__dict__.update(zip(attrs, tensors))


# NOTE: [Streams]
# Where transfers run.  On the CPU, `offload` and `prefetch` are plain synchronous copies
# and `wait` does nothing.  On CUDA a step uses three streams of its device: the compute
# stream (the current stream, asked for at every use and never cached: autograd runs a
# backward on the stream of its forward, and a cached stream is the bug fixed in
# huggingface/trl#7195) and two side streams made once per (name, device), `d2h` for
# offloads and `h2d` for prefetches.  The CUDA semantics relied on (torch.cuda docs, "CUDA
# semantics"):
# - Work on one stream runs in issue order; two streams are ordered only by events:
#   `Stream.record_event()` marks the work issued so far, `Stream.wait_event(e)` makes the
#   stream's later work wait for it without blocking the host, and `a.wait_stream(b)` is
#   `a.wait_event(b.record_event())`.
# - `copy_(..., non_blocking=True)` between the device and pinned host memory is
#   asynchronous to the host (with pageable memory it would not be); the host never reads
#   the host copy here, only the h2d copy does, after the offload's event.
# - The caching allocator gives a block to the stream current at its allocation and, once
#   freed, reuses it at once for that stream's later work only.  A block used by another
#   stream is safe if it is freed only after its own stream waited for that use;
#   `Tensor.record_stream` instead defers its reuse until the allocator finds an event
#   complete, which its docs call nondeterministic, so the peak would drift from the
#   simulator's one pool.  No tensor here needs it:
# 1. offload: d2h waits for the compute stream (the tensor is made there), then copies into
#    the step's host buffer; its event says the host copy is written.
# 2. prefetch: the device tensor is allocated on the compute stream, so its block is in the
#    pool the simulator counts (allocated inside the side stream, it would sit in that
#    stream's pool: axolotl-ai-cloud/axolotl#3833).  h2d waits for the compute stream (the
#    block's last tenant may have work queued there) and for the offload's event (the host
#    copy is written: without it the copy can read the buffer before the offload wrote it,
#    NVIDIA/Megatron-LM#7398), then copies.  `event_T` holds T's latest transfer: a second
#    prefetch waits for the first, on the same stream after the offload.
# 3. wait: the compute stream waits for the event: the plan's `wait`.
# 4. frees: the checker lets a plan delete a tensor only after waiting for its transfers and
#    end no step with one in flight (remat_dsl/check/replay.py), and `_HostBuffer.release`
#    makes the compute stream wait for both side streams before the backward returns, or
#    before a forward whose backward never runs frees its tensors (the buffer is last in
#    the step's saved values, so it is dropped first).  Every free is after the compute stream waited.
# 5. host memory: each step in flight has one set of pinned groups of POOL_GROUPS bytes
#    (NOTE: [Pinned host memory] in remat_dsl/plan/hostmem.py), allocated once and reused;
#    codegen gives every offloaded tensor a fixed slot (the checker keeps every host copy
#    to the end of the step).  `release` returns the set to a free list after
#    the wait of 4, and the next offload into it waits for the compute stream, so no
#    offload writes a group a prefetch may still read.  Two forwards before their
#    backwards (gradient accumulation) use two sets.
# Compared with torchtune's OffloadActivations (use_streams): it pins new host memory at
# every step, reloads inside its side stream (the allocation of 2), and keeps reloaded
# tensors in stashes until an event or calls record_stream when views escape; its users
# met NaN gradients from a tensor-deletion race (pytorch/torchtune#1867).  torch.compile's
# activation-offload pass (torch/_functorch/_activation_offloading) record_streams each
# offloaded tensor, since it may sink the waits for the offloads to the end of the graph,
# allocates reloads on its reload stream, and orders a reload after its offload only
# through the default stream.  Here each order is an event, and the plan says where the
# compute stream waits.
#
# The one seam: `_cuda` (the CUDA runtime the helpers call) and `_streamed` (whether a
# device takes the stream path).  tests/stream_emulation.py replaces both, to run this
# code on CPU tensors with a thread per side stream.
_cuda = torch.cuda


def _streamed(device):
    return device.type == "cuda"


_LOCK = threading.Lock()  # for the two caches below: backwards may run on other threads
# (name, device) -> side stream; `device` has its index (tensor.device)
_STREAMS: dict[tuple[str, torch.device], torch.cuda.Stream] = {}
# device -> the host groups given back by finished steps (all of one layout: POOL_GROUPS)
_FREE_BUFFERS: dict[torch.device, list[tuple[torch.Tensor, ...]]] = {}


def _side_stream(name, device):
    with _LOCK:
        if (name, device) not in _STREAMS:
            _STREAMS[name, device] = _cuda.Stream(device=device)
        return _STREAMS[name, device]


class _HostBuffer:
    """The host groups a step's offloads write (`.groups`: uint8 tensors of `sizes` bytes,
    pinned for CUDA; NOTE: [Pinned host memory] in remat_dsl/plan/hostmem.py): free ones, or
    new ones; given back by `release`.  A module asks for one layout only (POOL_GROUPS), so
    every free set has it."""

    def __init__(self, device, sizes):
        self.device = device
        with _LOCK:
            free = _FREE_BUFFERS.setdefault(device, [])
            self.groups = free.pop() if free else None
        if self.groups is None:
            self.groups = tuple(_host_group(n, device) for n in sizes)

    def release(self):
        """Order what the compute stream does next after every transfer (4), and give the
        groups back for the next step (5)."""
        if self.groups is None:
            return
        if _streamed(self.device):
            compute = _cuda.current_stream(self.device)
            compute.wait_stream(_side_stream("d2h", self.device))
            compute.wait_stream(_side_stream("h2d", self.device))
        with _LOCK:
            _FREE_BUFFERS.setdefault(self.device, []).append(self.groups)
        self.groups = None

    def __del__(self):
        self.release()


_HOST_ALIGN = 64  # bytes between copies in a group: remat_dsl.plan.hostmem.PINNED_ALIGN


def _host_group(nbytes, device):
    """One group of host copies: `nbytes` bytes (uint8), pinned when `device` is a GPU, so
    that copies to and from it run asynchronously (NOTE: [Pinned host memory] in
    remat_dsl/plan/hostmem.py: one pinned allocation for many copies)."""
    return torch.empty(nbytes, dtype=torch.uint8, pin_memory=device.type == "cuda")


def _host_slot(group, offset, shape, dtype):
    """A contiguous tensor of `shape` and `dtype` in `group`'s bytes from `offset`, with a
    storage of its own (`torch.frombuffer` over the group's memory, which it keeps alive): a
    checkpoint then writes each copy at its size, and safetensors finds no storage shared
    between two parameters."""
    nbytes = dtype.itemsize
    for size in shape:
        nbytes *= size
    if nbytes == 0:
        return torch.empty(shape, dtype=dtype, pin_memory=group.is_pinned())
    try:
        window = group.numpy()[offset : offset + nbytes]
    except RuntimeError:  # torch without NumPy: a view, the group's one storage shared by its copies
        return group[offset : offset + nbytes].view(dtype).view(shape)
    return torch.frombuffer(window, dtype=torch.uint8).view(dtype).view(shape)


def _host_view(pool, slot, tensor):
    """`pool`'s bytes at `slot` (group, offset) as a tensor of `tensor`'s dtype, shape and
    dense layout (the layout `tensor.to("cpu")` would give)."""
    group, offset = slot
    stride = torch.empty_like(tensor, device="meta").stride()
    flat = pool.groups[group][offset : offset + tensor.numel() * tensor.element_size()].view(tensor.dtype)
    return flat.as_strided(tensor.shape, stride)


def _offload(tensor, pool, slot):
    """(host copy, its event: None on the CPU) of `tensor`, written at `slot` of `pool`."""
    host = _host_view(pool, slot, tensor)
    if not _streamed(tensor.device):
        return host.copy_(tensor), None
    d2h = _side_stream("d2h", tensor.device)
    d2h.wait_stream(_cuda.current_stream(tensor.device))
    with _cuda.stream(d2h):
        host.copy_(tensor, non_blocking=True)
    return host, d2h.record_event()


def _prefetch(host, written, device):
    """(device copy of `host`, its event: None on the CPU); `written`: the event of the
    host copy's offload (or of an earlier prefetch of it)."""
    if not _streamed(device):
        return host.to(device, copy=True), None
    compute = _cuda.current_stream(device)
    tensor = torch.empty_strided(host.shape, host.stride(), dtype=host.dtype, device=device)
    h2d = _side_stream("h2d", device)
    h2d.wait_stream(compute)
    if written is not None:  # a parameter kept on the host has no offload to wait for
        h2d.wait_event(written)
    with _cuda.stream(h2d):
        tensor.copy_(host, non_blocking=True)
    return tensor, h2d.record_event()


def _copy_to_host(host, tensor):
    """The event of copying device `tensor` into `host` on the d2h stream (None on the CPU,
    where the copy is done when this returns)."""
    if not _streamed(tensor.device):
        host.copy_(tensor)
        return None
    d2h = _side_stream("d2h", tensor.device)
    d2h.wait_stream(_cuda.current_stream(tensor.device))
    with _cuda.stream(d2h):
        host.copy_(tensor, non_blocking=True)
    return d2h.record_event()


def _write_back(param, tensor):
    """The event of copying `tensor`, the updated device copy of a parameter kept on the
    host, into `param`'s host storage (NOTE: [Parameters on the host] in
    remat_dsl/check/replay.py); None on the CPU, where the copy is done when this returns."""
    return _copy_to_host(param.detach(), tensor)


def _wait(event, device):
    if event is not None:
        _cuda.current_stream(device).wait_event(event)


def _on(device, kind):
    """`device` (where the step runs) for a constant made on a device of its kind."""
    return device if torch.device(kind).type == device.type else torch.device(kind)


# NOTE: [Compiled]
# `torch.compile(FastModel(model), fullgraph=True)` traces this module: dynamo inlines
# `_Plan.forward` and `_Plan.backward` (an autograd.Function whose ctx holds plain
# attributes: the ctx is the step `_forward` and `_backward` are given) with the generator
# `_backward`, and AOTAutograd compiles both.  Everything here is either traceable or
# skipped while compiling (`torch.compiler.is_compiling()`), never dropped in eager mode:
# - the aten operators are `torch.ops.aten.NAME.OVERLOAD` (public, traced as they are);
# - the version counters (`_versions`, `_check_versions`) are not values a graph holds:
#   compiled, autograd checks the compiled graph's own saved tensors instead;
# - an RNG state is not either (dynamo refuses torch.get_rng_state): compiled, a random
#   op's first run keeps its outputs in a `_Draw`, and its recompute reuses them, the
#   same values as eager's replay;
# - the step's attributes are cleared by assignment, not `del`, which dynamo does not trace.
# Errors raised by compiled code name no plan line (the traceback is the compiler's).
# The compiler, not the plan, then decides what is kept for the backward: AOTAutograd's
# common-subexpression elimination merges a recompute with its first run (docs/measurements.md,
# "torch.compile", gives measured peaks).


def _rng_state(device):
    """The RNG state (a uint8 tensor) a random op's first run starts from, replayed by
    `_replay` when the plan recomputes the op.  Under torch.compile: a `_Draw` that keeps
    the first run's outputs instead (NOTE: [Compiled])."""
    if torch.compiler.is_compiling():
        return _Draw()
    return torch.cuda.get_rng_state(device) if device.type == "cuda" else torch.get_rng_state()


def _set_rng_state(state, device):
    if device.type == "cuda":
        torch.cuda.set_rng_state(state, device)
    else:
        torch.set_rng_state(state)


# NOTE: [In-place outputs]
# Where the plan writes an elementwise op's output into an input that dies right after
# it (the checker counts no new bytes for it; NOTE: [In-place outputs] in
# remat_dsl/plan/inplace.py of remat-dsl), `_into` calls the op's `out=` overload with
# that input: each element is computed as eager computes it.  The plan writes in place
# only into tensors it knows are contiguous, beside contiguous operands, so that the
# output is laid out as eager's; should one not be (a parameter of an unusual layout),
# the op is computed as eager computes it, with a warning: that step then takes more
# memory than the plan predicts.  Under torch.compile the op is left as it is: the
# compiled graph reuses its buffers as its own passes decide.  Neither is an op written in
# place when the backward keeps the graph (retain_graph=True): the input it would take over
# may be one the forward left, which the next backward reads again (NOTE: [Autograd nodes]).
_LAYOUT_WARNED: set[object] = set()  # the ops warned about


def _into(step, out_op, op, keyword, into, *args, **kwargs):
    """`op(*args, **kwargs)` written into `into` (an input of the same shape and dtype),
    unless the graph is kept (`step.keep`: a second backward reads `into` again)."""
    if torch.compiler.is_compiling() or step.keep:  # the compiled graph lays out its own buffers
        return op(*args, **kwargs)
    if into.is_contiguous() and all(a.is_contiguous() for a in args if isinstance(a, torch.Tensor)):
        return out_op(*args, **kwargs, **{keyword: into})
    if op not in _LAYOUT_WARNED:
        _LAYOUT_WARNED.add(op)
        warnings.warn(
            f"{op}: an operand is not contiguous, so its output is not written in place as the plan says: the step"
            " takes more memory than the plan predicts"
        )
    return op(*args, **kwargs)


class _Draw:
    """The outputs of a random op's first run, where the RNG state cannot be kept (compiled)."""

    outputs = None


def _first_draw(state, outputs):
    """`outputs` (of a random op's first run); kept in `state` when it is a `_Draw`."""
    if isinstance(state, _Draw):
        state.outputs = outputs
    return outputs


def _replay(state, device, op, *args, **kwargs):
    """The outputs of `op(*args, **kwargs)` run again from RNG `state`, the state of its first
    run: its draws are the first run's, bit for bit; the current state is restored after.
    From a `_Draw` (compiled), the first run's outputs themselves."""
    if isinstance(state, _Draw):
        return state.outputs
    current = _rng_state(device)
    _set_rng_state(state, device)
    try:
        return op(*args, **kwargs)
    finally:
        _set_rng_state(current, device)


def _plan_lines(function):
    """An exception raised by a statement of `function` gets a note with its plan line."""

    @functools.wraps(function)
    def wrapper(*args):
        try:
            return function(*args)
        except Exception as error:
            where = _plan_line(error.__traceback__)
            if where:
                error.add_note(f"remat-dsl: raised by the plan's instruction at {where}")
            raise

    return wrapper


def _plan_line(traceback):
    """`PLAN:LINE` of the innermost statement of this module in `traceback` that runs a
    plan instruction (its comment names the line), if any."""
    found = None
    while traceback is not None:
        if traceback.tb_frame.f_code.co_filename == __file__:
            found = _statement_comment(traceback.tb_lineno) or found
        traceback = traceback.tb_next
    return found


def _statement_comment(number):
    """The plan line in the comment of the statement starting at line `number`: on its last
    line, the first one not indented deeper (nor a closing bracket)."""
    first = linecache.getline(__file__, number)
    indent = len(first) - len(first.lstrip())
    line = first
    while True:
        match = re.search(r"#\s*(\S+:\d+)", line)
        if match:
            return match.group(1)
        number += 1
        line = linecache.getline(__file__, number)
        stripped = line.lstrip()
        if not line or (len(line) - len(stripped) <= indent and not stripped.startswith((")", "]", "}"))):
            return None


def _autocast_off(device_kind):
    """A decorator: run the function with autocast off on `device_kind` (`"cuda"`): the
    plan's ops are the ones autocast chose at capture (its casts included), to run as they
    are, in forward and backward."""

    def decorator(function):
        @functools.wraps(function)
        def wrapper(*args):
            with torch.autocast(device_kind, enabled=False):
                return function(*args)

        return wrapper

    return decorator


# NOTE: [Absent output gradients]
# A model output that the caller does not differentiate (CLIP's logits, when only the loss
# is) gets no gradient from autograd's engine, and nothing is computed from one: the
# gradients reaching that tensor inside the model are summed alone, the first to arrive
# first (`a + b`, in the layout of `a`), and a parameter that only such outputs depend on
# keeps `.grad` None (BertModel's pooler, when the loss reads the hidden states alone).
# The captured backward takes a gradient for every output and adds it first (`g + a + b`,
# in the layout of `g`).  With zeros for `g` the sum took another layout (contiguous,
# where eager's is `a`'s transposed one), reductions over it added in another order, and
# CLIP's `logit_scale` gradient differed in its last bits; the pooler got zero gradients,
# which an optimizer with weight decay or momentum would apply.  So autograd does not
# materialize absent gradients, and neither does the plan's node (held through the whole
# backward, a Llama's logits gradient would take 31.25 MiB): it remembers which were
# absent and stands for each one with an empty tensor on the meta device of the same shape,
# dtype and (contiguous) layout.  A sum with an absent gradient (or a view of it) is its
# other operand (`_add_gradients`) where that has the sum's shape and dtype, and its strides
# too unless nothing computed from the sum (up to a matrix product or a full sum) takes a
# `view` or `as_strided` that needs the traced strides (the generator checks the plan);
# any other op that reads one gets the contiguous zeros, viewed as it reads them
# (`_zeros_if_absent`), made for that op alone: the plan counts them among its temporaries
# (NOTE: [Gradient zeros] in remat_dsl/capture/fbgraph.py of remat-dsl).  A parameter
# gradient computed only from absent output gradients is returned as None.


def _zeros_if_absent(t, device):
    """`t`, or where it is an absent output gradient (a tensor on the meta device) the
    contiguous zeros autograd would have given, viewed as `t` is: same shape, strides and
    storage offset (NOTE: [Absent output gradients])."""
    if not t.is_meta:
        return t
    storage = torch.zeros(t.untyped_storage().nbytes() // t.element_size(), dtype=t.dtype, device=device)
    return storage.as_strided(t.size(), t.stride(), t.storage_offset())


def _add_gradients(a, b, a_absent, b_absent, any_layout, device):
    """`a + b` (aten.add.Tensor), or the operand that is not an absent output gradient
    when it has the sum's shape, dtype and, unless what reads the sum takes it in
    `any_layout`, strides (NOTE: [Absent output gradients])."""
    one_absent = a_absent != b_absent
    if one_absent and a.shape == b.shape and a.dtype == b.dtype and (any_layout or a.stride() == b.stride()):
        return a if b_absent else b
    return torch.ops.aten.add.Tensor(_zeros_if_absent(a, device), _zeros_if_absent(b, device))


# NOTE: [Repeated inputs]
# One tensor can be two of the model's arguments: a causal LM called with
# `labels=input_ids`.  Autograd takes that as it comes, but torch.compile does not: dynamo
# refuses an autograd.Function given one tensor twice ("duplicate tensor input").  So the
# plan's node takes each input tensor once, None in the places of its repeats, and `where`
# (a tuple of ints: for each input, the place of its first occurrence) gives the node its
# inputs back.  The node differentiates no input (it returns None for each), so no
# gradient has to be summed over the repeats.


def _distinct(inputs):
    """`inputs` with each tensor kept at its first place only (None at its repeats), and
    for each input the place of that first occurrence.  NOTE: [Repeated inputs]."""
    where = tuple(next(j for j in range(k + 1) if inputs[j] is x) for k, x in enumerate(inputs))
    return [x if where[k] == k else None for k, x in enumerate(inputs)], where


# NOTE: [Output gradient layouts]
# The backward was traced with each model output's gradient laid out as the output itself
# (AOTAutograd guesses a tangent's strides from its output's, and a contiguous layout for
# an output that overlaps itself, an expanded one), and a `view` in it may need that layout:
# a sequence-first model's `head(h).transpose(0, 1)` gets from its loss a gradient laid out
# as the loss made it.  So where an op reads an output's gradient through such a view (the
# generator checks the plan: NOTE: [Absent output gradients]), the backward takes the
# gradient in the traced layout first, as AOTAutograd's own runtime does: the same tensor
# when it is laid out so, else a copy (`_as_traced`), which holds one more gradient than
# the plan predicts while the step runs.


def _traced_layout(output):
    """The strides the backward was traced with for `output`'s gradient: its own, or None
    (contiguous) for an output that overlaps itself.  NOTE: [Output gradient layouts]."""
    if any(stride == 0 and size > 1 for size, stride in zip(output.shape, output.stride())):
        return None
    return output.stride()


def _as_traced(grad, layout):
    """`grad` laid out as `_traced_layout` says: itself when it is, else a copy.  Compiled,
    AOTAutograd lays out the compiled backward's gradients itself."""
    if torch.compiler.is_compiling():
        return grad
    if layout is None:
        return grad.contiguous()
    if grad.stride() == layout:
        return grad
    return torch.empty_strided(grad.shape, layout, dtype=grad.dtype, device=grad.device).copy_(grad)


class _Step:
    """What one training call's nodes share (NOTE: [Autograd nodes]): set by `_forward`
    (saved, values, sharded, versions, layouts, keep), by `_Outputs` (tangents, probe) and by
    `_backward` (pending: the gradients it hands over at a release or at its end)."""

    def __init__(self):
        self.saved = self.values = self.sharded = self.versions = self.layouts = None
        self.outputs = self.tangents = self.probe = self.run = self.pending = None
        self.keep = False
        self.optimizers = None  # NOTE: [Optimizer in the step]


# NOTE: [Optimizer in the step] (remat_dsl/plan/optimizer.py): a plan whose header names an
# optimizer updates each trainable parameter in its backward, where the plan's `update P` or
# `host_update P` line stands, and hands autograd no gradient (`.grad` stays None, so the
# caller's own `optimizer.step()` and `zero_grad()` change nothing).  The update is
# torch.optim's own: one optimizer of the plan's class per parameter, with the hyper-parameters
# of the parameter's group in the main optimizer (the caller's, or one built from the plan's
# line), read again at every update (a learning-rate scheduler that changes the group is
# followed), and, for updates on the device, the main optimizer's `state` (so its
# `state_dict()` holds every device update's state).  A host update steps an fp32 copy of the
# parameter kept in host memory, with its own states, from the host copy of the gradient,
# then copies the parameter back.
_OPTIMIZER_KEYS = {  # class -> the hyper-parameters that, when on, make an update hold more memory
    "Adam": ("weight_decay",),
    "AdamW": (),
    "SGD": ("momentum", "nesterov", "weight_decay"),
}


class _Optimizers:
    def __init__(self, params, planned, given, paged_slots=None, paged_groups=()):
        name, kwargs = planned
        cls = getattr(torch.optim, name)
        trainable = list({id(p): p for p in params if p.requires_grad}.values())
        if given is None:
            given = cls(trainable, **kwargs)
        elif type(given) is not cls:
            raise TypeError(
                f"the plan updates with torch.optim.{name}, not {type(given).__name__}: pass a torch.optim.{name} "
                "or plan again with its optimizer (`remat plan --optimizer ...`)"
            )
        for group in given.param_groups:
            for key in _OPTIMIZER_KEYS[name]:
                if group.get(key) and not kwargs[key]:  # on where the plan's is off: more memory than planned
                    raise ValueError(
                        f"the optimizer's {key} is {group.get(key)!r} where the plan's is {kwargs[key]!r}: the plan "
                        "holds the memory of its own setting; plan again with this optimizer's hyper-parameters"
                    )
            if group.get("amsgrad") or group.get("maximize"):
                raise ValueError("amsgrad and maximize are not planned: plan again without them")
        self.main = given
        self.groups = {id(p): group for group in given.param_groups for p in group["params"]}
        self.params = params
        self.workers = {}  # (parameter index, where) -> its torch.optim optimizer
        self.masters = {}  # parameter index -> its copy in host memory, fp32 at least
        self.versions = {}  # parameter index -> the parameter's version counter after its last copy back
        # NOTE: [Paged optimizer states] in remat_dsl/plan/optimizer.py: their host copy is the
        # main optimizer's state; their device copy lives from prefetch_states to wait_states
        self.paged = {}  # parameter index -> its states' device copy (the step counter shared)
        self.transfers = {}  # parameter index -> (events of its states' copies, whether they leave the device)
        # their host copies: parameter index -> slot (group, offset) in groups of these sizes
        # (NOTE: [Pinned host memory] in remat_dsl/plan/hostmem.py), made at the first need
        self.paged_slots, self.paged_sizes, self.paged_groups = paged_slots or {}, paged_groups, None
        self._states_home()  # states loaded before FastModel was made
        home = weakref.ref(self)  # the hook does not keep a dropped module's optimizer alive
        given.register_load_state_dict_post_hook(lambda _optimizer: home() and home()._states_home())

    def _state_home(self, i, state, key):
        """A host copy for parameter `i`'s paged state `key` (`state[key]` its current copy):
        its place in the slot of `i`, the tensors of `state` in the order of their names, each
        of the parameter's bytes rounded up to _HOST_ALIGN."""
        param, value = self.params[i], state[key]
        keys = sorted(k for k, v in state.items() if k != "step" and torch.is_tensor(v))
        stride = -(-param.numel() * param.element_size() // _HOST_ALIGN) * _HOST_ALIGN
        if value.shape != param.shape or value.dtype != param.dtype:
            raise RuntimeError(
                f"the optimizer state {key!r} of parameter {i} is {tuple(value.shape)} {value.dtype}, not its "
                f"parameter's {tuple(param.shape)} {param.dtype}: the plan pages states of the parameter's shape"
            )
        if self.paged_groups is None:
            self.paged_groups = [_host_group(n, value.device) for n in self.paged_sizes]
        group, offset = self.paged_slots[i]
        return _host_slot(self.paged_groups[group], offset + keys.index(key) * stride, value.shape, value.dtype)

    def _states_home(self):
        """Every paged parameter's states into their host copies: the main optimizer's
        `load_state_dict` puts them on the parameter's device (a GPU, where the plan holds
        only the ones it prefetched)."""
        for i in sorted(self.paged_slots):
            state = self.main.state.get(self.params[i], {})
            for key, value in list(state.items()):
                if key == "step" or not torch.is_tensor(value):
                    continue
                state[key] = self._state_home(i, state, key).copy_(value)

    def _worker(self, i, target, host):
        worker = self.workers.get((i, host))
        group = self.groups[id(self.params[i])]
        if worker is None:
            worker = self.workers[i, host] = type(self.main)([target])  # the group's settings below
            if not host:
                worker.state = self.main.state  # the main optimizer's state_dict holds it
        worker.param_groups[0].update({k: v for k, v in group.items() if k != "params"})
        return worker

    def update(self, i, grad, paged=False, target=None):
        """The update of parameter `i` on its device from `grad`; none when the loss does
        not reach it (None) or the main optimizer does not hold it, as eager.  `paged`: with
        the device copy of its states that prefetch_states made.  `target`: the device copy
        of a parameter kept on the host (STREAMED), updated in its place and written back
        after (NOTE: [Parameters on the host] in remat_dsl/check/replay.py)."""
        param = self.params[i]
        if grad is None or id(param) not in self.groups:
            return
        worker = self._worker(i, param, False)
        stepped = param if target is None else target
        if paged or target is not None:  # the states of `param` (in the main optimizer's), stepped with `stepped`
            worker.state = {stepped: self.paged[i] if paged else self.main.state[param]}
            worker.param_groups[0]["params"] = [stepped]
        stepped.grad = grad
        worker.step()
        stepped.grad = None
        if paged or target is not None:
            worker.state = self.main.state
            worker.param_groups[0]["params"] = [param]

    def prefetch_states(self, i, device):
        """Start copying parameter `i`'s paged states from host memory to `device` (h2d);
        none before its first update, which makes them."""
        copies, events = {}, []
        for key, value in self.main.state.get(self.params[i], {}).items():
            if key == "step" or not torch.is_tensor(value):  # the counter stays where torch.optim keeps it
                copies[key] = value
                continue
            copies[key], event = _prefetch(value, None, device)
            events.append(event)
        self.paged[i] = copies
        self.transfers[i] = (events, False)

    def offload_states(self, i, device):
        """Start copying parameter `i`'s updated states back to host memory (d2h), into the
        host copies (pinned for CUDA) the main optimizer's state holds."""
        if not self.paged[i]:  # no update ran (no gradient): nothing to keep
            self.transfers[i] = ([], True)
            return
        host = self.main.state[self.params[i]]
        events = []
        for key, value in self.paged[i].items():
            if key == "step" or not torch.is_tensor(value):
                host[key] = value
                continue
            if key not in host:  # the first update made them
                host[key] = self._state_home(i, self.paged[i], key)
            events.append(_copy_to_host(host[key], value))
        self.transfers[i] = (events, True)

    def wait_states(self, i, device):
        """The compute stream waits for parameter `i`'s states' copy; once they are back in
        host memory, their device copy is dropped."""
        events, leaving = self.transfers.pop(i)
        for event in events:
            _wait(event, device)
        if leaving:
            del self.paged[i]

    def host_update(self, i, grad, events, device, on_host=False):
        """The update of parameter `i` on the host from `grad`, the host copy of its
        gradient (written once `events` complete), then the parameter copied back; `on_host`:
        the parameter lives on the host (STREAMED), and is updated where it is."""
        param = self.params[i]
        if grad is None or id(param) not in self.groups:
            return
        for event in events:
            if event is not None:
                event.synchronize()
        if on_host:
            worker = self._worker(i, param, False)
            param.grad = grad.to(param.dtype)
            worker.step()
            param.grad = None
            return
        master = self.masters.get(i)
        if master is None:
            wide = torch.promote_types(param.dtype, torch.float32)  # fp32 at least: bf16's master is fp32
            master = self.masters[i] = param.detach().to("cpu", dtype=wide, copy=True)
        elif self.versions[i] != param._version:  # written since (the model's load_state_dict): follow it
            with torch.no_grad():
                master.copy_(param)
        worker = self._worker(i, master, True)
        master.grad = grad.to(master.dtype)
        worker.step()
        master.grad = None
        with torch.no_grad():
            param.copy_(master, non_blocking=False)
        self.versions[i] = param._version


def _to_host(params, streamed, slots, sizes):
    """Move the parameters `streamed` (indices) of a model on a GPU to pinned host memory,
    each to its slot (group, offset) of groups of `sizes` bytes (NOTE: [Parameters on the
    host], NOTE: [Pinned host memory]); on a CPU they stay where they are."""
    moving = [(params[i], slot) for i, slot in zip(streamed, slots) if params[i].device.type == "cuda"]
    if not moving:
        return
    groups = [_host_group(n, moving[0][0].device) for n in sizes]
    for param, (group, offset) in moving:
        host = _host_slot(groups[group], offset, param.shape, param.dtype)
        param.data = host.copy_(param.data)


_NOT_DIFFERENTIABLE = (
    "the plan's backward is not differentiable (create_graph=True, double backward): it runs the plan's aten "
    "operators on tensors the forward left, outside autograd; for higher-order gradients call the model itself"
)


def _retained(probe):
    """Whether the backward that runs now keeps the graph (retain_graph=True): the probe
    `_Outputs` saved is freed right after its backward ran unless it does."""
    try:
        probe.saved_tensors
    except RuntimeError:
        return False
    return True


# NOTE: [State dict keys]
# FastModel holds the model as its submodule `model`, so torch would key its state dict
# `model.<name>`; a checkpoint saved from it would then not load into the model.  So its
# state_dict() gives the model's own keys (`_model_keys`), which load into the model or
# into another FastModel (`_wrapped_keys` puts `model.` back, for every key: a model's own
# key may start with `model.`, as a Hugging Face causal LM's do).  Under a parent module or
# DDP the parent's prefix stays in front.  named_parameters() keeps torch's names.  A tensor
# the model holds under two keys (tied input and output embeddings) is given once as itself
# and then as a copy (`_untied`): the keys stay the model's, loading either copy sets the
# one tensor, and writers that refuse tensors sharing memory (safetensors' `save_file`, which
# Hugging Face Trainer uses for a model that is not a PreTrainedModel) write the checkpoint.


def _model_keys(module, state_dict, prefix, local_metadata):
    """state_dict() post-hook: `prefix + "model." + key` becomes `prefix + key`, in order;
    each submodule's metadata (its version) is copied to its name in the model."""
    inner = prefix + "model."
    for key in [k for k in state_dict if k.startswith(inner)]:
        state_dict[prefix + key[len(inner) :]] = state_dict.pop(key)
    metadata = getattr(state_dict, "_metadata", None)
    if metadata is not None:
        for key in [k for k in metadata if k == inner[:-1] or k.startswith(inner)]:
            metadata[prefix + key[len(inner) :] if key != inner[:-1] else prefix[:-1]] = metadata[key]
    _untied(state_dict, prefix)


def _untied(state_dict, prefix):
    """A copy for each plain tensor under `prefix` whose memory an earlier key's tensor
    starts at (NOTE: [State dict keys])."""
    seen = set()
    for key, value in state_dict.items():
        if not key.startswith(prefix) or type(value) is not torch.Tensor or value.device.type == "meta":
            continue
        start = value.data_ptr()
        if start and start in seen:
            state_dict[key] = value.clone()
        seen.add(start)


def _wrapped_keys(module, state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys, error_msgs):
    """load_state_dict() pre-hook: every `prefix + key` becomes `prefix + "model." + key`."""
    for key in [k for k in state_dict if k.startswith(prefix)]:
        state_dict[prefix + "model." + key[len(prefix) :]] = state_dict.pop(key)


# NOTE: [FSDP2]
# fully_shard(block) for the model's blocks, then fully_shard(model), makes every
# parameter a shard (a DTensor) that FSDP2 gathers around each module's forward and
# backward, through hooks on the modules' calls, and whose gradient it reduce-scatters
# when the backward is done.  The plan runs the model's operations, not its modules, so no
# block's hooks fire.  So FastModel calls the root module itself, with the plan as its
# forward for that one call (`_under_root_hooks`): the root's hooks run as FSDP2 means
# them (lazy init, the root's own parameters gathered, a hook on the outputs that queues
# FSDP2's end-of-backward callback).  The blocks are gathered by the plan itself, with
# FSDPModule.unshard and reshard (public API): `_shards(sharded, N)` stands before every
# instruction N where some parameter's first read is N or its last read was N - 1
# (PARAMETER_USES), and there `_Sharded` gathers each block whose parameters are first
# read at N and frees each one whose last read was N - 1, in the forward and again in the
# backward (a block gathered for the backward stays so until FSDP2's callback reshards it
# after its reduce-scatter).  So at most the blocks the current instructions read are
# whole, beside the root's parameters: memory is the plan's peak less the parameters of
# the blocks not in use.  Autograd accumulates the gradients into the gathered parameters,
# the same tensor objects at every gather (FSDP2 reuses them and frees their storage in
# between; `_Sharded` checks each gather against the ones found at the first step), and
# FSDP2's callback reduce-scatters them into the shards' gradients: set_requires_
# gradient_sync and the other FSDPModule settings keep their meaning.  Collectives run in
# the plan's order, the same on every rank.


def _replicated():
    """Whether this process is one of several in a torch.distributed process group (DDP)."""
    distributed = torch.distributed
    return distributed.is_available() and distributed.is_initialized() and distributed.get_world_size() > 1


def _fsdp_modules(model):
    """The FSDP2 modules of `model` (fully_shard), the root first; [] when there are none."""
    if not torch.distributed.is_available():
        return []
    from torch.distributed.fsdp import FSDPModule

    return [m for m in model.modules() if isinstance(m, FSDPModule)]


def _under_root_hooks(model, step, args, kwargs):
    """`step(*args, **kwargs)` run as `model`'s forward for one call: FSDP2's hooks on the
    root module run around it.  NOTE: [FSDP2]."""
    if torch.compiler.is_compiling():
        raise NotImplementedError(
            "torch.compile of FastModel under FSDP2 (fully_shard) is not supported: compile FastModel without FSDP2, or"
            " run it uncompiled"
        )
    model.forward = step  # an attribute of this object only, deleted below: nn.Module.__call__ calls self.forward
    try:
        return model(*args, **kwargs)
    finally:
        del model.forward


class _Sharded:
    """The blocks FSDP2 shards under the root, gathered and freed where the plan's
    instructions start and stop reading their parameters.  NOTE: [FSDP2]."""

    def __init__(self, model, modules, parameters, uses):
        """`parameters`: the plan's (PARAMETERS); `uses`: for each, its first and last
        instruction in the forward and in the backward (PARAMETER_USES)."""
        if modules[0] is not model:
            raise NotImplementedError(
                "fully_shard was applied to some of the model's modules but not to the model itself: FastModel "
                "runs under FSDP2 only when the model it was built with is the root (fully_shard(model) last)"
            )
        self.model, self.blocks = model, modules[1:]  # the root's own parameters are gathered by its hooks
        self.parameters = parameters
        paths = {id(m): _plan_name(name) + "." for name, m in model.named_modules()}
        self.owner = {}  # parameter index -> the innermost block whose path is a prefix of its name
        for k, block in enumerate(self.blocks):
            for i, (name, *_) in enumerate(parameters):
                if name.startswith(paths[id(block)]) and (
                    i not in self.owner or len(paths[id(block)]) > len(paths[id(self.blocks[self.owner[i]])])
                ):
                    self.owner[i] = k
        self.points = {}  # instruction number -> [(gather, block)], frees first
        for section in (0, 1):
            spans = {}
            for i, k in self.owner.items():
                first, last = uses[i][2 * section : 2 * section + 2]
                if first is not None:
                    low, high = spans.get(k, (first, last))
                    spans[k] = (min(low, first), max(high, last))
            for k, (first, last) in spans.items():
                self.points.setdefault(first, []).append((True, k))
                self.points.setdefault(last + 1, []).append((False, k))
        for events in self.points.values():
            events.sort()
        self.gathered = set()
        self.expected = None

    def gathered_parameters(self, known):
        """The parameters as gathered, in PARAMETERS order: `known` (those of an earlier step),
        else found by gathering one block at a time."""
        if known is None:
            named = list(self.model.named_parameters())  # the root's own are gathered: its pre-forward hook ran
            paths = {id(m): name for name, m in self.model.named_modules()}
            for block in self.blocks:
                block.unshard()
                named += [(f"{paths[id(block)]}.{name}", value) for name, value in block.named_parameters()]
                block.reshard()
            _check_gathered_dtypes(named, self.parameters)
            known = _lookup(named, self.parameters, "parameter")
        elif not {id(known[i]) for i in range(len(known)) if i not in self.owner} <= {
            id(v) for v in self.model.parameters()
        }:
            raise RuntimeError(_REGATHERED)
        self.expected = [{id(known[i]) for i, k in self.owner.items() if k == b} for b in range(len(self.blocks))]
        return known

    def at(self, number):
        for gather, k in self.points.get(number, ()):
            block = self.blocks[k]
            if not gather:
                block.reshard()
                self.gathered.discard(k)
            elif k not in self.gathered:
                block.unshard()
                self.gathered.add(k)
                if not self.expected[k] <= {id(value) for value in block.parameters()}:
                    raise RuntimeError(_REGATHERED)

    def reshard(self):
        for k in sorted(self.gathered):
            self.blocks[k].reshard()
        self.gathered.clear()


def _check_gathered_dtypes(named, parameters):
    """Raise NotImplementedError if FSDP2 gathers a parameter in another dtype than the plan's
    (`parameters`, as PARAMETERS; a MixedPrecisionPolicy's param_dtype)."""
    plan = {name: dtype for name, _, _, dtype, _ in parameters}
    for name, value in named:
        name = _plan_name(name)
        if name in plan and value.dtype != plan[name]:
            raise NotImplementedError(
                f"FSDP2 gathers parameter '{name}' as {value.dtype} (a MixedPrecisionPolicy's param_dtype), but the "
                f"plan was made for {plan[name]}: use fully_shard without param_dtype, and torch.autocast for mixed "
                "precision (remat plan ... --autocast bf16)"
            )


_REGATHERED = (
    "FSDP2 gathered other parameter objects than at FastModel's first step (the model was sharded or loaded "
    "again): build FastModel(model) again"
)


def _shards(sharded, number):
    """Gather and free FSDP2 blocks before instruction `number`; nothing without FSDP2."""
    if sharded is not None:
        sharded.at(number)


def _plan_again(reason):
    return (
        f"{reason}: this module runs a plan made for another model or other inputs; plan again (remat plan ...) and"
        " regenerate it"
    )


def _plan_name(name):
    """The model's name as the plan writes it: plan names hold letters, digits, `_` and `.`;
    other characters read `_`."""
    return re.sub(r"[^A-Za-z0-9_.]", "_", name)


def _named_buffers(model):
    """The model's buffers and the tensors its modules keep as plain attributes (neither
    parameters nor buffers), which the plan lists among its buffers by attribute path
    (NOTE: [Tensor attributes] in remat-dsl's capture)."""
    found = list(model.named_buffers())
    for prefix, module in model.named_modules():
        for name, value in vars(module).items():
            if isinstance(value, torch.Tensor) and not isinstance(value, torch.nn.Parameter):
                found.append((f"{prefix}.{name}" if prefix else name, value))
    return found


# NOTE: [Trainers]
# Hugging Face Trainer, Accelerate and Lightning train `FastModel(model)` as they train the
# model, without changes to their loop, because it is an nn.Module whose parameters are the
# model's, whose forward takes the model's arguments and returns the model's output type
# (with `.loss` when given `labels`), and whose state_dict has the model's keys (NOTE: [State
# dict keys]), so their checkpoints load into either.  Trainer also reads the model's
# forward signature (it drops the dataset's columns the forward does not name: FastModel's
# `forward(*args, **kwargs)` named none), `config`, `loss_type` (it counts the tokens of a
# causal LM's shifted labels for `num_items_in_batch`) and `main_input_name`, which FastModel
# forwards to the model, and `accepts_loss_kwargs`: Trainer passes `num_items_in_batch` to
# the forward only when the plan was made with that input (a 0-dim float32 tensor in the model
# file's `sample_inputs`), and otherwise lets the model average its loss itself.


def _takes_the_models_arguments(cls, signature):
    """Give `cls.forward` the model's forward `signature` for inspect.signature (NOTE:
    [Trainers]); the arguments are still bound by `_bind_inputs`."""
    first = inspect.Parameter("self", inspect.Parameter.POSITIONAL_OR_KEYWORD)
    cls.forward.__signature__ = signature.replace(parameters=[first, *signature.parameters.values()])


def _check_buffers(buffers, expected, device):
    """A buffer the plan reads must be where the parameters are (0-dim ones aside, which
    PyTorch takes from the CPU): a tensor kept as a plain attribute does not follow
    model.to(...) (NOTE: [Tensor attributes] in remat-dsl's capture)."""
    for value, (name, *_) in zip(buffers, expected):
        if value.device != device and value.dim() > 0:
            raise ValueError(
                f"buffer '{name}' is on {value.device} but the model's parameters are on {device}: move it there"
            )


def _lookup(named, expected, what):
    found = {_plan_name(name): value for name, value in named}
    values = []
    for name, _, shape, dtype, *_ in expected:
        value = found.get(name)
        if value is None:
            raise ValueError(_plan_again(f"the model has no {what} '{name}'"))
        if tuple(value.shape) != shape or value.dtype != dtype:
            raise ValueError(_plan_again(f"{what} '{name}' is {_type(value)}, the plan's is {_type_of(dtype, shape)}"))
        values.append(value)
    return values


def _type(value):
    return _type_of(value.dtype, value.shape)


def _type_of(dtype, shape):
    return f"{str(dtype).removeprefix('torch.')}{list(shape)}"


def _planned_type(dtype, shape):
    """`float32[B <= 16, 32]`: an input's type as the plan declares it."""
    sizes = [f"{d[0]} <= {d[1]}" if isinstance(d, tuple) else str(d) for d in shape]
    return f"{str(dtype).removeprefix('torch.')}[{', '.join(sizes)}]"


def _fits(actual, shape):
    """Whether sizes `actual` have the plan's rank and fixed sizes, where a (symbol, bound)
    of `shape` takes any size from 1 (NOTE: [Sizes that vary] in
    remat_dsl/plan/ir.py)."""
    if len(actual) != len(shape):
        return False
    return all(size >= 1 if isinstance(d, tuple) else size == d for size, d in zip(actual, shape))


def _device_of(params, kind):
    """The one device of the model's parameters, of the plan's `kind` (DEVICE_KIND)."""
    devices = {value.device for value in params}
    if len(devices) != 1:
        raise ValueError(
            f"the model's parameters are on {len(devices)} devices ({', '.join(sorted(map(str, devices)))}); the plan"
            " runs on one"
        )
    (device,) = devices
    if device.type != kind:
        raise ValueError(
            f"the model is on {device} but the plan was made for {kind}: move the model (model.to(...)) or plan again"
            f" for {device.type}"
        )
    return device


def _check_autocast(device, kind, planned):
    """Raise RuntimeError unless the caller's autocast state on `device` is the plan's:
    autocast to the dtype `planned` (AUTOCAST) on devices of `kind` (DEVICE_KIND), or off
    for `planned` None."""
    dtype = torch.get_autocast_dtype(device.type) if torch.is_autocast_enabled(device.type) else None
    if dtype == planned:
        return
    if planned is None:
        raise RuntimeError(
            f"autocast is on ({dtype}), but the plan was made without it: call the module outside torch.autocast, "
            f"or plan again under it (remat plan ... --autocast {_AUTOCAST_FLAGS.get(dtype, dtype)}) and regenerate"
        )
    state = f"autocast is on with {dtype}" if dtype is not None else "autocast is off"
    raise RuntimeError(
        f"the plan was made under torch.autocast({kind!r}, dtype={planned}) and {state}: call it under "
        f"torch.autocast({kind!r}, dtype={planned}), or plan again for this state and regenerate"
    )


_AUTOCAST_FLAGS = {torch.bfloat16: "bf16", torch.float16: "fp16"}


def _bind_inputs(signature, args, kwargs, device, planned, constants):
    """The plan's inputs, in the plan's order, from the arguments of the model's forward.

    planned: the plan's inputs (name, shape, dtype), as INPUTS; constants: {name: value} of
    the arguments that are not tensors, as CONSTANTS.  Raises TypeError for arguments the
    plan does not take or lacks, ValueError for another shape, dtype, device or constant."""
    try:
        bound = signature.bind(*args, **kwargs).arguments
    except TypeError as error:
        raise TypeError(f"FastModel takes the arguments of the model's forward {signature}: {error}") from None
    arguments, position = {}, 0
    for name, parameter in signature.parameters.items():
        if parameter.kind is inspect.Parameter.VAR_POSITIONAL:
            extra = bound.get(name, ())
            arguments.update((f"input_{position + i}", value) for i, value in enumerate(extra))
            position += len(extra)
        elif parameter.kind is inspect.Parameter.VAR_KEYWORD:
            arguments.update(bound.get(name, {}))
        elif name in bound:
            arguments[name] = bound[name]
            position += parameter.kind is not inspect.Parameter.KEYWORD_ONLY
    given, arguments = arguments, dict(_flat_arguments(arguments.items()))
    names = [name for name, _, _ in planned]
    inputs, sizes = [], {}
    for name, shape, dtype in planned:
        if name not in arguments:
            root = name.split(".")[0]
            held = [n for n in names if n.split(".")[0] == root]
            if root != name and root in given:
                raise TypeError(
                    f"the plan needs the argument '{name}': '{root}' is {type(given[root]).__name__}, where the plan "
                    f"takes a tuple, list or dict holding {', '.join(held)}"
                )
            raise TypeError(f"the plan needs the argument '{name}' (it was made for {', '.join(names)})")
        _check_input(name, arguments[name], shape, dtype, device, sizes)
        inputs.append(arguments[name])
    for name, value in arguments.items():
        if name in constants:
            expected = constants[name]
            if type(value) is not type(expected) or value != expected:
                raise ValueError(
                    f"the plan was made with {name}={expected!r}, not {value!r}: leave it out, or plan again with it"
                )
        elif name not in names:
            raise TypeError(
                f"the plan was made without the argument '{name}': pass only {', '.join(names)}, or plan again with it"
            )
    return inputs


def _flat_arguments(named):
    """(name, value) of each argument's leaves: a tuple's or a list's elements `NAME.INDEX`, a
    dict's `NAME.KEY`, nested in turn, as remat-dsl's capture names them (NOTE: [Nested
    arguments] in its capture)."""
    flat = []
    for name, value in named:
        if isinstance(value, dict):
            flat += _flat_arguments((f"{name}.{key}", item) for key, item in value.items())
        elif isinstance(value, (tuple, list)):
            flat += _flat_arguments((f"{name}.{index}", item) for index, item in enumerate(value))
        else:
            flat.append((name, value))
    return flat


def _output_type(path, where):
    """The class at `path` (module.Class) the model's output is built of, found among the
    modules already imported (the model's library imported it; nothing is imported here,
    and no module's own attribute lookup runs), and only a data container: a named tuple or
    a dataclass (Hugging Face's ModelOutput is one).  Raises TypeError otherwise, naming the
    plan's `outputs` line `where` (OUTPUTS_WHERE).  NOTE: [Plan text as data] in remat-dsl's code generator."""
    parts = path.split(".")
    found = None
    for cut in range(len(parts) - 1, 0, -1):
        module = sys.modules.get(".".join(parts[:cut]))
        if module is not None:
            found = module
            for part in parts[cut:]:
                found = vars(found).get(part) if isinstance(found, type) or hasattr(found, "__dict__") else None
            break
    if module is None or found is None:
        raise TypeError(
            f"the model's output is a {path} ({where}), which no module imported so far defines: import the "
            "library the model's output class comes from before FastModel(model), or plan again"
        )
    if not isinstance(found, type) or not (_is_named_tuple(found) or _is_dataclass(found)):
        raise TypeError(
            f"the plan's outputs ({where}) build the model's output with {path}, which is not a data container "
            "(a named tuple or a dataclass, such as a Hugging Face ModelOutput): plan again (remat plan ...) and "
            "regenerate; a plan's outputs cannot name another callable"
        )
    return found


def _is_named_tuple(cls):
    return issubclass(cls, tuple) and isinstance(vars(cls).get("_fields"), tuple)


def _is_dataclass(cls):
    return "__dataclass_fields__" in vars(cls)


def _check_input(name, value, shape, dtype, device, sizes):
    """Raise unless `value` may be the plan's input `name` (shape, dtype, device); binds in
    `sizes` ({symbol: size}) the size symbols its shape declares (NOTE: [Sizes that vary] in remat_dsl/plan/ir.py)."""
    if not isinstance(value, torch.Tensor):
        raise TypeError(f"input '{name}' must be a tensor, got {type(value).__name__}")
    if not _fits(tuple(value.shape), shape) or value.dtype != dtype:
        raise ValueError(
            f"input '{name}' is {_type(value)} but the plan was made for {_planned_type(dtype, shape)}: "
            "plan again for these shapes (remat plan ...)"
        )
    for size, planned in zip(value.shape, shape):
        if not isinstance(planned, tuple):
            continue
        symbol, bound = planned
        if size > bound:
            raise ValueError(
                f"input '{name}' is {_type(value)} but the plan was made for {_planned_type(dtype, shape)}: its size "
                f"{symbol} = {size} is above the largest the plan allows, {symbol} = {bound}: plan again with inputs "
                "that large (remat plan ...)"
            )
        if sizes.setdefault(symbol, size) != size:
            raise ValueError(
                f"input '{name}' is {_type(value)}, with {symbol} = {size}, but an input before it has {symbol} = "
                f"{sizes[symbol]}: the plan's inputs share the size {symbol} ({_planned_type(dtype, shape)})"
            )
    if value.device != device:
        raise ValueError(f"input '{name}' is on {value.device} but the model is on {device}: move the input there")
    if value.requires_grad:
        raise ValueError(
            f"input '{name}' requires grad, but the plan computes no gradient for inputs: plan a model that owns it as"
            " a parameter"
        )


def _check_parameters(params, parameters):
    """Raise unless each of `params` may run as the plan's (`parameters`, as PARAMETERS): a
    whole tensor (not a DTensor), and trainable only where the plan's was."""
    for value, (name, _, _, _, trainable) in zip(params, parameters):
        if hasattr(value, "device_mesh"):  # a DTensor left sharded: tensor parallelism, or FSDP2 not on the root
            raise NotImplementedError(
                f"parameter '{name}' is a DTensor (sharded): the plan runs on whole parameters; FastModel supports "
                "FSDP2 (fully_shard on the blocks, then on the model) and DDP, not tensor parallelism"
            )
        if value.requires_grad and not trainable:
            raise ValueError(_plan_again(f"parameter '{name}' requires grad, but the plan was made with it frozen"))


def _check_still_the_models(model, params, parameters):
    """The parameters looked up in FastModel(model) must still be the model's: one replaced
    since (a user may assign another) would be trained by nobody while the plan trains the
    old one.  Under FSDP2 they are looked up at every call instead (NOTE: [FSDP2])."""
    current = {id(value) for value in model.parameters()}
    for value, (name, *_) in zip(params, parameters):
        if id(value) not in current:
            raise RuntimeError(
                f"parameter '{name}' of the model is no longer the one FastModel(model) was built with (it was "
                "replaced afterwards): build FastModel(model) after such changes"
            )


def _versions(tensors):
    """The version counters of `tensors` (what the backward reads), to check in `_check_versions`.

    Under torch.compile there are none to keep: the compiled graph's own saved tensors are
    checked by autograd, and a version counter is not a value the graph can hold."""
    if torch.compiler.is_compiling():
        return ()
    return tuple(tensor._version for tensor in tensors)


def _check_versions(names, versions, tensors):
    """Raise RuntimeError if a tensor the backward reads changed in place since the forward
    (`names`: theirs, as WATCHED; `versions`: from `_versions`)."""
    for name, version, tensor in zip(names, versions, tensors):
        if tensor._version != version:
            raise RuntimeError(
                "one of the variables needed for gradient computation has been modified by an inplace operation: "
                f"'{name}' {_type(tensor)} is at version {tensor._version}; expected version {version} instead"
            )
