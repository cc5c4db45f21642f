"""Check a plan against its own graph and predict its peak memory and its time.

`simulate(plan)` replays the forward and then the backward section instruction by
instruction, following NOTE: [Instruction semantics] in `remat_dsl.plan.ir`.  It raises
`PlanError` at the first instruction that breaks a rule (with that instruction's span and
a hint how to fix it), and otherwise returns a `Simulation`: the device-memory timeline,
the peak, the predicted time and what crosses from forward to backward.
`with_predictions(plan, sim)` writes the predictions into the plan's header.

NOTE: [Memory model]
Device memory (bytes) is the sum of the resident tensors' `nbytes`; inputs, parameters,
buffers and the tangents (`grad_output.k`, the caller's gradients of the model outputs)
are not counted (they are the same in every plan; the zeros made for an absent tangent are
a temporary of each op that reads it: NOTE: [Gradient zeros] in remat_dsl.capture.fbgraph).
`compute`/`recompute OP` peaks at resident + all of OP's outputs + OP.temp_bytes; outputs
already resident are discarded right after the op.  An elementwise OP whose input dies
right after it writes its output into that input's storage and allocates nothing (NOTE:
[In-place outputs] in remat_dsl.plan.inplace).  A random op that is recomputed
somewhere in the plan saves its RNG state at its `compute` (`rng_state_bytes(device)`
bytes) and frees it after its last `recompute`; while it is recomputed, the generator's
current state is set aside (one more state) and restored after.  `prefetch` allocates on the device at
once; `offload` allocates on the host only (host copies are kept to the end of the step
and reported as `host_peak_bytes`; on a GPU the step's host copies are pinned groups held
from its start, counted as PyTorch's pinned allocator reserves them: NOTE: [Pinned host
memory] in remat_dsl.plan.hostmem).
With an optimizer in the step (NOTE: [Optimizer in the step] in remat_dsl.plan.optimizer),
the optimizer states of the parameters updated on the device are held through the whole
step, an `update` holds its temporaries while it runs, and a parameter's gradient is
no longer held to the end: it may be deleted after its update.  The parameters updated on
the host keep their master copy and their states in host memory for the whole step; on a
"cpu" device, host and device share one allocator, so a `host_update`'s temporaries are
counted in device memory too.
Paged optimizer states (NOTE: [Paged optimizer states] in remat_dsl.plan.optimizer) are
held in host memory through the step and on the device from their `prefetch_states` to the
`wait_states` after their `offload_states`.
NOTE: [Parameters on the host]
In a whole-step plan the parameters are counted in device memory, held through the step,
except those the plan prefetches: they live in host memory (the host copy of a parameter
updated on the host is the parameter itself, so `host_update` copies nothing back), and
are on the device from their `prefetch` to their `delete`, which each section has for
itself (none is on the device when the forward ends, or when the step does).  Such a
parameter is frozen, updated on the host, or updated on the device and written back:

    prefetch P ... wait P       its device copy, for its backward reads and its update
    update P                    in place on the device copy (its states paged or held)
    offload P                   d2h: the write-back, the updated device copy into P's host copy
    wait P                      the compute stream waits for the write-back
    delete P                    only now: the device copy is the one up-to-date P until then

For a parameter kept on the host, `offload P` is this write-back and nothing else: its
host copy always exists (it is the parameter), so there is no other copy it could make,
and a new verb would add a line to every table of instructions for the same d2h copy of
the same bytes.  The replay refuses it before `update P` (it would copy the old value)
and for a parameter not updated on the device (frozen, or updated on the host: the host
copy is already the new value), refuses `delete P` after `update P` until the write-back
is waited for, and so a device update without its write-back (thesis ch. 4, eq. 4.10:
the O-ILP offloads a parameter updated on the GPU back to the CPU after its update; eq.
4.21-4.22 time it on the d2h channel).  The write-back takes P's bytes / bandwidth on the
d2h stream, as an offload does, and adds no host memory (it writes P's own host copy).

NOTE: [Time model]
Four streams (compute, d2h, h2d and host), each with a clock in microseconds.
`compute`/`recompute` advance the compute stream by OP.time_us; `delete` takes no time.  `offload`/`prefetch T` take
ceil(T.nbytes / bandwidth * 1e6) us on their own stream and start when the stream and the
data are ready: at max(compute clock, that stream's clock); a prefetch needs a `wait` for
the offload of the same tensor before it, so it never starts before that offload has
finished (the generated module orders the host-to-device copy after the device-to-host
copy's event).  `wait T` moves the compute clock to the end
of T's transfer.  The plan's time is the makespan of the streams after the last
backward instruction; every transfer must be waited for before the step ends (a transfer
in flight at the end is an error at its line), so the makespan is the compute clock.
`update P` advances the compute stream by P's bytes / the header's device update speed;
`host_update P` runs on the `host` stream from max(compute clock, host clock) for the bytes
of P's master copy (fp32 at least: a bf16 parameter's are twice its own) / the host update
speed (the first of the step also for the header's overhead, the host's management time per
step), then copies P to the device on the h2d stream (P's
bytes / bandwidth); the step ends when the last of them does (thesis ch. 4, eq. 4.23).
`prefetch_states P` / `offload_states P` take their states' bytes / bandwidth on the h2d /
d2h stream as a prefetch / offload does (and the write-back `offload P` of a parameter kept
on the host, P's bytes), and `wait_states P` moves the compute clock to the
end of that transfer (thesis ch. 4, eq. 4.10, 4.21-4.22: PrfO, OflO).
"""

from __future__ import annotations

import dataclasses
import difflib
from dataclasses import dataclass, field
from typing import Any, NoReturn

from remat_dsl.plan import ir
from remat_dsl.plan.ir import DTYPE_ITEMSIZE, buffer_readers, iter_refs, op_refs
from remat_dsl.plan.errors import PlanError
from remat_dsl.plan.hostmem import host_copies
from remat_dsl.plan.inplace import inplace_candidates
from remat_dsl.plan.optimizer import Optimizer, OptimizerError, parse_optimizer

CPU_RNG_STATE_BYTES = 5056  # torch.get_rng_state() on CPU: a uint8 tensor of 5056 bytes


def rng_state_bytes(device: str) -> int:
    """Bytes one saved RNG state occupies on `device`: 5056 on "cpu", 0 elsewhere.

    On CUDA the generator state is a seed and an offset kept on the host.
    """
    return CPU_RNG_STATE_BYTES if device == "cpu" else 0


def value_nbytes(value: ir.ValueDecl) -> int:
    """Bytes of a contiguous input/parameter/buffer/tangent: prod(shape) x itemsize.

    Raises PlanError (at the declaration) for a dtype this module does not know.
    """
    itemsize = DTYPE_ITEMSIZE.get(value.dtype)
    if itemsize is None:
        raise PlanError(
            f"unknown dtype '{value.dtype}' of {value.kind} '{value.name}'",
            span=value.span,
            hint=_did_you_mean(value.dtype, DTYPE_ITEMSIZE) or "use a torch dtype name such as float32",
        )
    count = 1
    for dim in value.shape:
        count *= dim
    return count * itemsize


def transfer_us(nbytes: int, bandwidth: int) -> int:
    """Microseconds to copy `nbytes` bytes at `bandwidth` bytes/second, rounded up."""
    return -(-nbytes * 1_000_000 // bandwidth)


@dataclass(frozen=True)
class Step:
    """Device memory around one instruction (bytes).

    index: 1-based position in its section.  mem_peak: the most memory in use while the
    instruction runs.  live: (name, nbytes) of everything counted at the peak, largest
    first; filled only for the plan's peak step.

    NOTE: [Step events] What the instruction did to device memory, so that every reader of
    a plan (the memory chart by category, code generation, the placement of transfers)
    reads it here instead of replaying the instructions again.  Each is (key, bytes); a
    key is a tensor name or a label (`rng state of OP`, `temporaries of OP`, `rng state
    set aside while OP replays its own`):
      at_peak   what it holds at its peak on top of mem_before (every output of a compute,
                also those already resident; temporaries; the RNG state it saves or sets
                aside), so mem_peak = mem_before + their sum (delete: nothing);
      added     what is resident after it and was not before (new outputs, a prefetched
                tensor, a saved RNG state);
      removed   what it freed (a deleted tensor, an RNG state after its last replay);
    so mem_after = mem_before + sum(added) - sum(removed).
      into      the input whose storage a compute writes its output into (NOTE: [In-place
                outputs]): its output is added and that input removed, with the same bytes,
                and the `delete` of that input after it frees nothing; "" for none.
    """

    section: str
    index: int
    instruction: ir.Instruction
    mem_before: int
    mem_peak: int
    mem_after: int
    live: tuple[tuple[str, int], ...] = ()
    at_peak: tuple[tuple[str, int], ...] = ()
    added: tuple[tuple[str, int], ...] = ()
    removed: tuple[tuple[str, int], ...] = ()
    into: str = ""


@dataclass(frozen=True)
class Crossing:
    """What crosses from the forward section to the backward, in declaration order.

    resident: tensors on the device when the forward ends.  host: tensors with a host copy
    (offloaded) then.  rng: random ops whose saved RNG state is held then.  needed: the
    tensors of `resident` or `host` that the backward reads before making them again (what
    autograd would save).  saved: resident or host.
    """

    resident: tuple[str, ...] = ()
    host: tuple[str, ...] = ()
    rng: tuple[str, ...] = ()
    needed: tuple[str, ...] = ()
    saved: tuple[str, ...] = ()


@dataclass(frozen=True)
class Simulation:
    """What a valid plan does: peak device memory (bytes), time (microseconds), timeline.

    peak_at: "forward:K" / "backward:K", the 1-based index of the peak instruction
    ("forward:0" for a plan without instructions).  time_us: the compute stream's clock
    at the end.  compute_us / recompute_us: sums of op times of compute / recompute
    instructions.  transfer_us: sum of offload and prefetch durations.  host_peak_bytes:
    the most host memory (bytes) held by host copies, host updates' masters and states (on
    a GPU, the pinned groups as the allocator reserves them).  crossing: what the forward hands to
    the backward (`Crossing`).
    """

    peak_bytes: int
    peak_at: str
    time_us: int
    compute_us: int
    recompute_us: int
    transfer_us: int
    host_peak_bytes: int
    timeline: tuple[Step, ...]
    crossing: Crossing

    @property
    def saved(self) -> tuple[str, ...]:
        """Tensors resident or with a host copy when the forward ends, in declaration order."""
        return self.crossing.saved


def with_predictions(plan: ir.Plan, sim: Simulation) -> ir.Plan:
    """The plan with its header's peak, peak_at, time, compute and recompute set from `sim`."""
    header = dataclasses.replace(
        plan.header,
        peak_bytes=sim.peak_bytes,
        peak_at=sim.peak_at,
        time_us=sim.time_us,
        compute_us=sim.compute_us,
        recompute_us=sim.recompute_us,
    )
    return dataclasses.replace(plan, header=header)


def simulate(plan: ir.Plan, *, device: str | None = None, inplace: bool = True) -> Simulation:
    """Validate `plan` against its graph and predict its memory and time.

    device: overrides plan.header.device for the RNG-state size.  inplace: False counts
    every output as a new allocation, as eager PyTorch makes it (NOTE: [In-place outputs]).
    Raises PlanError at the first violated rule, in instruction order (see
    NOTE: [Instruction semantics] in remat_dsl.plan.ir, NOTE: [Memory model], NOTE: [Time model]).
    """
    graph = _GraphIndex(plan.graph)
    graph.check_refs()
    if not inplace:
        graph.inplace = {}
    sim = _Simulator(plan, graph, rng_state_bytes(device or plan.header.device))
    sim.run_section(ir.FORWARD, plan.forward)
    sim.end_forward(plan.forward)
    sim.run_section(ir.BACKWARD, plan.backward)
    sim.end_backward(plan.backward)
    return sim.result()


# ---------------------------------------------------------------------------
# The graph, indexed by name
# ---------------------------------------------------------------------------


def _did_you_mean(name: str, choices) -> str | None:
    choices = list(choices)
    if len(name) > 3 * max(map(len, choices), default=0):  # no match: a ratio >= 0.6 needs len(name) <= 2.33x;
        return None  # a 20 MB name kept difflib busy for seconds (NOTE: [Bounded messages] in remat_dsl/plan/errors.py)
    close = difflib.get_close_matches(name, choices, n=1)
    return f"did you mean '{close[0]}'?" if close else None


def _deletes_after(instructions: tuple[ir.Instruction, ...]) -> list[frozenset[str]]:
    """For each instruction, the tensors the `delete`s right after it (up to the next other
    instruction) free."""
    after: list[frozenset[str]] = []
    following: frozenset[str] = frozenset()
    for instr in reversed(instructions):
        after.append(following)
        following = following | {instr.target} if instr.verb == "delete" else frozenset()
    return after[::-1]


class _GraphIndex:
    """Name lookups over a Graph, plus the tensors that may never be deleted."""

    def __init__(self, graph: ir.Graph):
        self.graph = graph
        self.ops = graph.op_by_name
        self.tensors = graph.tensor_by_name
        self.values = {v.name: v for v in (*graph.inputs, *graph.parameters, *graph.buffers, *graph.tangents)}
        self.outputs = [ref for ref in iter_refs(graph.outputs) if ref.name in self.tensors]
        self.gradients = [ref for grad in graph.gradients for ref in iter_refs(grad.value) if ref.name in self.tensors]
        self.model_outputs = {ref.name for ref in self.outputs}
        self.parameter_gradients = {ref.name for ref in self.gradients}
        self.random_ops = [op.name for op in graph.ops if op.random]
        self.inplace = inplace_candidates(graph)  # NOTE: [In-place outputs]

    def check_refs(self) -> None:
        """Every Ref and tensor name in the graph resolves; raises PlanError at the first that does not."""
        known = {**self.values, **self.tensors}
        for op in self.graph.ops:
            self._check_op(op, known)
        for ref in iter_refs(self.graph.outputs):
            self._check_ref(ref, known, "the model outputs", None)
        parameters = {p.name for p in self.graph.parameters}
        for grad in self.graph.gradients:
            if grad.parameter not in parameters:
                raise PlanError(
                    f"gradient for unknown parameter '{grad.parameter}'",
                    span=grad.span,
                    hint=_did_you_mean(grad.parameter, parameters) or "declare it under parameters",
                    length=len(grad.parameter),
                )
            for ref in iter_refs(grad.value):
                self._check_ref(ref, known, f"the gradient of '{grad.parameter}'", grad.span)
        for tangent in self.graph.tangents:
            value_nbytes(tangent)
        for update in self.graph.updates:
            self._check_update(update)

    def _check_update(self, update: ir.BufferUpdate) -> None:
        buffers = {b.name for b in self.graph.buffers}
        if update.buffer not in buffers:
            raise PlanError(
                f"update of unknown buffer '{update.buffer}'",
                span=update.span,
                hint=_did_you_mean(update.buffer, buffers) or "declare it under buffers",
                length=len(update.buffer),
            )
        if update.tensor not in self.tensors:
            raise PlanError(
                f"buffer '{update.buffer}' is updated from unknown tensor '{update.tensor}'",
                span=update.span,
                hint=_did_you_mean(update.tensor, self.tensors) or "refer to a tensor of the graph",
            )

    def _check_op(self, op: ir.Op, known: dict) -> None:
        for out in op.outputs:
            if out not in self.tensors:
                raise PlanError(
                    f"output '{out}' of op '{op.name}' is not declared under tensors",
                    span=op.span,
                    hint=f"add a tensors entry '{out}' with producer {op.name}",
                )
        for ref in op_refs(op):
            self._check_ref(ref, known, f"the arguments of '{op.name}'", op.span)

    @staticmethod
    def _check_ref(ref: ir.Ref, known: dict, where: str, fallback: ir.Span | None) -> None:
        if ref.name in known:
            return
        raise PlanError(
            f"unknown value '%{ref.name}' in {where}",
            span=ref.span or fallback,
            hint=_did_you_mean(ref.name, known) or "refer to an input, parameter, buffer, tangent or tensor",
            length=len(ref.name) + 1 if ref.span else 1,
        )


# ---------------------------------------------------------------------------
# The replay
# ---------------------------------------------------------------------------


@dataclass
class _Transfer:
    """An offload or prefetch in flight: started at `where`, done at `end_us`."""

    kind: str
    end_us: int
    where: str
    span: ir.Span | None = None  # the offload's or prefetch's instruction span


@dataclass
class _Clocks:
    """Stream clocks and time sums (microseconds)."""

    streams: dict[str, int] = field(default_factory=lambda: dict.fromkeys(ir.STREAMS, 0))
    compute_us: int = 0
    recompute_us: int = 0
    transfer_us: int = 0


class _Simulator:
    """Replays a plan's sections; one method per verb, each guarding its rules first."""

    def __init__(self, plan: ir.Plan, graph: _GraphIndex, rng_bytes: int):
        self.plan = plan
        self.graph = graph
        self.rng_bytes = rng_bytes
        self.section = ir.FORWARD
        self.resident: dict[str, int] = {}  # tensor -> nbytes on the device
        self.rng: dict[str, int] = {}  # random op -> bytes of its saved RNG state
        self.computed: dict[str, str] = {}  # op -> where its compute is
        self.deleted_at: dict[str, str] = {}
        self.pending: dict[str, _Transfer] = {}
        self.offloaded_at: dict[str, str] = {}  # tensors with a host copy (or one in flight)
        self.host_ready: set[str] = set()  # host copies whose offload was waited for
        self.host_bytes = 0
        self.host_peak = 0
        self.clocks = _Clocks()
        self.steps: list[Step] = []
        self.peak: tuple[int, int] = (-1, -1)  # (bytes, index into steps)
        # what `peak_live` is made of, copied at each new peak
        self._peak_state: tuple[dict[str, int], dict[str, int], list[tuple[str, int]]] | None = None
        self.crossing = Crossing()
        self.made_in_backward: set[str] = set()
        self.needed: set[str] = set()
        self.last_recompute = self._last_random_recomputes(plan)
        self.current = 0  # device bytes in use now: resident + RNG states
        self.index = 0  # the instruction being replayed, 1-based in its section
        self.instr: ir.Instruction | None = None
        self._freed: list[tuple[str, int]] = []  # NOTE: [Step events] of the instruction replayed
        self._added: list[tuple[str, int]] = []
        self._held: list[tuple[str, int]] = []  # at_peak: what it holds above mem_before
        self._given: list[tuple[str, int]] = []  # the input an in-place op took the storage of
        self._dying: frozenset[str] = frozenset()  # what the deletes right after this instruction free
        self.moved: set[str] = set()  # inputs whose storage an output took; their delete frees nothing
        self.optimizer = self._optimizer(plan)
        self.updated: dict[str, str] = {}  # parameter -> where its update is
        self.on_device: set[str] = set()  # parameters updated by `update` (on the device)
        # NOTE: [Parameters on the host]: parameter -> where its write-back (`offload P`) started,
        # and the parameters whose write-back was waited for
        self.written_back: dict[str, str] = {}
        self.back_home: set[str] = set()
        # NOTE: [Stateful layers] in remat_dsl/capture/stateful.py: a buffer takes its new value
        # where the forward computes it; an op that reads the buffer after that would read it
        self.buffer_updates = {u.tensor: u.buffer for u in plan.graph.updates}
        self.written: dict[str, str] = {}  # buffer -> where the forward wrote its new value
        self.buffer_readers = buffer_readers(plan.graph)
        self.param_bytes = {p.name: value_nbytes(p) for p in plan.graph.parameters}
        # NOTE: [Pinned host memory] in remat_dsl/plan/hostmem.py: a GPU's host copies are pinned groups
        self.pinned = plan.header.device != "cpu"
        self.grad_refs = {  # trainable parameter -> the tensors its gradient is made of
            g.parameter: [r.name for r in iter_refs(g.value) if r.name in graph.tensors]
            for g in plan.graph.gradients
            if g.value is not None
        }
        self.states_bytes = 0  # the device's optimizer states, held through the step
        self.paged_live: dict[str, int] = {}  # the paged states on the device at the peak
        # NOTE: [Paged optimizer states] in remat_dsl/plan/optimizer.py
        self.paged = {i.target for i in plan.backward if i.verb == "prefetch_states" and i.target in self.param_bytes}
        self.states_here: dict[str, int] = {}  # paged parameter -> bytes of its states on the device now
        self.states_pending: dict[str, _Transfer] = {}  # paged parameter -> its states' transfer in flight
        self.states_moved: dict[str, str] = {}  # "prefetch_states P" / "offload_states P" -> where
        self.params_bytes = 0  # the parameters on the device through the whole step (whole-step plans)
        # NOTE: [Parameters on the host]: parameters the plan prefetches live in host memory
        self.streamed = {
            i.target for i in (*plan.forward, *plan.backward) if i.verb == "prefetch" and i.target in self.param_bytes
        }
        if self.optimizer is not None:
            opt = self.optimizer
            on_device = {i.target for i in plan.backward if i.verb == "update" and i.target in self.param_bytes}
            on_device -= self.paged
            on_host = {i.target for i in plan.backward if i.verb == "host_update" and i.target in self.param_bytes}
            self.states_bytes = sum(opt.state_bytes(self.param_bytes[p]) for p in on_device)
            self.params_bytes = sum(n for p, n in self.param_bytes.items() if p not in self.streamed)
            self.current = self.states_bytes + self.params_bytes
            # the host updates a master copy, in fp32 at least, with states of its dtype; a
            # parameter kept on the host is updated where it is (NOTE: [Optimizer in the step])
            self.master_bytes = {
                p.name: max(self.param_bytes[p.name], value_nbytes(dataclasses.replace(p, dtype="float32")))
                for p in plan.graph.parameters
                if p.name not in self.streamed
            }
            self.master_bytes.update((p, self.param_bytes[p]) for p in self.streamed)
            master = self.master_bytes
            # pageable: the host updates' masters and states; the parameters kept on the host
            # and the paged states are host copies of their own (NOTE: [Pinned host memory])
            self.host_bytes = sum(opt.state_bytes(master[p]) for p in on_host)
            self.host_bytes += sum(master[p] for p in on_host - self.streamed)
            if not self.pinned:
                self.host_bytes += sum(self.param_bytes[p] for p in self.streamed)
                self.host_bytes += sum(opt.state_bytes(self.param_bytes[p]) for p in self.paged)
            self.host_ready.update(self.streamed)
        if self.pinned:  # the groups, the step's pool among them, are held from the step's start
            self.host_bytes += host_copies(plan).nbytes(pinned=True)
        self.host_peak = self.host_bytes

    @staticmethod
    def _optimizer(plan: ir.Plan) -> Optimizer | None:
        if plan.header.optimizer is None:
            return None
        try:
            return parse_optimizer(plan.header.optimizer)
        except OptimizerError as e:
            hint = 'write e.g. `optimizer  "adamw lr=0.001"`'
            raise PlanError(f"bad optimizer in the header: {e}", hint=hint) from None

    def _last_random_recomputes(self, plan: ir.Plan) -> dict[str, tuple[str, int]]:
        """Random op -> (section, index) of its last recompute in the plan."""
        last = {}
        for section, instructions in ((ir.FORWARD, plan.forward), (ir.BACKWARD, plan.backward)):
            for index, instr in enumerate(instructions, 1):
                op = self.graph.ops.get(instr.target)
                if instr.verb == "recompute" and op is not None and op.random:
                    last[op.name] = (section, index)
        return last

    def _allocate(self, name: str, nbytes: int) -> None:
        self.resident[name] = nbytes
        self.current += nbytes

    def _release(self, name: str) -> int:
        nbytes = self.resident.pop(name)
        self.current -= nbytes
        return nbytes

    # -- sections -----------------------------------------------------------

    def run_section(self, section: str, instructions: tuple[ir.Instruction, ...]) -> None:
        """Replay one section, recording a Step per instruction."""
        self.section = section
        after = _deletes_after(instructions)
        for index, instr in enumerate(instructions, 1):
            self.index = index
            self.instr = instr
            self._freed, self._added, self._held, self._given = [], [], [], []
            self._dying = after[index - 1]
            self._check_verb_and_stream(instr)
            before = self.current
            peak, extra = HANDLERS[instr.verb](self, instr)
            removed = tuple(self._freed + self._given)
            into = self._given[0][0] if self._given else ""
            events: dict[str, Any] = dict(
                at_peak=tuple(self._held), added=tuple(self._added), removed=removed, into=into
            )
            self._record(
                Step(section, index, instr, before, max(peak, before, self.current), self.current, **events), extra
            )

    def end_forward(self, instructions: tuple[ir.Instruction, ...]) -> None:
        """Every forward op ran and every model output is resident; remember what is saved."""
        span = instructions[-1].span if instructions else None
        for op in self.plan.graph.ops:
            if op.phase == ir.FORWARD and op.name not in self.computed:
                self._fail(
                    f"forward op '{op.name}' is never computed in the forward section",
                    f"add `compute {op.name}` to the forward section{self._after_inputs(op)}",
                    span,
                )
        for ref in self.graph.outputs:
            if ref.name not in self.resident:
                self._fail(
                    f"model output '{ref.name}' is not resident at the end of the forward section",
                    f"compute or prefetch '{ref.name}' before the end of the forward section",
                    span,
                )
        for name in sorted(self.streamed & self.resident.keys()):
            self._fail(
                f"parameter '{name}' is still on the device at the end of the forward section",
                f"delete {name} after its last use in the forward, and prefetch it again in the backward",
                span,
            )
        names = [t.name for t in self.plan.graph.tensors]
        self.crossing = Crossing(
            resident=tuple(n for n in names if n in self.resident),
            host=tuple(n for n in names if n in self.offloaded_at),
            rng=tuple(sorted(self.rng)),
            saved=tuple(n for n in names if n in self.resident or n in self.offloaded_at),
        )

    def end_backward(self, instructions: tuple[ir.Instruction, ...]) -> None:
        """Every backward op ran and every parameter gradient is resident."""
        span = instructions[-1].span if instructions else None
        for op in self.plan.graph.ops:
            if op.phase == ir.BACKWARD and op.name not in self.computed:
                self._fail(
                    f"backward op '{op.name}' is never computed: the backward section ends here without it",
                    f"add `compute {op.name}` to the backward section{self._after_inputs(op)}",
                    span,
                )
        for name, transfer in self.pending.items():
            self._fail(
                f"the {transfer.kind} of '{name}' ({transfer.where}) is never waited for: the step would end "
                "with the transfer in flight, its data unordered with what follows",
                f"add `wait {name}` after it, before the end of the backward section, or remove it",
                transfer.span or span,
            )
        for name in sorted(self.streamed & self.resident.keys()):
            self._fail(
                f"parameter '{name}' is still on the device at the end of the step: the next step prefetches it",
                f"delete {name} after its last use in the backward",
                span,
            )
        self._end_paged(span)
        if self.optimizer is not None:
            for g in self.plan.graph.gradients:
                if g.value is not None and g.parameter not in self.updated:
                    made = [self.computed.get(self.graph.tensors[r].producer) for r in self.grad_refs[g.parameter]]
                    self._fail(
                        f"parameter '{g.parameter}' is never updated: the plan's optimizer must update every "
                        "trainable parameter once",
                        f"add `update {g.parameter}` to the backward section after its gradient is made"
                        + (f" ({', '.join(sorted(m for m in made if m))})" if any(made) else "")
                        + " and after its last read",
                        span,
                    )
            return
        for ref in self.graph.gradients:
            if ref.name not in self.resident:
                self._fail(
                    f"parameter gradient '{ref.name}' is not resident at the end of the backward section",
                    f"compute '{ref.name}' before the end of the backward section",
                    span,
                )

    def _after_inputs(self, op: ir.Op) -> str:
        """Where a missing compute of `op` belongs: after the compute of its last-computed input."""
        producers = {self.graph.tensors[r.name].producer for r in op_refs(op) if r.name in self.graph.tensors}
        order = [name for name in self.computed if name in producers]
        if not order:
            return ", after its inputs are computed"
        last = order[-1]
        return f", after `compute {last}` ({self.computed[last]}) and before its inputs are deleted"

    def result(self) -> Simulation:
        """The Simulation of the replayed plan."""
        peak_bytes, at = self.peak
        timeline = list(self.steps)
        if at >= 0:
            timeline[at] = dataclasses.replace(timeline[at], live=self.peak_live)
            peak_at = f"{timeline[at].section}:{timeline[at].index}"
        else:
            peak_bytes, peak_at = 0, f"{ir.FORWARD}:0"
        clocks = self.clocks
        return Simulation(
            peak_bytes=peak_bytes,
            peak_at=peak_at,
            time_us=max(clocks.streams.values()),
            compute_us=clocks.compute_us,
            recompute_us=clocks.recompute_us,
            transfer_us=clocks.transfer_us,
            host_peak_bytes=self.host_peak,
            timeline=tuple(timeline),
            crossing=dataclasses.replace(
                self.crossing, needed=tuple(n for n in self.crossing.saved if n in self.needed)
            ),
        )

    # -- helpers ------------------------------------------------------------

    def _fail(self, message: str, hint: str, span: ir.Span | None = None) -> NoReturn:
        """Raise PlanError at `span`; at the current instruction, the carets go under its target."""
        word = None
        if self.instr is not None and span is not None and span is self.instr.span:
            word = self.instr.target
        raise PlanError(message, span=span, hint=hint, word=word)

    def _where(self) -> str:
        """How messages name the current instruction: "line N", else "forward:K"."""
        assert self.instr is not None  # called while an instruction is replayed
        if self.instr.span is not None:
            return f"line {self.instr.span.line}"
        return f"{self.section}:{self.index}"

    def _record(self, step: Step, extra: list[tuple[str, int]]) -> None:
        """Append a step; at a new peak, snapshot what is live (resident + `extra`)."""
        self.steps.append(step)
        if step.mem_peak <= self.peak[0]:
            return
        self.peak = (step.mem_peak, len(self.steps) - 1)
        # copies only (C speed): sorting what is live at every new peak made a store-all
        # plan of 20,000 ops take 88 s to simulate; `peak_live` sorts the last one
        self._peak_state = (dict(self.resident), dict(self.rng), self._freed + extra)
        self.paged_live = dict(self.states_here)

    @property
    def peak_live(self) -> tuple[tuple[str, int], ...]:
        """What is live at the peak step, largest first (Step.live)."""
        if self._peak_state is None:
            return ()
        resident, rng, freed = self._peak_state
        live = list(resident.items())
        live += [(f"rng state of {op}", n) for op, n in rng.items()]
        live += freed  # freed by the peak's instruction: still live at its peak
        live += [("optimizer states on the device", self.states_bytes)] if self.states_bytes else []
        live += [(f"optimizer states of {p}", n) for p, n in self.paged_live.items()]
        live += [("parameters on the device", self.params_bytes)] if self.params_bytes else []
        return tuple(sorted((item for item in live if item[1]), key=lambda item: (-item[1], item[0])))

    def _check_verb_and_stream(self, instr: ir.Instruction) -> None:
        if instr.verb not in ir.INSTRUCTIONS:
            self._fail(
                f"unknown instruction '{instr.verb}'",
                _did_you_mean(instr.verb, ir.VERBS) or f"use one of {', '.join(ir.VERBS)}",
                instr.span,
            )
        verb = ir.INSTRUCTIONS[instr.verb]
        if verb.operand == "op":
            self._check_op_name(instr)
        elif verb.operand == "parameter":
            self._check_parameter_name(instr)
        else:
            self._check_tensor_name(instr)
        stream = verb.stream
        if instr.stream != stream:
            self._fail(
                f"{instr.verb} runs on the {stream} stream, not '{instr.stream}'",
                f"write `{instr.verb} {instr.target}`",
                instr.span,
            )

    def _check_op_name(self, instr: ir.Instruction) -> None:
        if instr.target in self.graph.ops:
            return
        what = "a tensor, not an op" if instr.target in self.graph.tensors else "not an op of the graph"
        if instr.target in self.graph.values:
            what = f"a {self.graph.values[instr.target].kind}, not an op"
        self._fail(
            f"cannot {instr.verb} '{instr.target}': it is {what}",
            _did_you_mean(instr.target, self.graph.ops) or "compute and recompute take an op name",
            instr.span,
        )

    def _check_tensor_name(self, instr: ir.Instruction) -> None:
        if instr.target in self.graph.tensors:
            return
        if (
            instr.target in self.param_bytes
            and instr.verb in ("prefetch", "wait", "delete", "offload")
            and self.optimizer
        ):
            if instr.target not in self.streamed:
                self._fail(
                    f"cannot {instr.verb} parameter '{instr.target}': the plan never prefetches it, so it stays on "
                    "the device for the whole step",
                    f"remove this line, or prefetch {instr.target} before each use",
                    instr.span,
                )
            return
        value = self.graph.values.get(instr.target)
        if value is not None:
            self._fail(
                f"cannot {instr.verb} '{instr.target}': it is a {value.kind}, which stays resident "
                "for the whole step",
                "remove this line; only tensors allocated by ops are scheduled"
                + (
                    " (parameters too in a plan of the whole step: `remat plan --optimizer`)"
                    if value.kind == "parameter"
                    else ""
                ),
                instr.span,
            )
        self._fail(
            f"cannot {instr.verb} '{instr.target}': it is not a tensor of the graph",
            _did_you_mean(instr.target, self.graph.tensors) or f"{instr.verb} takes a tensor name",
            instr.span,
        )

    # -- compute and recompute ---------------------------------------------

    def _compute(self, instr: ir.Instruction) -> tuple[int, list]:
        op = self.graph.ops[instr.target]
        self._check_first_run(op, instr)
        self._check_random_order(op, instr)
        self.computed[op.name] = self._where()
        if op.random and op.name in self.last_recompute:
            self.rng[op.name] = self.rng_bytes
            self.current += self.rng_bytes
            self._added.append((f"rng state of {op.name}", self.rng_bytes))
            self._held.append((f"rng state of {op.name}", self.rng_bytes))
        self.clocks.compute_us += op.time_us
        result = self._run_op(op, instr)
        if op.phase == ir.FORWARD:  # the generated module copies the update where it is computed
            self.written.update({self.buffer_updates[t]: self._where() for t in op.outputs if t in self.buffer_updates})
        return result

    def _recompute(self, instr: ir.Instruction) -> tuple[int, list]:
        op = self.graph.ops[instr.target]
        if op.phase != ir.FORWARD:
            where = self.computed.get(op.name)
            done = f" (it runs at {where})" if where else ""
            self._fail(
                f"backward op '{op.name}' cannot be recomputed{done}",
                "backward ops run exactly once: remove this line"
                + ("" if where else f", or write `compute {op.name}`"),
                instr.span,
            )
        if op.name not in self.computed:
            self._fail(
                f"recompute of '{op.name}' before its first compute",
                f"write `compute {op.name}` here: the first execution is a compute",
                instr.span,
            )
        self.clocks.recompute_us += op.time_us
        return self._run_op(op, instr)

    def _check_first_run(self, op: ir.Op, instr: ir.Instruction) -> None:
        where = self.computed.get(op.name)
        if op.phase == ir.FORWARD and self.section != ir.FORWARD:
            done = f" (its compute is at {where})" if where else ""
            self._fail(
                f"forward op '{op.name}' is computed in the backward section{done}",
                f"write `recompute {op.name}` here; its first compute belongs in forward",
                instr.span,
            )
        if op.phase == ir.BACKWARD and self.section != ir.BACKWARD:
            self._fail(
                f"backward op '{op.name}' is computed in the forward section",
                "move this line to the backward section",
                instr.span,
            )
        if where is not None:
            hint = (
                f"write `recompute {op.name}` to run it again"
                if op.phase == ir.FORWARD
                else "backward ops run exactly once: remove this line"
            )
            self._fail(f"'{op.name}' is already computed at {where}", hint, instr.span)

    def _check_random_order(self, op: ir.Op, instr: ir.Instruction) -> None:
        if not op.random:
            return
        expected = next(name for name in self.graph.random_ops if name not in self.computed)
        if expected != op.name:
            self._fail(
                f"random op '{op.name}' is computed before random op '{expected}'; random ops "
                "must run in graph order to draw the RNG stream as eager PyTorch does",
                f"move `compute {op.name}` after `compute {expected}`",
                instr.span,
            )

    def _run_op(self, op: ir.Op, instr: ir.Instruction) -> tuple[int, list]:
        """Check the arguments, allocate the outputs, discard duplicates; return (peak, extra live)."""
        for ref in op_refs(op):
            if ref.name in self.written and op.name in self.buffer_readers:
                self._fail(
                    f"'{op.name}' reads buffer '{ref.name}' after the forward wrote its new value "
                    f"({self.written[ref.name]}): it would read the next step's value",
                    "run it before that line, or keep its output instead of recomputing it "
                    f'(a constraint `keep "{next(iter(op.outputs), op.name)}"`)',
                    instr.span,
                )
            if ref.name in self.updated:
                self._fail(
                    f"'{op.name}' reads parameter '{ref.name}' after its update ({self.updated[ref.name]}), which "
                    "changed it in place: the step would use the next step's value",
                    f"move the update of {ref.name} after this line",
                    instr.span,
                )
            self._check_usable(ref.name, op, instr)
            if self.section == ir.BACKWARD and ref.name in self.graph.tensors and ref.name not in self.made_in_backward:
                self.needed.add(ref.name)
        out_bytes = [(name, self.graph.tensors[name].nbytes) for name in op.outputs]
        donor = self._donor(op)
        if donor:  # NOTE: [In-place outputs]: the output is written into the input's storage
            self._given.append((donor, self._release(donor)))
            self.moved.add(donor)
        replay = self.rng_bytes if op.random and instr.verb == "recompute" else 0  # the current state, kept aside
        peak = self.current + sum(n for _, n in out_bytes) + op.temp_bytes + replay
        extra = [(f"{name} (new copy)", n) for name, n in out_bytes if name in self.resident]
        extra += [(f"temporaries of {op.name}", op.temp_bytes)] if op.temp_bytes else []
        extra += [(f"rng state set aside while {op.name} replays its own", replay)] if replay else []
        self._held += ([] if donor else out_bytes) + [
            (label, n) for label, n in extra if not label.endswith("(new copy)")
        ]
        for name, nbytes in out_bytes:
            if name not in self.resident:
                self._allocate(name, nbytes)
                self._added.append((name, nbytes))
            if self.section == ir.BACKWARD:
                self.made_in_backward.add(name)
        self.clocks.streams[ir.COMPUTE_STREAM] += op.time_us
        if self.last_recompute.get(op.name) == (self.section, self.index) and instr.verb == "recompute":
            self._freed = [(f"rng state of {op.name}", self.rng.pop(op.name, 0))]
            self.current -= self._freed[0][1]
        return peak, extra

    def _donor(self, op: ir.Op) -> str:
        """The input `op` writes its output into (NOTE: [In-place outputs]), or "": one the
        deletes right after it free, resident, with no transfer in flight, and an output
        not resident already."""
        if op.outputs[0] in self.resident:
            return ""
        for name in self.graph.inplace.get(op.name, ()):
            if name in self._dying and name in self.resident and name not in self.pending:
                return name
        return ""

    def _check_usable(self, name: str, op: ir.Op, instr: ir.Instruction) -> None:
        """`name`, an argument of `op`, is on the device and not awaiting a prefetch."""
        value = self.graph.values.get(name)
        if name in self.streamed:  # NOTE: [Parameters on the host]
            transfer = self.pending.get(name)
            if name not in self.resident or transfer is not None:
                self._fail(
                    f"parameter '{name}' is used by '{op.name}' but is not on the device"
                    + (f": its prefetch ({transfer.where}) is in flight" if transfer else ""),
                    (
                        f"add `wait {name}` before this line"
                        if transfer
                        else f"add `prefetch {name}` and `wait {name}` before this line"
                    ),
                    instr.span,
                )
            return
        if value is not None:
            if value.kind == "tangent" and self.section != ir.BACKWARD:
                self._fail(
                    f"tangent '{name}' is used by '{op.name}' in the forward section; tangents exist "
                    "only in the backward section",
                    f"move this {instr.verb} to the backward section",
                    instr.span,
                )
            return
        producer = self.graph.tensors[name].producer
        transfer = self.pending.get(name)
        if transfer is not None and transfer.kind == "prefetch":
            self._fail(
                f"tensor '{name}' is used by '{op.name}' while its prefetch ({transfer.where}) is in flight",
                f"add `wait {name}` before this line",
                instr.span,
            )
        if name in self.resident:
            return
        deleted = self.deleted_at.get(name)
        if deleted is None:
            self._fail(
                f"tensor '{name}' is used by '{op.name}' but was never computed; "
                f"compute its producer '{producer}' first",
                f"add `compute {producer}` before this line",
                instr.span,
            )
        fixes = [f"move the delete at {deleted} after this line"]
        if name in self.host_ready:
            fixes.append(f"add `prefetch {name}` and `wait {name}` before this line (it has a host copy)")
        if self.graph.ops[producer].phase == ir.FORWARD:
            fixes.append(f"add `recompute {producer}` before this line")
        hint = ("either " if len(fixes) > 1 else "") + "; or ".join(fixes)
        if self.section == ir.BACKWARD and self.graph.ops[producer].phase == ir.FORWARD:
            self._fail(
                f"saved tensor '{name}' is missing at its backward use by '{op.name}': it was deleted at {deleted}",
                hint,
                instr.span,
            )
        self._fail(f"tensor '{name}' is used by '{op.name}' but was deleted at {deleted}", hint, instr.span)

    # -- delete, offload, prefetch, wait -----------------------------------

    def _delete(self, instr: ir.Instruction) -> tuple[int, list]:
        name = instr.target
        if name in self.graph.model_outputs:
            self._fail(
                f"cannot delete '{name}': it is a model output held by the caller",
                "remove this line",
                instr.span,
            )
        if name in self.graph.parameter_gradients and self.optimizer is None:
            self._fail(
                f"cannot delete '{name}': it is a parameter gradient returned to autograd",
                "remove this line",
                instr.span,
            )
        if name in self.moved:  # NOTE: [In-place outputs]: its storage is an output's now
            self.moved.discard(name)
            self.deleted_at[name] = self._where()
            return 0, []
        self._check_resident(name, instr)
        transfer = self.pending.get(name)
        if transfer is not None:
            self._fail(
                f"cannot delete '{name}' while its {transfer.kind} ({transfer.where}) is in flight",
                f"add `wait {name}` before this line",
                instr.span,
            )
        if name in self.on_device and name in self.streamed and name not in self.back_home:
            self._fail(
                f"cannot delete parameter '{name}': it was updated on the device ({self.updated[name]}) and its "
                "device copy is not written back to its host copy, so the next step would read the old value",
                f"add `offload {name}` and `wait {name}` (its write-back) before this line",
                instr.span,
            )
        self._freed = [(name, self._release(name))]
        self.deleted_at[name] = self._where()
        return 0, []

    def _check_resident(self, name: str, instr: ir.Instruction) -> None:
        if name in self.resident:
            return
        deleted = self.deleted_at.get(name)
        if deleted is not None:
            self._fail(
                f"cannot {instr.verb} '{name}': it was deleted at {deleted}",
                f"remove this line, or move it before the delete at {deleted}",
                instr.span,
            )
        if name in self.param_bytes:
            self._fail(
                f"cannot {instr.verb} parameter '{name}': it is not on the device", f"prefetch {name} first", instr.span
            )
        producer = self.graph.tensors[name].producer
        self._fail(
            f"cannot {instr.verb} '{name}': it was never computed",
            f"move this line after `compute {producer}`",
            instr.span,
        )

    def _offload(self, instr: ir.Instruction) -> tuple[int, list]:
        name = instr.target
        if name in self.streamed:
            return self._write_back(instr)
        self._check_resident(name, instr)
        if name in self.offloaded_at:
            self._fail(
                f"cannot offload '{name}': it already has a host copy (offloaded at {self.offloaded_at[name]})",
                "remove this line; prefetch reuses the existing host copy",
                instr.span,
            )
        self.offloaded_at[name] = self._where()
        if not self.pinned:  # on a GPU its slot of the step's pool is counted from the start
            self.host_bytes += self.resident[name]
            self.host_peak = max(self.host_peak, self.host_bytes)
        self._start_transfer("offload", name, instr)
        return 0, []

    def _write_back(self, instr: ir.Instruction) -> tuple[int, list]:
        """`offload P` of a parameter kept on the host: its updated device copy copied into
        its host copy (NOTE: [Parameters on the host])."""
        name = instr.target
        if name in self.written_back:
            self._fail(
                f"parameter '{name}' is written back twice (first at {self.written_back[name]})",
                "remove one of the two lines: a parameter updated on the device is written back once",
                instr.span,
            )
        if name in self.updated and name not in self.on_device:
            self._fail(
                f"cannot offload parameter '{name}': it is updated on the host ({self.updated[name]}), where it "
                "lives, so its host copy already holds the new value",
                "remove this line",
                instr.span,
            )
        if name not in self.on_device:
            self._fail(
                f"cannot offload parameter '{name}' before its update: the write-back would copy the old value "
                "into its host copy",
                f"move this line after `update {name}`"
                + ("" if name in self.grad_refs else f" (or remove it: {name} is frozen, its host copy is current)"),
                instr.span,
            )
        self._check_resident(name, instr)
        self.written_back[name] = self._where()
        self._start_transfer("write-back", name, instr)
        return 0, []

    def _prefetch(self, instr: ir.Instruction) -> tuple[int, list]:
        name = instr.target
        if name not in self.host_ready:
            started = self.offloaded_at.get(name)
            if started:
                hint = f"add `wait {name}` before this line"
            elif name in self.resident:
                hint = (
                    f"remove this line: {name} is still on the device (to keep it on the host meanwhile, "
                    f"`offload {name}`, `wait {name}` and `delete {name}` earlier)"
                )
            elif name in self.deleted_at:
                producer = self.graph.ops[self.graph.tensors[name].producer]
                hint = f"add `offload {name}` and `wait {name}` before its delete at " f"{self.deleted_at[name]}" + (
                    f", or `recompute {producer.name}` here instead" if producer.phase == ir.FORWARD else ""
                )
            else:
                hint = f"{name} was never computed: compute it, offload it and wait for the offload first"
            self._fail(
                f"cannot prefetch '{name}': "
                + (f"its offload ({started}) was not waited for" if started else "it has no host copy"),
                hint,
                instr.span,
            )
        if name in self.resident:
            self._fail(
                f"cannot prefetch '{name}': it is already resident on the device",
                f"remove this line, or delete {name} before it",
                instr.span,
            )
        nbytes = self._nbytes(name)
        self._allocate(name, nbytes)
        self._added.append((name, nbytes))
        self._held.append((name, nbytes))
        self._start_transfer("prefetch", name, instr)
        return 0, []

    def _start_transfer(
        self, kind: str, name: str, instr: ir.Instruction, nbytes: int | None = None, pending: dict | None = None
    ) -> None:
        """Start `kind` of `name` (`nbytes`: its bytes, a tensor's by default) on the
        instruction's stream, recorded in `pending` (the tensors' by default)."""
        bandwidth = self.plan.header.bandwidth
        if bandwidth <= 0:
            self._fail(
                f"cannot {kind} '{name}': the header's bandwidth is {bandwidth} B/s",
                "set `bandwidth` in the header to the host<->device bandwidth, e.g. `bandwidth 12 GB/s`",
                instr.span,
            )
        streams = self.clocks.streams
        duration = transfer_us(self._nbytes(name) if nbytes is None else nbytes, bandwidth)
        # its data is ready by the compute clock: the compute stream made the tensor (offload),
        # or waited for the offload before this prefetch (`_prefetch` requires that wait)
        end = max(streams[ir.COMPUTE_STREAM], streams[instr.stream]) + duration
        streams[instr.stream] = end
        self.clocks.transfer_us += duration
        (self.pending if pending is None else pending)[name] = _Transfer(kind, end, self._where(), instr.span)

    def _nbytes(self, name: str) -> int:
        """Bytes of a tensor, or of a parameter the plan prefetches."""
        tensor = self.graph.tensors.get(name)
        return tensor.nbytes if tensor is not None else self.param_bytes[name]

    def _wait(self, instr: ir.Instruction) -> tuple[int, list]:
        name = instr.target
        transfer = self.pending.pop(name, None)
        if transfer is None and name in self.on_device and name in self.streamed and name not in self.written_back:
            self._fail(
                f"nothing to wait for: parameter '{name}' was updated on the device ({self.updated[name]}) and "
                "never written back to its host copy",
                f"add `offload {name}` (its write-back) after `update {name}`, before this line",
                instr.span,
            )
        if transfer is None:
            self._fail(
                f"nothing to wait for: '{name}' has no offload or prefetch in flight",
                f"remove this line, or move it after the offload or prefetch of {name}",
                instr.span,
            )
        streams = self.clocks.streams
        streams[ir.COMPUTE_STREAM] = max(streams[ir.COMPUTE_STREAM], transfer.end_us)
        if transfer.kind == "offload":
            self.host_ready.add(name)
        if transfer.kind == "write-back":
            self.back_home.add(name)
        return 0, []

    # -- optimizer updates (NOTE: [Optimizer in the step]) --------------------

    def _check_parameter_name(self, instr: ir.Instruction) -> None:
        name = instr.target
        if self.optimizer is None:
            self._fail(
                f"cannot {instr.verb} '{name}': the plan names no optimizer",
                'add an `optimizer` line to the header (e.g. `optimizer  "adamw lr=0.001 ..."`, written by '
                "`remat plan --optimizer adamw`), or remove this line",
                instr.span,
            )
        if name not in self.param_bytes:
            what = "a tensor" if name in self.graph.tensors else "not a parameter of the graph"
            self._fail(
                f"cannot {instr.verb} '{name}': it is {what}",
                _did_you_mean(name, self.param_bytes) or f"{instr.verb} takes a trainable parameter's name",
                instr.span,
            )
        if name not in self.grad_refs:
            self._fail(
                f"cannot {instr.verb} '{name}': it has no gradient (frozen, or the loss does not reach it), "
                "so the optimizer does not update it",
                "remove this line",
                instr.span,
            )
        if self.section != ir.BACKWARD:
            self._fail(
                f"cannot {instr.verb} '{name}' in the forward section: its gradient is made in the backward",
                "move this line to the backward section, after its gradient is made",
                instr.span,
            )
        if name in self.updated and instr.verb in ("update", "host_update"):
            self._fail(
                f"parameter '{name}' is updated twice (first at {self.updated[name]}): the optimizer would "
                "take two steps",
                "remove one of the two lines",
                instr.span,
            )

    def _update(self, instr: ir.Instruction) -> tuple[int, list]:
        name = instr.target
        assert self.optimizer is not None  # _check_parameter_name
        if name in self.paged:
            self._check_states_ready(name, instr)
        if name in self.streamed:  # NOTE: [Parameters on the host]: its device copy is updated
            transfer = self.pending.get(name)
            if name not in self.resident or transfer is not None:
                self._fail(
                    f"cannot update '{name}' on the device: the plan keeps it in host memory and its device copy "
                    + (f"is not ready (its prefetch at {transfer.where} is not waited for)" if transfer else
                       "is not on the device here"),
                    (f"add `wait {name}` before this line" if transfer else
                     f"add `prefetch {name}` and `wait {name}` before this line, or write `host_update {name}`"),
                    instr.span,
                )  # fmt: skip
        for ref in self.grad_refs[name]:
            transfer = self.pending.get(ref)
            if ref not in self.resident or (transfer is not None and transfer.kind == "prefetch"):
                made = ref in self.made_in_backward
                self._fail(
                    f"cannot update '{name}': its gradient '{ref}' is not on the device"
                    + (f" (deleted at {self.deleted_at[ref]})" if ref in self.deleted_at else "")
                    + ("" if made or ref in self.deleted_at else " (not made yet)")
                    + (f" (its prefetch at {transfer.where} is not waited for)" if transfer else ""),
                    f"move this line after `compute {self.graph.tensors[ref].producer}` and before any delete of {ref}"
                    + (f", or write `host_update {name}` (it has a host copy)" if ref in self.host_ready else ""),
                    instr.span,
                )
        nbytes = self.param_bytes[name]
        temp = self.optimizer.temp_bytes(nbytes, cpu=self.plan.header.device == "cpu")
        self._held.append((f"temporaries of update {name}", temp))
        duration = -(-nbytes * 1_000_000 // self.plan.header.device_update) if self.plan.header.device_update else 0
        self.clocks.streams[ir.COMPUTE_STREAM] += duration
        self.clocks.compute_us += duration
        self.updated[name] = self._where()
        self.on_device.add(name)
        extra = [(f"temporaries of update {name}", temp)] if temp else []
        return self.current + temp, extra

    def _host_update(self, instr: ir.Instruction) -> tuple[int, list]:
        name = instr.target
        assert self.optimizer is not None  # _check_parameter_name
        if name in self.paged:
            self._fail(
                f"cannot host_update '{name}': the plan pages its optimizer states to the device "
                f"(prefetch_states at {self.states_moved.get('prefetch_states ' + name, 'a later line')})",
                f"write `update {name}`, or remove its prefetch_states, wait_states and offload_states lines",
                instr.span,
            )
        for ref in self.grad_refs[name]:
            if ref not in self.host_ready:
                started = self.offloaded_at.get(ref)
                self._fail(
                    f"cannot host_update '{name}': its gradient '{ref}' has no host copy"
                    + (f" yet: its offload ({started}) is not waited for" if started else ""),
                    (f"add `wait {ref}` before this line" if started else
                     f"add `offload {ref}` and `wait {ref}` before this line, or write `update {name}`"),
                    instr.span,
                )  # fmt: skip
        header = self.plan.header
        if header.host_update <= 0 or header.bandwidth <= 0:
            self._fail(
                f"cannot host_update '{name}': the header's update-speed gives no host speed or its bandwidth is 0",
                "set `update-speed  device ... host ... overhead ...` and `bandwidth` in the header",
                instr.span,
            )
        nbytes, master = self.param_bytes[name], self.master_bytes[name]
        streams = self.clocks.streams
        first = not any(self.plan.backward[i].verb == "host_update" for i in range(self.index - 1))
        run = -(-master * 1_000_000 // header.host_update) + (header.host_update_overhead_us if first else 0)
        end = max(streams[ir.COMPUTE_STREAM], streams[ir.HOST_STREAM]) + run
        streams[ir.HOST_STREAM] = end
        if name not in self.streamed:  # NOTE: [Parameters on the host]: its host copy is the parameter
            back = transfer_us(nbytes, header.bandwidth)
            streams[ir.H2D_STREAM] = max(streams[ir.H2D_STREAM], end) + back
            self.clocks.transfer_us += back
        self.updated[name] = self._where()
        temp = self.optimizer.temp_bytes(master, cpu=True) if header.device == "cpu" else 0
        if temp:  # one allocator for host and device on a CPU (NOTE: [Memory model])
            self._held.append((f"temporaries of host_update {name}", temp))
        return self.current + temp, [(f"temporaries of host_update {name}", temp)] if temp else []

    # -- paged optimizer states (NOTE: [Paged optimizer states] in remat_dsl/plan/optimizer.py) --

    def _check_states_ready(self, name: str, instr: ir.Instruction) -> None:
        """A paged update needs its states on the device, their prefetch waited for."""
        started = self.states_moved.get(f"prefetch_states {name}")
        if name not in self.states_here:
            self._fail(
                f"cannot update '{name}': its paged optimizer states are not on the device"
                + (f" (prefetched at {started}, offloaded since)" if started else ""),
                f"add `prefetch_states {name}` and `wait_states {name}` before this line",
                instr.span,
            )
        transfer = self.states_pending.get(name)
        if transfer is not None:
            self._fail(
                f"cannot update '{name}': the prefetch of its optimizer states ({transfer.where}) is not waited for",
                f"add `wait_states {name}` before this line",
                instr.span,
            )

    def _once(self, name: str, instr: ir.Instruction) -> None:
        """Each states transfer of a paged parameter is in the plan once."""
        key = f"{instr.verb} {name}"
        if key in self.states_moved:
            self._fail(
                f"the optimizer states of '{name}' are moved twice ({instr.verb} at {self.states_moved[key]})",
                "remove one of the two lines: a paged update prefetches its states once and offloads them once",
                instr.span,
            )
        self.states_moved[key] = self._where()

    def _prefetch_states(self, instr: ir.Instruction) -> tuple[int, list]:
        name = instr.target
        assert self.optimizer is not None  # _check_parameter_name
        self._once(name, instr)
        if name in self.updated:
            self._fail(
                f"cannot prefetch the optimizer states of '{name}' after its update ({self.updated[name]})",
                f"move this line before `update {name}`",
                instr.span,
            )
        nbytes = self.optimizer.state_bytes(self.param_bytes[name])
        self.states_here[name] = nbytes
        self.current += nbytes
        label = f"optimizer states of {name}"
        self._added.append((label, nbytes))
        self._held.append((label, nbytes))
        self._start_transfer("prefetch", name, instr, nbytes, self.states_pending)
        return 0, []

    def _check_paged(self, name: str, instr: ir.Instruction) -> None:
        if name not in self.paged:
            self._fail(
                f"cannot {instr.verb} '{name}': its optimizer states are not paged (no `prefetch_states {name}`)",
                f"remove this line, or add `prefetch_states {name}` and `wait_states {name}` before `update {name}`",
                instr.span,
            )

    def _offload_states(self, instr: ir.Instruction) -> tuple[int, list]:
        name = instr.target
        self._check_paged(name, instr)
        self._once(name, instr)
        if name not in self.updated or name not in self.states_here:
            self._fail(
                f"cannot offload the optimizer states of '{name}' before its update: the update's new states "
                "would not reach host memory",
                f"move this line after `update {name}`",
                instr.span,
            )
        self._start_transfer("offload", name, instr, self.states_here[name], self.states_pending)
        return 0, []

    def _wait_states(self, instr: ir.Instruction) -> tuple[int, list]:
        name = instr.target
        self._check_paged(name, instr)
        transfer = self.states_pending.pop(name, None)
        if transfer is None:
            self._fail(
                f"nothing to wait for: the optimizer states of '{name}' have no transfer in flight",
                f"remove this line, or move it after `prefetch_states {name}` or `offload_states {name}`",
                instr.span,
            )
        streams = self.clocks.streams
        streams[ir.COMPUTE_STREAM] = max(streams[ir.COMPUTE_STREAM], transfer.end_us)
        if transfer.kind == "offload":  # their host copy is written: the device copy is freed
            nbytes = self.states_here.pop(name)
            self.current -= nbytes
            self._freed.append((f"optimizer states of {name}", nbytes))
        return 0, []

    def _end_paged(self, span: ir.Span | None) -> None:
        """No paged states transfer is in flight, and none is left on the device, when the step ends."""
        for name, transfer in self.states_pending.items():
            self._fail(
                f"the {transfer.kind} of the optimizer states of '{name}' ({transfer.where}) is never waited for",
                f"add `wait_states {name}` after it, before the end of the backward section",
                transfer.span or span,
            )
        for name in self.states_here:
            self._fail(
                f"the optimizer states of '{name}' are still on the device at the end of the step: the next "
                "step's prefetch reads the host copy, which would miss this update",
                f"add `offload_states {name}` and `wait_states {name}` after `update {name}`",
                span,
            )


# The replay of each verb of ir.INSTRUCTIONS, called with the simulator and the instruction;
# it returns (device bytes at its peak, the (name, bytes) live at that peak beside the
# resident tensors).  tests/test_instructions.py checks that it has every verb and no other.
HANDLERS = {
    "compute": _Simulator._compute,
    "recompute": _Simulator._recompute,
    "delete": _Simulator._delete,
    "offload": _Simulator._offload,
    "prefetch": _Simulator._prefetch,
    "wait": _Simulator._wait,
    "update": _Simulator._update,
    "host_update": _Simulator._host_update,
    "prefetch_states": _Simulator._prefetch_states,
    "offload_states": _Simulator._offload_states,
    "wait_states": _Simulator._wait_states,
}
