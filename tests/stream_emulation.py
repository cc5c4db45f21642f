"""A test-only stand-in for torch.cuda's streams that runs a generated module's stream code
on CPU tensors, with real concurrency, and reports every unordered access.

`Emulation().running(module)` replaces the module's one seam (`_cuda`, `_streamed`: NOTE:
[Streams] in remat_dsl/codegen/runtime.py), so the module's own `_offload`, `_prefetch`, `_wait`
and `_HostBuffer` run unchanged:

- The compute stream is the calling thread: its ops run at once.  Its `wait_event` does not
  block; an op blocks only when it touches bytes that a side-stream copy it waited for has
  not finished (so the host runs ahead of the copies, as it does on CUDA).
- Each side stream is a worker thread running its queue in order: copies, waits for events
  (the worker blocks until the event's work is done) and event records.
- A copy completes late on purpose: it reads its source when it starts, fills its
  destination with poison (NaN for floats), and writes it only when something waits for it
  (an event after it is waited for, or a compute op needs its bytes; after `patience`
  seconds otherwise), `delay` seconds later.  A reader that is not ordered after it reads
  poison.
- A TorchDispatchMode sees every aten op of the calling thread: a `copy_` inside
  `with _cuda.stream(side)` is queued on that side stream; any other op there (an
  allocation) is reported, since its block would join the side stream's allocator pool.

Ordering is checked exactly, not by luck of timing: every stream keeps a vector clock (how
many items of each stream are ordered before its next one), events carry the clock of
their record, and two accesses to overlapping bytes, one a write, must be ordered by it.
Compute ops, copies and their byte ranges are tracked; `problems` lists each unordered pair
with the plan lines that issued them.  On exit it also checks, from the copies' measured
start and end times, that no bytes were written while another copy read or wrote them.

The caching allocator is modelled by its one rule that matters here: a block freed while
a copy on another stream still uses it goes back to the compute stream's pool, so the
program must not drop its last reference before the compute stream waited for that copy
(a copy holds its own alias, so CPU memory stays valid; the emulation checks the storage's
use count at every compute op).  Kernels' own asynchrony is not modelled: compute ops run
synchronously.
"""

from __future__ import annotations

import contextlib
import linecache
import queue
import re
import sys
import threading
import time
from dataclasses import dataclass, field

import torch
from torch.utils._python_dispatch import TorchDispatchMode

COPY = torch.ops.aten.copy_.default


def _byte_range(tensor: torch.Tensor) -> tuple[int, int]:
    """[start, end) of the bytes `tensor` can touch, as addresses."""
    if tensor.numel() == 0:
        return (tensor.data_ptr(), tensor.data_ptr())
    extent = 1 + sum((size - 1) * stride for size, stride in zip(tensor.shape, tensor.stride()))
    return (tensor.data_ptr(), tensor.data_ptr() + extent * tensor.element_size())


def _overlap(a: tuple[int, int], b: tuple[int, int]) -> bool:
    return a[0] < b[1] and b[0] < a[1]


def _poison(tensor: torch.Tensor) -> None:
    if tensor.is_floating_point() or tensor.is_complex():
        tensor.fill_(float("nan"))
    elif tensor.dtype == torch.bool:
        tensor.fill_(True)
    else:
        tensor.fill_(torch.iinfo(tensor.dtype).max)


def _merge(clock: dict, other: dict) -> None:
    for stream, seq in other.items():
        if clock.get(stream, 0) < seq:
            clock[stream] = seq


class _Event:
    """torch.cuda.Event: `vc` the clock at its record (None: never recorded), `stream` the
    stream it was recorded on; `done` set when the recorded work has run; a compute-stream
    event also waits for `after`, the events the compute stream had waited for."""

    def __init__(self, emulation: Emulation):
        self.emulation = emulation
        self.vc: dict | None = None
        self.stream: _Stream | None = None
        self.done = threading.Event()
        self.after: list[_Event] = []

    def record(self, stream=None) -> None:
        (stream or self.emulation.current_stream()).record_event(self)

    def query(self) -> bool:
        return self.vc is None or (self.done.is_set() and all(e.query() for e in self.after))

    def synchronize(self) -> None:
        if self.vc is None:  # CUDA: waiting for an event never recorded returns at once
            return
        self.stream.demand(self.vc[self.stream])
        self.done.wait()
        for event in self.after:
            event.synchronize()


@dataclass(eq=False)
class _Copy:
    """A copy queued on a side stream: `seq` its place there, `vc` what is ordered before
    it, `reads`/`writes` byte ranges, `where` the plan line that issued it."""

    stream: _SideStream
    seq: int
    vc: dict
    dst: torch.Tensor | None  # aliases of the program's tensors (None once pruned)
    src: torch.Tensor | None
    reads: tuple[int, int]
    writes: tuple[int, int]
    where: str
    done: threading.Event = field(default_factory=threading.Event)
    freed_reported: bool = False
    started: float = 0.0
    ended: float = 0.0


class _Stream:
    """What side and compute streams share: a clock, events, waits."""

    def __init__(self, emulation: Emulation, label: str):
        self.emulation, self.label = emulation, label
        self.clock: dict[_Stream, int] = {}

    def record_event(self, event: _Event | None = None) -> _Event:
        event = event or _Event(self.emulation)
        with self.emulation.lock:
            self._record(event)
        return event

    def wait_stream(self, other: _Stream) -> None:
        self.wait_event(other.record_event())

    def wait_event(self, event: _Event) -> None:
        if event.vc is None:
            return
        with self.emulation.lock:
            _merge(self.clock, event.vc)
            self._wait(event)

    def __repr__(self) -> str:
        return self.emulation.name(self)


class _ComputeStream(_Stream):
    """The calling thread; `waited`: the events it waits for (it blocks only on data)."""

    def __init__(self, emulation: Emulation):
        super().__init__(emulation, "compute")
        self.waited: list[_Event] = []

    def _record(self, event: _Event) -> None:
        event.vc, event.stream = dict(self.clock), self
        event.vc.setdefault(self, 0)
        event.after = [e for e in self.waited if not e.query()]
        event.done.set()

    def demand(self, seq: int) -> None:
        pass  # its work ran when it was issued

    def _wait(self, event: _Event) -> None:
        self.waited = [e for e in self.waited if not e.query()] + [event]


class _SideStream(_Stream):
    """A worker thread running its queue in order."""

    def __init__(self, emulation: Emulation, label: str):
        super().__init__(emulation, label)
        self.seq = 0
        self.demanded = 0  # items up to this one are waited for: they must not hold back
        self.due = threading.Condition()
        self.queue: queue.Queue = queue.Queue()
        self.thread = threading.Thread(target=self._run, name=label, daemon=True)
        self.thread.start()

    def _next(self) -> int:
        self.seq += 1
        self.clock[self] = self.seq
        return self.seq

    def _record(self, event: _Event) -> None:
        self._next()
        event.vc, event.stream = dict(self.clock), self
        self.queue.put(("record", event))

    def demand(self, seq: int) -> None:
        with self.due:
            self.demanded = max(self.demanded, seq)
            self.due.notify_all()

    def _wait(self, event: _Event) -> None:
        self._next()
        self.queue.put(("wait", event))

    def enqueue_copy(self, dst: torch.Tensor, src: torch.Tensor) -> torch.Tensor:
        emulation = self.emulation
        with emulation.lock:
            seq = self._next()
            copy = _Copy(
                self,
                seq,
                dict(self.clock),
                dst.detach(),
                src.detach(),
                _byte_range(src),
                _byte_range(dst),
                emulation.where(),
            )
            emulation.check_issue(copy)
            emulation.copies.append(copy)
            emulation.history.append(copy)
        self.queue.put(("copy", copy))
        return dst

    def synchronize(self) -> None:
        self.record_event().synchronize()

    def _run(self) -> None:
        while True:
            kind, item = self.queue.get()
            if kind == "stop":
                return
            if kind == "wait":
                item.synchronize()
            elif kind == "record":
                item.done.set()
            else:
                self._copy(item)

    def _copy(self, copy: _Copy) -> None:
        copy.started = time.monotonic()
        data = copy.src.clone()  # the copy reads its source as it starts ...
        _poison(copy.dst)
        with self.due:
            if not self.due.wait_for(lambda: self.demanded >= copy.seq, timeout=self.emulation.patience):
                self.emulation.unwaited.append(copy)
        time.sleep(self.emulation.delay)
        copy.dst.copy_(data)  # ... and writes its destination only when it is due
        copy.ended = time.monotonic()
        copy.done.set()


class _Mode(TorchDispatchMode):
    """Routes side-stream copies to their stream; checks compute ops against the copies."""

    def __init__(self, emulation: Emulation):
        super().__init__()
        self.emulation = emulation

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        emulation = self.emulation
        stream = emulation.current_stream()
        if isinstance(stream, _SideStream):
            if func is COPY:
                return stream.enqueue_copy(args[0], args[1])
            if not func.is_view:
                emulation.report(
                    f"{func} runs inside `with stream({stream})` at {emulation.where()}: "
                    "only copies belong there (an allocation joins that stream's pool)"
                )
            return func(*args, **kwargs)
        if func.is_view:
            return func(*args, **kwargs)
        reads = [t for t in _tensors([*args, *kwargs.values()]) if t.device.type == "cpu"]
        writes = [
            t
            for t, arg in zip(args, func._schema.arguments)
            if isinstance(t, torch.Tensor) and arg.alias_info is not None and arg.alias_info.is_write
        ]
        emulation.compute_op(func, reads, writes)
        out = func(*args, **kwargs)
        emulation.compute_made([t for t in _tensors([out]) if t.device.type == "cpu"])
        return out


def _tensors(values):
    for value in values:
        if isinstance(value, torch.Tensor):
            yield value
        elif isinstance(value, (list, tuple)):
            yield from _tensors(value)


class Emulation:
    """The `_cuda` a generated module calls, on CPU tensors; see the module docstring.

    delay: seconds a copy takes once it is due; patience: seconds after which a copy nobody
    waits for completes anyway.  problems: every unordered access found.
    """

    def __init__(self, delay: float = 0.005, patience: float = 5.0):
        self.delay, self.patience = delay, patience
        self.lock = threading.RLock()
        self.compute = _ComputeStream(self)
        self.side: list[_SideStream] = []
        self.copies: list[_Copy] = []  # the copies later accesses are checked against
        self.history: list[_Copy] = []  # every copy, for the check of times
        self.problems: list[str] = []
        self.unwaited: list[_Copy] = []  # copies that completed after `patience`, nobody waiting
        self.last_write: dict[int, int] = {}  # storage address -> compute op (seq) that last wrote it
        self.last_read: dict[int, int] = {}
        self.module = None
        self.names: dict[_Stream, str] = {}
        self.local = threading.local()

    # -- the torch.cuda surface the template uses -------------------------------------

    def Stream(self, device=None) -> _SideStream:  # noqa: N802 (torch.cuda.Stream)
        stream = _SideStream(self, f"side stream {len(self.side) + 1}")
        self.side.append(stream)
        return stream

    def Event(self) -> _Event:  # noqa: N802 (torch.cuda.Event)
        return _Event(self)

    def current_stream(self, device=None) -> _Stream:
        return getattr(self.local, "stream", None) or self.compute

    @contextlib.contextmanager
    def stream(self, stream: _Stream):
        before = getattr(self.local, "stream", None)
        self.local.stream = stream
        try:
            yield stream
        finally:
            self.local.stream = before

    def synchronize(self, device=None) -> None:
        for stream in self.side:
            stream.synchronize()

    # -- running a module ----------------------------------------------------------------

    @contextlib.contextmanager
    def running(self, module):
        """Run `module`'s stream path on CPU tensors in this emulation; on exit, wait for
        every stream and add the copies that overlapped in time to `problems`."""
        saved = module._cuda, module._streamed, dict(module._STREAMS)
        module._cuda, module._streamed = self, lambda device: True
        module._STREAMS.clear()  # the module's side streams are this emulation's while it runs
        self.module = module
        try:
            with _Mode(self):
                yield self
        finally:
            self.synchronize()
            with self.lock:
                self._check_frees(self._live())
            for stream in self.side:
                stream.queue.put(("stop", None))
                stream.thread.join()
            self.names.update({stream: name for (name, _), stream in module._STREAMS.items()})
            module._cuda, module._streamed = saved[:2]
            module._STREAMS.clear()
            module._STREAMS.update(saved[2])
            self._check_overlaps_in_time()

    def name(self, stream: _Stream) -> str:
        """`d2h`, `h2d` (the module's names for its side streams) or `compute`."""
        if stream not in self.names and self.module is not None:
            self.names.update({value: name for (name, _), value in self.module._STREAMS.items()})
        return self.names.get(stream, stream.label)

    def where(self) -> str:
        """The plan line of the generated statement running now (its `# PLAN:LINE`)."""
        frame = sys._getframe(1)
        path = getattr(self.module, "__file__", None)
        while frame is not None:
            if frame.f_code.co_filename == path and frame.f_code.co_name in ("_forward", "_backward"):
                match = re.search(r"#\s*(\S+:\d+)", linecache.getline(path, frame.f_lineno))
                return match.group(1) if match else f"line {frame.f_lineno} of the module"
            frame = frame.f_back
        return "outside the plan"

    def report(self, problem: str) -> None:
        with self.lock:
            self.problems.append(problem)

    # -- the checks ------------------------------------------------------------------

    def _live(self) -> list[_Copy]:
        """Copies that a later access could still be unordered with: not yet done, or not
        yet ordered before everything every stream issues from now on."""
        streams = [self.compute, *self.side]
        live = []
        for copy in self.copies:
            if copy.done.is_set() and all(s.clock.get(copy.stream, 0) >= copy.seq for s in streams):
                copy.src = copy.dst = None  # pruned: its aliases go
            else:
                live.append(copy)
        self.copies = live
        return live

    def check_issue(self, copy: _Copy) -> None:
        """A copy just issued is ordered after the compute ops and the copies that touched
        its bytes before."""
        label = f"the {self.name(copy.stream)} copy at {copy.where}"
        ordered = copy.vc.get(self.compute, 0)
        src, dst = copy.src.untyped_storage().data_ptr(), copy.dst.untyped_storage().data_ptr()
        if self.last_write.get(src, 0) > ordered:
            self.report(f"{label} reads a tensor the compute stream wrote, without waiting for it")
        if max(self.last_write.get(dst, 0), self.last_read.get(dst, 0)) > ordered:
            self.report(f"{label} writes memory the compute stream used, without waiting for it")
        for other in self._live():
            if other.stream is copy.stream or copy.vc.get(other.stream, 0) >= other.seq:
                continue
            other_label = f"the {self.name(other.stream)} copy at {other.where}"
            if _overlap(copy.reads, other.writes):
                self.report(
                    f"{label} reads bytes {self._bytes(copy.reads, copy.src)} that {other_label} writes, unordered"
                )
            if _overlap(copy.writes, other.writes) or _overlap(copy.writes, other.reads):
                self.report(
                    f"{label} writes bytes {self._bytes(copy.writes, copy.dst)} "
                    f"that {other_label} reads or writes, unordered"
                )

    def compute_op(self, func, reads: list[torch.Tensor], writes: list[torch.Tensor]) -> None:
        """A compute op is about to read `reads` and write `writes` (`reads` has them too):
        it must be ordered after the copies that touch those bytes (it blocks until they
        finish) and after every copy whose memory the program has freed."""
        pending = []
        with self.lock:
            self.compute.clock[self.compute] = self.compute.clock.get(self.compute, 0) + 1
            seq = self.compute.clock[self.compute]
            live = self._live()
            self._check_frees(live)
            for tensor in reads:
                writing = any(tensor is w for w in writes)
                span = _byte_range(tensor)
                for copy in live:
                    if not (_overlap(span, copy.writes) or (writing and _overlap(span, copy.reads))):
                        continue
                    if self.compute.clock.get(copy.stream, 0) >= copy.seq:
                        pending.append(copy)
                    else:
                        verb = "writes" if writing else "reads"
                        self.report(
                            f"{func} at {self.where()} {verb} bytes of the {self.name(copy.stream)} copy "
                            f"at {copy.where}, with no wait for it"
                        )
                (self.last_write if writing else self.last_read)[tensor.untyped_storage().data_ptr()] = seq
        for copy in pending:
            copy.stream.demand(copy.seq)
            copy.done.wait()

    def compute_made(self, outputs: list[torch.Tensor]) -> None:
        """The op just run wrote `outputs` (new tensors, or its in-place arguments)."""
        with self.lock:
            seq = self.compute.clock[self.compute]
            for tensor in outputs:
                self.last_write[tensor.untyped_storage().data_ptr()] = seq

    def _check_frees(self, live: list[_Copy]) -> None:
        """The caching allocator's rule (see the module docstring): the program holds the
        memory of every copy the compute stream has not waited for."""
        for copy in live:
            if copy.freed_reported or self.compute.clock.get(copy.stream, 0) >= copy.seq:
                continue
            for alias in (copy.src, copy.dst):
                # uses of the storage: the program's tensors, our alias, and the temporary storage object
                if torch._C._storage_Use_Count(alias.untyped_storage()._cdata) <= 2:
                    copy.freed_reported = True
                    self.report(
                        f"the program freed a tensor of the {self.name(copy.stream)} copy at {copy.where} before the "
                        f"compute stream waited for it (noticed at {self.where()}): the allocator may reuse its block"
                    )
                    break

    def _bytes(self, span: tuple[int, int], tensor: torch.Tensor) -> str:
        """`[a, b) of a host group` (or of a tensor): `span` within `tensor`'s storage."""
        storage = tensor.untyped_storage()
        what = "a host group" if storage.nbytes() in getattr(self.module, "POOL_GROUPS", ()) else "a tensor"
        return f"[{span[0] - storage.data_ptr()}, {span[1] - storage.data_ptr()}) of {what}"

    def _check_overlaps_in_time(self) -> None:
        """From the measured times: no bytes written by one copy while another read or wrote them."""
        done = sorted(self.history, key=lambda c: c.started)
        for i, a in enumerate(done):
            for b in done[i + 1 :]:
                if b.started >= a.ended:
                    break
                if _overlap(a.writes, b.writes) or _overlap(a.writes, b.reads) or _overlap(a.reads, b.writes):
                    self.report(
                        f"the {self.name(a.stream)} copy at {a.where} and the {self.name(b.stream)} copy at "
                        f"{b.where} touched the same bytes at the same time"
                    )
