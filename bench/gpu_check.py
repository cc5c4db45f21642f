"""GPU acceptance run (`make gpu-check`): plans, their modules and two baselines, measured
on one CUDA GPU against eager PyTorch, in at most 8 minutes.

For two models, on the GPU:

* a stock Hugging Face LlamaForCausalLM (hidden 2048, intermediate 8192, 16 heads, 8
  layers, vocabulary 32000: 0.67B parameters, in bf16), one sequence of 4096 tokens, its own
  causal-LM loss from `labels=`;
* examples/gpt2.py's GPT-2 (4 layers, fp32, dropout on), its next-token loss;

it captures the training step once (remat_dsl.capture_model, with the costs of the device
file that matches the GPU: remat_dsl.capture.gpus.device_for_gpu, else h100), plans it at
100% and 50% of the autograd peak and at the smallest feasible budget, with recomputation
alone (rockmate) and with offload (offmate, at the device file's host bandwidth), generates
each plan's module and trains one step with it.  For each module, and for eager PyTorch,
torch.utils.checkpoint around every decoder layer (Hugging Face's
`gradient_checkpointing_enable`, non-reentrant) and torch.compile with
`torch._functorch.config.activation_memory_budget = 0.5`, it prints:

* the loss and every parameter gradient against eager's, bit for bit (torch.equal), or the
  largest absolute difference and its reason;
* the predicted and the measured peak: torch.cuda.max_memory_allocated during one training
  step above what was allocated before it (the parameter gradients are made in the step);
* the predicted and the measured step time: CUDA events, the median of a few steps after
  a warm-up;
* for plans with transfers, how much of the host copies' time (Memcpy HtoD and DtoH in a
  torch.profiler trace) compute kernels on other streams overlap.

And for each model the whole step with AdamW in the plan (`Check.whole_step`): every
update on the GPU, and planned at 100% of the autograd peak (some parameters or states
in host memory); after 3 steps the parameters against eager AdamW's (bit for bit where
every update runs on the GPU), the absolute device peak of the last step, and the pinned
host memory the module holds against the checker's count (NOTE: [Pinned host memory]).

Every part is time-boxed: one that cannot finish in the time left is skipped, and the
whole run stops before `--time-limit` seconds with the table so far.  Exit status 0 when
everything ran and every plan's module trained exactly like eager (where eager repeats
its own bits), 1 otherwise.

Without a CUDA GPU it prints one line and exits 0.  `--cpu-smoke` runs the same code on
the CPU with tiny models (a 2-layer Llama, d=64; a 2-layer GPT-2), costs from the `cpu`
device file, peaks from the profiler's allocator events (remat_dsl.capture.measure), times
from the wall clock; it never writes the doc.

Writes its section of docs/measurements.md (bench/_common.py), unless `--no-write`.

Usage: python bench/gpu_check.py [--no-write] [--cpu-smoke] [--time-limit 450] [--steps 5]
"""

from __future__ import annotations

import time

STARTED = time.perf_counter()  # the time box counts from here: imports take seconds

import argparse  # noqa: E402
import contextlib  # noqa: E402
import functools  # noqa: E402
import gc  # noqa: E402
import json  # noqa: E402
import math  # noqa: E402
import os  # noqa: E402
import signal  # noqa: E402
import statistics  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import textwrap  # noqa: E402
import traceback  # noqa: E402
import warnings  # noqa: E402
from dataclasses import dataclass, replace  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any, Callable, Iterator  # noqa: E402

# cuBLAS is deterministic only with a fixed workspace, set before CUDA starts (PyTorch's
# "Reproducibility" notes): the whole run is under torch.use_deterministic_algorithms (main)
os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import ROOT, Report, add_write_flag  # noqa: E402

SCRIPT = "bench/gpu_check.py"
TITLE = "On a GPU: `make gpu-check`"
SKIP_LINE = "gpu-check: no CUDA GPU found (torch.cuda.is_available() is False): skipped"  # then torch's build
FALLBACK_DEVICE = "h100"  # the device file for a GPU that remat_dsl.capture.gpus does not know
SEED = 1234  # torch.manual_seed before every step: dropout draws the same masks
SMOKE_BANDWIDTH = None  # --cpu-smoke: the `cpu` device file's host_to_device
# the whole step's optimizer (NOTE: [Optimizer in the step] in remat_dsl/plan/optimizer.py),
# as the plan's header writes it and as eager makes it, and the steps trained with it
WHOLE_STEP_OPTIMIZER = "adamw lr=0.0001 weight_decay=0.01"
WHOLE_STEP_STEPS = 3


def eager_adamw(params):
    """WHOLE_STEP_OPTIMIZER as eager PyTorch makes it."""
    return torch.optim.AdamW(params, lr=1e-4, weight_decay=0.01)


ABOUT = """Stock Hugging Face Llama (0.67B parameters, bf16, 1 x 4096 tokens) and examples/gpt2.py on
the GPU: rockmate (recompute) and offmate (offload) plans at 100%, 50% and the smallest
feasible budget, costed by the GPU's device file; each module's loss and gradients against
eager's (bit for bit), predicted and measured peak (max_memory_allocated above the start of
the step) and step time (CUDA events, median after a warm-up), and the share of host-copy
time that compute on other streams overlaps (profiler trace); beside eager,
torch.utils.checkpoint per decoder layer and torch.compile at activation_memory_budget 0.5;
the whole step with AdamW (every update on the GPU, and at 100% of the autograd peak):
parameters after 3 steps against eager AdamW's, the step's absolute peak, the pinned host
memory against the plan's count (`pinned = predicted`). Everything runs under
torch.use_deterministic_algorithms(True, warn_only=True), so that all pick the same kernels.
GPT-2's loss runs outside its plan (the model returns logits): its memory is measured, not
predicted."""


# ---------------------------------------------------------------------------
# Time boxes
# ---------------------------------------------------------------------------


class OutOfTime(BaseException):
    """The run's time is up (a BaseException: library code that catches Exception lets it
    through)."""


class Skipped(Exception):
    """A part that would not finish in the time left."""


class Clock:
    """Seconds since the script started, a deadline, and each part's elapsed time."""

    def __init__(self, limit: float):
        self.limit = limit
        self.parts: list[tuple[str, float, str]] = []  # (part, seconds, outcome)

    def elapsed(self) -> float:
        return time.perf_counter() - STARTED

    def left(self) -> float:
        return self.limit - self.elapsed()

    def arm(self) -> None:
        """Raise OutOfTime in the main thread when the time is up (SIGALRM)."""

        def expired(signum, frame):
            raise OutOfTime(f"the time limit of {self.limit:.0f} s was reached")

        signal.signal(signal.SIGALRM, expired)
        signal.setitimer(signal.ITIMER_REAL, max(self.left(), 0.01))

    @staticmethod
    def disarm() -> None:
        signal.setitimer(signal.ITIMER_REAL, 0)

    @contextlib.contextmanager
    def part(self, name: str, needs: float) -> Iterator[None]:
        """Time the part `name`; raise Skipped before it starts when less than `needs`
        seconds are left."""
        if self.left() < needs:
            self.parts.append((name, 0.0, "skipped"))
            print(f"[{self.elapsed():6.1f} s] {name}: skipped, {self.left():.0f} s left, needs {needs:.0f} s")
            raise Skipped(f"skipped: {self.left():.0f} s left, needs about {needs:.0f} s")
        start = time.perf_counter()
        print(f"[{self.elapsed():6.1f} s] {name} ...", flush=True)
        outcome = "error"
        try:
            yield
            outcome = "ok"
        except OutOfTime:
            outcome = "stopped"
            raise
        finally:
            seconds = time.perf_counter() - start
            self.parts.append((name, seconds, outcome))
            print(f"[{self.elapsed():6.1f} s] {name}: {outcome} in {seconds:.1f} s", flush=True)


# ---------------------------------------------------------------------------
# The models
# ---------------------------------------------------------------------------


@dataclass
class Subject:
    """A model to check: its builder (on the device, in train mode), its forward's inputs,
    its loss from the output, and how long its parts take at most (seconds, for the time
    boxes)."""

    name: str
    about: str
    build: Callable[[], torch.nn.Module]
    inputs: Any  # a tuple (positional) or a dict (by name)
    loss_fn: Callable[[Any], torch.Tensor]
    needs: dict[str, float]


def llama(device: str, tiny: bool) -> Subject:
    """Stock LlamaForCausalLM: 0.67B parameters in bf16 and 1 x 4096 tokens, or a 2-layer
    d=64 one for --cpu-smoke."""
    from transformers import LlamaConfig, LlamaForCausalLM

    if tiny:
        shape = dict(num_hidden_layers=2, hidden_size=64, intermediate_size=176, num_attention_heads=4, vocab_size=256)
        tokens = 256
    else:
        shape = dict(num_hidden_layers=8, hidden_size=2048, intermediate_size=8192, num_attention_heads=16,
                     vocab_size=32000)  # fmt: skip
        tokens = 4096
    config = LlamaConfig(**shape, num_key_value_heads=shape["num_attention_heads"], max_position_embeddings=tokens)

    def build() -> torch.nn.Module:
        torch.manual_seed(0)
        with torch.device(device):  # initialised on the device: seconds, not a minute on the host
            model = LlamaForCausalLM(config)
        return model.to(torch.bfloat16).train()

    ids = torch.randint(0, config.vocab_size, (1, tokens), generator=torch.Generator().manual_seed(1)).to(device)
    layers, width = shape["num_hidden_layers"], shape["hidden_size"]
    about = f"LlamaForCausalLM, {layers} layers, d={width}, bf16, 1 x {tokens} tokens"
    needs = {"capture": 90, "smallest": 60, "plan": 30, "module": 30, "baseline": 15, "compile": 150, "step": 120}
    return Subject(
        "llama", about, build, {"input_ids": ids, "labels": ids, "use_cache": False}, lambda out: out.loss,
        _scaled(needs, tiny),
    )  # fmt: skip


def gpt2(device: str, tiny: bool) -> Subject:
    """examples/gpt2.py's GPT-2 (4 layers; 1 for --cpu-smoke, where 50% is then below the
    smallest budget: that path runs too), fp32, dropout on."""
    sys.path.insert(0, str(ROOT / "examples"))
    import gpt2 as example  # examples/gpt2.py

    layers = 1 if tiny else 4
    ids = example.sample_inputs()[0].to(device)

    def build() -> torch.nn.Module:
        return example.build_model(n_layer=layers).to(device).train()

    def loss_fn(logits: torch.Tensor) -> torch.Tensor:  # example.loss_fn, with its targets on the device
        return F.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]), ids[:, 1:].reshape(-1))

    about = f"examples/gpt2.py, {layers} layers, fp32, dropout 0.1, {ids.shape[0]} x {ids.shape[1]} tokens"
    needs = {"capture": 30, "smallest": 30, "plan": 15, "module": 15, "baseline": 10, "compile": 60, "step": 60}
    return Subject("gpt2", about, build, (ids,), loss_fn, _scaled(needs, tiny))


def _scaled(needs: dict[str, float], tiny: bool) -> dict[str, float]:
    """The GPU's time boxes, or the tiny models' (a tenth)."""
    return {k: v / 10 for k, v in needs.items()} if tiny else needs


def call(module: torch.nn.Module, inputs: Any) -> Any:
    return module(**inputs) if isinstance(inputs, dict) else module(*inputs)


# ---------------------------------------------------------------------------
# Measuring one module
# ---------------------------------------------------------------------------


@dataclass
class Row:
    """One line of the table.  Peaks in bytes, times in ms; None: not predicted or not
    measured."""

    model: str
    mode: str  # eager, recompute, offload, baseline
    run: str  # "rockmate 50%", "checkpoint", ...
    budget: str = "-"
    predicted_peak: int | None = None
    peak: int | None = None
    predicted_ms: float | None = None
    ms: float | None = None
    grads: str = "-"  # "exact", "differs [n]" or why nothing was compared
    overlap: str = "-"
    failed: bool = False  # counts against the exit status
    compute_ms: float | None = None  # a plan's predicted time of every op once: eager's


@dataclass
class Reference:
    """Eager PyTorch's loss and parameter gradients of one seeded step."""

    loss: torch.Tensor
    grads: dict[str, torch.Tensor | None]
    exact: bool | None = None  # whether eager repeats its own bits (the control row)


@dataclass
class Measured:
    peak: int
    ms: float
    exact: bool
    max_diff: float
    overlap: str


class Deterministic:
    """torch.use_deterministic_algorithms(True, warn_only=True) for the whole run (then
    the mode as it was), so that eager, the plans' modules and the baselines pick the
    same kernels everywhere (PyTorch picks some by this mode: cuDNN attention is not
    deterministic); `ops` are those PyTorch warned have no deterministic kernel."""

    def __init__(self) -> None:
        self.ops: list[str] = []
        self.others: list[str] = []

    @contextlib.contextmanager
    def on(self) -> Iterator[None]:
        was = torch.are_deterministic_algorithms_enabled()
        warn_only = torch.is_deterministic_algorithms_warn_only_enabled()
        torch.use_deterministic_algorithms(True, warn_only=True)
        try:
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("default")
                yield
        finally:
            torch.use_deterministic_algorithms(was, warn_only=warn_only)
            for warning in caught:
                text = str(warning.message)
                if "does not have a deterministic implementation" in text:
                    self.ops.append(text.split(" does not have")[0].strip()[:80])
                elif not issubclass(warning.category, FutureWarning):
                    self.others.append(f"{warning.category.__name__}: {text.splitlines()[0][:160]}")
            self.ops, self.others = list(dict.fromkeys(self.ops)), list(dict.fromkeys(self.others))


def train_step(module: torch.nn.Module, subject: Subject) -> torch.Tensor:
    """One training step as a user runs it: forward, loss, backward; returns the loss."""
    torch.manual_seed(SEED)
    loss = subject.loss_fn(call(module, subject.inputs))
    loss.backward()
    return loss.detach()


def reference(model: torch.nn.Module, subject: Subject) -> Reference:
    """Eager's loss and gradients."""
    model.zero_grad(set_to_none=True)
    loss = train_step(model, subject)
    grads = {n: None if p.grad is None else p.grad.detach().clone() for n, p in model.named_parameters()}
    model.zero_grad(set_to_none=True)
    return Reference(loss, grads)


def compared(model: torch.nn.Module, loss: torch.Tensor, ref: Reference) -> tuple[bool, float]:
    """(bit for bit equal, largest absolute difference) of `loss` and `model`'s gradients
    against the reference's."""
    pairs = [(loss, ref.loss)] + [(p.grad, ref.grads[n]) for n, p in model.named_parameters()]
    exact, worst = True, 0.0
    for a, b in pairs:
        if a is None or b is None:
            if (a is None) != (b is None):
                exact, worst = False, math.inf
            continue
        if not torch.equal(a, b):
            exact = False
            worst = max(worst, (a.double() - b.double()).abs().max().item())
    return exact, worst


def measure(
    module: torch.nn.Module,
    model: torch.nn.Module,
    subject: Subject,
    ref: Reference,
    cuda: bool,
    steps: int,
    warmups: int = 1,
    transfers: bool = False,
) -> Measured:
    """Warm `module` up, compare one step with the reference, measure one step's peak,
    time `steps` steps and, with `transfers`, trace one for the copies' overlap.  `model`
    holds the parameters (every module here shares them)."""
    from remat_dsl.capture.measure import peak_bytes

    def fresh() -> None:
        model.zero_grad(set_to_none=True)

    for _ in range(warmups):
        fresh()
        train_step(module, subject)
    fresh()
    loss = train_step(module, subject)
    exact, worst = compared(model, loss, ref)
    fresh()
    peak = peak_bytes(lambda: train_step(module, subject), "cuda" if cuda else "cpu")
    times = []
    for _ in range(steps):
        fresh()
        times.append(step_ms(lambda: train_step(module, subject), cuda))
    overlap = "-"
    if transfers:
        fresh()
        try:
            overlap = traced_overlap(lambda: train_step(module, subject), cuda)
        except Exception as error:  # the profiler (CUPTI) failed: the other figures stand
            overlap = f"n/a (profiler: {type(error).__name__}: {(str(error).splitlines() or [''])[0][:60]})"
    fresh()
    return Measured(peak, statistics.median(times), exact, worst, overlap)


def step_ms(step: Callable[[], Any], cuda: bool) -> float:
    """One call's time in ms: CUDA events around it on the GPU, else the wall clock."""
    if cuda:
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda.synchronize()
        start.record()
        step()
        end.record()
        end.synchronize()
        return start.elapsed_time(end)
    begin = time.perf_counter()
    step()
    return (time.perf_counter() - begin) * 1000


# ---------------------------------------------------------------------------
# Overlap of host copies with compute, from a profiler trace
# ---------------------------------------------------------------------------


def traced_overlap(step: Callable[[], Any], cuda: bool) -> str:
    """Run `step` under torch.profiler, export its Chrome trace and say how much of the
    host copies' time compute kernels on other streams overlap (transfer_overlap)."""
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with tempfile.TemporaryDirectory() as tmp:
        with profile(activities=activities) as prof:
            step()
            if cuda:
                torch.cuda.synchronize()
        path = Path(tmp) / "trace.json"
        prof.export_chrome_trace(str(path))
        events = json.loads(path.read_text()).get("traceEvents", [])
    found = transfer_overlap(events)
    if found is None:
        return "n/a (no copies traced)" if cuda else "n/a (cpu: copies are synchronous)"
    share, copy_us = found
    return f"{share:.0%} of {copy_us / 1000:.1f} ms"


def transfer_overlap(events: list[dict]) -> tuple[float, float] | None:
    """(share of copy time overlapped, copy time in us) of a Chrome trace's events (the
    format torch.profiler's export_chrome_trace writes: complete events, `ph` "X", with
    `ts` and `dur` in us; GPU work has `cat` "kernel" or "gpu_memcpy" and its stream in
    `args`).  A copy is a Memcpy HtoD or DtoH; the share is the time during which a kernel
    runs on another stream than the copy's, over all copies' time.  None: no copies."""
    copies: list[tuple[Any, float, float]] = []
    kernels: dict[Any, list[tuple[float, float]]] = {}
    for event in events:
        if event.get("ph") != "X" or "ts" not in event:
            continue
        category, name = event.get("cat", ""), event.get("name", "")
        stream = (event.get("args") or {}).get("stream", event.get("tid"))
        start = float(event["ts"])
        end = start + float(event.get("dur", 0))
        if category == "gpu_memcpy" and ("HtoD" in name or "DtoH" in name):
            copies.append((stream, start, end))
        elif category == "kernel":
            kernels.setdefault(stream, []).append((start, end))
    total = sum(end - start for _, start, end in copies)
    if not copies or total <= 0:
        return None
    busy: dict[Any, list[tuple[float, float]]] = {}
    covered = 0.0
    for stream, start, end in copies:
        if stream not in busy:
            busy[stream] = _union([span for s, spans in kernels.items() if s != stream for span in spans])
        covered += sum(max(0.0, min(end, b) - max(start, a)) for a, b in busy[stream])
    return covered / total, total


def _union(spans: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """The union of intervals, as sorted disjoint intervals."""
    merged: list[tuple[float, float]] = []
    for start, end in sorted(spans):
        if merged and start <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], end))
        else:
            merged.append((start, end))
    return merged


# ---------------------------------------------------------------------------
# One model: capture, plans, modules, baselines
# ---------------------------------------------------------------------------


class Check:
    """The whole run: its settings, rows, footnotes and whether something failed."""

    def __init__(self, args: argparse.Namespace, cuda: bool, clock: Clock, workdir: Path):
        self.args, self.cuda, self.clock, self.workdir = args, cuda, clock, workdir
        self.rows: list[Row] = []
        self.notes: list[str] = []
        self.device_name, self.device_line = plan_device(cuda)

    def note(self, text: str) -> str:
        """A footnote's marker, `[n]`, for `text` (the same text: the same marker)."""
        if text not in self.notes:
            self.notes.append(text)
        return f"[{self.notes.index(text) + 1}]"

    def failed_row(self, subject: Subject, mode: str, run: str, error: BaseException, budget: str = "-") -> Row:
        if isinstance(error, Skipped):
            text = str(error)
        else:
            text = f"error: {type(error).__name__}: {(str(error).splitlines() or [''])[0][:100]}"
            traceback.print_exception(error)
        row = Row(subject.name, mode, run, budget, grads=self.note(f"{subject.name} {run}: {text}"), failed=True)
        self.rows.append(row)
        return row

    def grads(
        self, subject: Subject, what: str, measured: Measured, ref: Reference, reason: str, counts: bool
    ) -> tuple[str, bool]:
        """The grads column, and whether it is a failure: `counts` (a plan's module) and
        eager repeats its own bits."""
        if measured.exact:
            return "exact", False
        why = reason
        if ref.exact is False:
            why = "eager itself does not repeat its bits here (no row can be compared bit for bit)"
        text = f"{subject.name} {what}: max |diff| {measured.max_diff:.3g}: {why}"
        return f"differs {self.note(text)}", counts and ref.exact is not False

    def run_subject(self, subject: Subject, compile_later: list) -> None:
        import remat_dsl
        from remat_dsl.capture.cost import load_device
        from remat_dsl.solve.driver import Planner  # the smallest budget is the driver's (bench/bounds.py)

        clock, needs = self.clock, subject.needs
        try:
            with clock.part(f"{subject.name}: build", needs["baseline"]):
                model = subject.build()
            with clock.part(f"{subject.name}: capture ({self.device_name} costs)", needs["capture"]):
                model_file = remat_dsl.model_of(model, subject.inputs, subject.loss_fn)
                captured = remat_dsl.capture_model(model_file, device=self.device_name)
            device_model = load_device(self.device_name)
            planner = Planner(
                captured.graph, model=model_file.spec, device=captured.device, host_link=True,
                bandwidth=int(device_model.host_to_device), time_limit=self.args.milp_seconds,
            )  # fmt: skip
            autograd = planner.autograd_peak
            with clock.part(f"{subject.name}: eager reference", needs["baseline"]):
                ref = reference(model, subject)
        except (Skipped, Exception) as error:
            self.failed_row(subject, "eager", "capture", error)
            return
        print(f"{subject.name}: {len(captured.graph.ops)} ops, autograd peak {_bytes(autograd)}")
        for line in captured.eager:  # NOTE: [Eager agreement]: where capture saw eager compute other bits
            self.note(f"{subject.name} capture: {line.strip()}")
        eager = self.baseline(subject, model, ref, "eager", "eager (control)", model, predicted_peak=autograd)
        if eager is not None:
            ref.exact = eager.exact
        seen: dict[tuple, tuple[str, Row]] = {}  # a schedule measured already: its run and row
        compute_ms = None
        for mode, solver in (("recompute", "rockmate"), ("offload", "offmate")):
            try:
                with clock.part(f"{subject.name}: {solver} smallest budget", needs["smallest"]):
                    smallest = planner.smallest_budget(solver)
            except (Skipped, Exception) as error:
                self.failed_row(subject, mode, f"{solver} min", error)
                smallest = None
            budgets = [("100%", autograd), ("50%", math.floor(autograd * 50 / 100))]
            budgets += [("min", smallest)] if smallest is not None else []
            for label, budget in budgets:
                run = f"{solver} {label}"
                shown = f"{budget / autograd:.1%}"
                try:
                    if smallest is not None and budget < smallest:
                        raise remat_dsl.BudgetError(budget, smallest, solver)
                    row = self.plan_row(subject, model, ref, planner, captured, mode, solver, label, budget, seen)
                except remat_dsl.BudgetError as error:  # a fact of the model, not a failure
                    below = f"below {solver}'s smallest budget ({error.smallest / autograd:.1%})"
                    marker = self.note(f"{subject.name} {run}: {below}")
                    self.rows.append(Row(subject.name, mode, run, shown, grads=marker))
                    continue
                except (Skipped, Exception) as error:
                    self.failed_row(subject, mode, run, error, shown)
                    continue
                compute_ms = compute_ms or row.compute_ms
        for run in ("adamw on the GPU", "adamw 100%"):
            self.whole_step(subject, model, planner, captured, run)
        if eager is not None and compute_ms is not None:
            for row in self.rows:
                if row.model == subject.name and row.mode == "eager":
                    row.predicted_ms = compute_ms
        ckpt = "checkpoint per layer"
        self.baseline(
            subject, model, ref, "baseline", ckpt, model, checkpointing=True,
            reason="torch.utils.checkpoint reran a layer's forward with other kernels or RNG state",
        )  # fmt: skip
        compile_later.append((subject, model, ref))

    def plan_row(self, subject, model, ref, planner, captured, mode, solver, label, budget, seen) -> Row:
        import remat_dsl

        clock, needs = self.clock, subject.needs
        run = f"{solver} {label}"
        with clock.part(f"{subject.name}: plan {run} ({_bytes(budget)})", needs["plan"]):
            plan = planner.plan(budget, solver)
            header = plan.header
            plan = replace(  # as remat_dsl.solve_captured leaves it: the capture's costs and eager notes
                plan, header=replace(header, costs=captured.costs, comments=header.comments + tuple(captured.eager))
            )
        transfers = sum(i.verb == "offload" for i in (*plan.forward, *plan.backward))
        row = Row(
            subject.name, mode, run, f"{budget / planner.autograd_peak:.1%}", header.peak_bytes, None,
            header.time_us / 1000,
        )  # fmt: skip
        row.compute_ms = header.compute_us / 1000
        schedule = tuple((i.verb, i.target) for i in (*plan.forward, *plan.backward))
        if schedule in seen:  # the same instructions: the same module, measured once
            other, measured_row = seen[schedule]
            row.peak, row.ms, row.grads, row.overlap, row.failed = (
                measured_row.peak, measured_row.ms, measured_row.grads, measured_row.overlap, measured_row.failed
            )
            row.run += " " + self.note(f"{subject.name} {run}: the schedule of {other}, measured once")
            self.rows.append(row)
            return row
        with clock.part(f"{subject.name}: module {run}, {transfers} offloads", needs["module"]):
            path = self.workdir / f"fast_{subject.name}_{solver}_{label.rstrip('%')}.py"
            path.write_text(remat_dsl.generate_module(plan))
            fast = remat_dsl.load_module(path).FastModel(model)
            measured = measure(fast, model, subject, ref, self.cuda, self.args.steps, transfers=transfers > 0)
            del fast
        row.peak, row.ms = measured.peak, measured.ms
        reason = "unexpected: the module ran other kernels or another order than eager (see the plan's ops)"
        counts = not captured.eager
        if captured.eager:
            reason = "capture saw eager compute other bits (the capture notes)"
        row.grads, row.failed = self.grads(subject, run, measured, ref, reason, counts)
        row.overlap = measured.overlap if transfers else "no transfers"
        seen[schedule] = (run, row)
        self.rows.append(row)
        _release(self.cuda)
        return row

    def whole_step(self, subject, model, planner, captured, run: str) -> None:
        """The whole step with AdamW in the plan (thesis ch. 4, `remat plan --optimizer`):
        `on the GPU`, every op once and every update on the device (the store-all plan with
        the updates `plan_step` lowers), or `100%`, planned at 100% of the autograd peak,
        which counts neither the parameters nor the optimizer states, so that some live in
        host memory or update there.  Eager AdamW and the
        plan's module each train WHOLE_STEP_STEPS steps from the same parameters; the row
        compares the parameters after them (bit for bit where every update runs on the
        GPU, as eager's), the last step's absolute device peak (max_memory_allocated, the
        module alone on the device) with the plan's, and the pinned host memory the module
        holds (torch.cuda.host_memory_stats, allocator-rounded) with the checker's count of
        its pinned groups (NOTE: [Pinned host memory] in remat_dsl/plan/hostmem.py)."""
        import copy

        import remat_dsl
        from remat_dsl.capture.cost import load_device
        from remat_dsl.plan.hostmem import host_copies
        from remat_dsl.plan.optimizer import parse_optimizer
        from remat_dsl.workflow import update_speeds

        clock, needs = self.clock, subject.needs
        budget = planner.autograd_peak
        on_gpu = run.endswith("GPU")
        shown = "-" if on_gpu else f"{budget / planner.autograd_peak:.1%}"
        optimizer = parse_optimizer(WHOLE_STEP_OPTIMIZER)
        speeds = update_speeds(optimizer, load_device(self.device_name), captured.device)
        try:
            with clock.part(f"{subject.name}: plan the whole step, {run}", needs["step"]):
                if on_gpu:
                    plan = _updates_on_the_device(captured, optimizer, speeds)
                else:
                    plan = planner.plan_step(budget, optimizer, speeds)
        except remat_dsl.BudgetError as error:  # a fact of the model, not a failure
            marker = self.note(f"{subject.name} step {run}: {str(error).splitlines()[0][:160]}")
            self.rows.append(Row(subject.name, "step", run, shown, grads=marker))
            return
        except (Skipped, Exception) as error:
            self.failed_row(subject, "step", run, error, shown)
            return
        verbs = {i.verb for i in plan.backward}
        placed = ", ".join(
            f"{sum(i.verb == verb for i in (*plan.forward, *plan.backward))} {verb}"
            for verb in ("update", "host_update", "prefetch_states", "prefetch", "offload")
        )
        row = Row(subject.name, "step", run, shown, plan.header.peak_bytes, None, plan.header.time_us / 1000)
        make = eager_adamw
        try:
            with clock.part(f"{subject.name}: whole step {run}: eager and the module ({placed})", needs["step"]):
                eager = copy.deepcopy(model)
                eager_opt = make(eager.parameters())
                for _ in range(WHOLE_STEP_STEPS):
                    train_step(eager, subject)
                    eager_opt.step()
                    eager_opt.zero_grad(set_to_none=True)
                expected = [p.detach().to("cpu", copy=True) for p in eager.parameters()]
                del eager, eager_opt
                _release(self.cuda)
                twin = copy.deepcopy(model)
                pinned_before = _pinned_bytes(self.cuda)
                path = self.workdir / f"fast_{subject.name}_step_{'gpu' if on_gpu else 'budget'}.py"
                path.write_text(remat_dsl.generate_module(plan))
                fast = remat_dsl.load_module(path).FastModel(twin, optimizer=make(twin.parameters()))
                one_step = functools.partial(train_step, fast, subject)
                for _ in range(WHOLE_STEP_STEPS - 1):
                    one_step()
                if self.cuda:
                    torch.cuda.synchronize()
                    torch.cuda.reset_peak_memory_stats()
                row.ms = step_ms(one_step, self.cuda)
                if self.cuda:
                    row.peak = torch.cuda.max_memory_allocated()  # absolute: the module's model alone
                pinned = _pinned_bytes(self.cuda) - pinned_before
                exact, worst = True, 0.0
                for a, b in zip(twin.parameters(), expected):
                    if not torch.equal(a.detach().cpu(), b):
                        exact, worst = False, max(worst, (a.detach().cpu().double() - b.double()).abs().max().item())
                del one_step, fast, twin
        except (Skipped, Exception) as error:
            self.failed_row(subject, "step", run, error, shown)
            return
        finally:
            _release(self.cuda)
        host = "host_update" in verbs
        if exact:
            row.grads = "exact"
        else:
            why = "updates on the host CPU (README: a tolerance)" if host else "unexpected: all updates on the GPU"
            text = f"{subject.name} step {run}: parameters after {WHOLE_STEP_STEPS} steps, max |diff| {worst:.3g}"
            row.grads, row.failed = f"differs {self.note(f'{text}: {why}')}", not host
        predicted = host_copies(plan).nbytes(pinned=True)
        if self.cuda:
            same = pinned == predicted
            counted = f"pinned host memory {_bytes(pinned)} ({pinned} B), the checker counts {predicted} B"
            row.overlap = "pinned = predicted" if same else f"pinned differs {self.note(f'{subject.name}: {counted}')}"
            row.failed = row.failed or not same
        else:
            row.overlap = f"pinned: none on the CPU (on a GPU {_bytes(predicted)})"
        self.note(f"{subject.name} step {run}: {placed}; peak predicted {_bytes(plan.header.peak_bytes)}")
        self.rows.append(row)

    def baseline(self, subject, model, ref, mode, run, module, *, predicted_peak=None, checkpointing=False,
                 compiled=False, reason="") -> Measured | None:  # fmt: skip
        """Measure `module` (eager, eager with checkpointing, compiled) as a row."""
        needs = subject.needs["compile" if compiled else "baseline"]
        try:
            with self.clock.part(f"{subject.name}: {run}", needs):
                if checkpointing:
                    with warnings.catch_warnings():  # transformers' FutureWarning: renamed in v6
                        warnings.simplefilter("ignore", FutureWarning)
                        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
                try:
                    measured = measure(
                        module, model, subject, ref, self.cuda, self.args.steps, warmups=2 if compiled else 1
                    )
                finally:
                    if checkpointing:
                        with warnings.catch_warnings():
                            warnings.simplefilter("ignore", FutureWarning)
                            model.gradient_checkpointing_disable()
        except (Skipped, Exception) as error:
            self.failed_row(subject, mode, run, error)
            return None
        row = Row(subject.name, mode, run, "-", predicted_peak, measured.peak, None, measured.ms)
        if mode == "eager":  # the control: eager against its own first step
            text = f"{subject.name} eager: max |diff| {measured.max_diff:.3g}: eager does not repeat its own bits here"
            row.grads = "exact" if measured.exact else f"differs {self.note(text)}"
        else:
            row.grads, row.failed = self.grads(subject, run, measured, ref, reason, counts=False)
        self.rows.append(row)
        _release(self.cuda)
        return measured

    def run_compile(self, subject: Subject, model: torch.nn.Module, ref: Reference) -> None:
        """torch.compile at activation_memory_budget 0.5 (inductor on the GPU; on the CPU
        aot_eager_decomp_partition: the same min-cut partitioner, no C++ compiler)."""
        backend = "inductor" if self.cuda else "aot_eager_decomp_partition"
        run = "compile budget 0.5"
        torch._dynamo.reset()  # the captures' graphs of the same code are not this one's
        compiled = torch.compile(model, backend=backend)
        reason = (
            f"expected: torch.compile ({backend}) fuses, decomposes and reorders floating-point work"
            + (" and draws dropout masks with its own RNG" if subject.name == "gpt2" else "")
        )
        with torch._functorch.config.patch(activation_memory_budget=0.5):
            self.baseline(subject, model, ref, "baseline", run, compiled, compiled=True, reason=reason)


def plan_device(cuda: bool) -> tuple[str, str]:
    """(the device file to plan with, a line saying why): the one that matches this GPU
    (remat_dsl.capture.gpus), else FALLBACK_DEVICE; `cpu` for --cpu-smoke."""
    from remat_dsl.capture.gpus import device_for_gpu

    if not cuda:
        return "cpu", "costs from the `cpu` device file (--cpu-smoke)"
    gpu = torch.cuda.get_device_name()
    found = device_for_gpu(gpu)
    if found is None:
        return FALLBACK_DEVICE, f"costs from `{FALLBACK_DEVICE}`: no shipped device file matches {gpu!r}"
    return found, f"costs from the `{found}` device file (matched to {gpu!r})"


def _updates_on_the_device(captured, optimizer, speeds):
    """The whole step with every op once and every update on the device: the store-all plan
    of the activations (the graph without its gradient lines, as Planner.plan_step plans
    them) with the updates the lowering adds (remat_dsl.solve.lowering.add_updates)."""
    from remat_dsl.check.replay import simulate, with_predictions
    from remat_dsl.solve.driver import Planner
    from remat_dsl.solve.lowering import add_updates

    graph = captured.graph
    activations = Planner(replace(graph, gradients=()), device=captured.device).plan(1 << 50, "rockmate")
    plan = add_updates(replace(activations, graph=graph), optimizer.text(), set(), speeds, 0)
    simulated = with_predictions(plan, simulate(plan))
    return replace(simulated, header=replace(simulated.header, budget=simulated.header.peak_bytes))


def _pinned_bytes(cuda: bool) -> int:
    """Bytes of pinned host memory PyTorch's allocator holds, its cache of free blocks
    emptied first (0 on the CPU)."""
    if not cuda:
        return 0
    torch.cuda.synchronize()
    torch.accelerator.empty_host_cache()
    return int(torch.cuda.host_memory_stats().get("allocated_bytes.current", 0))


def _release(cuda: bool) -> None:
    gc.collect()
    if cuda:
        torch.cuda.empty_cache()


def _bytes(n: int) -> str:
    from remat_dsl.plan.units import human_bytes

    return human_bytes(n)


# ---------------------------------------------------------------------------
# The table
# ---------------------------------------------------------------------------


def table(rows: list[Row]) -> list[str]:
    head = (
        f"{'model':<6} {'mode':<9} {'run':<24} {'budget':>7} {'peak: predicted':>15} {'measured':>10}"
        f" {'ratio':>6} {'step ms: predicted':>18} {'measured':>9} {'grads':<12} transfers overlapped"
    )
    lines = [head]
    for r in rows:
        ratio = f"{r.peak / r.predicted_peak:.3f}" if r.peak and r.predicted_peak else "-"
        lines.append(
            f"{r.model:<6} {r.mode:<9} {r.run:<24} {r.budget:>7} {_or(r.predicted_peak, _bytes):>15}"
            f" {_or(r.peak, _bytes):>10} {ratio:>6} {_or(r.predicted_ms, '{:.2f}'.format):>18}"
            f" {_or(r.ms, '{:.2f}'.format):>9} {r.grads:<12} {r.overlap}"
        )
    return lines


def _or(value, shown: Callable[[Any], str]) -> str:
    return "-" if value is None else shown(value)


# ---------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    parser = add_write_flag(argparse.ArgumentParser(description=__doc__.splitlines()[0]))
    parser.add_argument("--cpu-smoke", action="store_true", help="the same code on the CPU, tiny models; never writes")
    parser.add_argument("--time-limit", type=float, default=None, help="seconds for the whole run (default 450; 300)")
    parser.add_argument("--steps", type=int, default=None, help="timed steps per module (default 5; --cpu-smoke 2)")
    parser.add_argument("--milp-seconds", type=float, default=20.0, help="time limit of each MILP solve")
    args = parser.parse_args(argv)
    cuda = torch.cuda.is_available() and not args.cpu_smoke
    if not cuda and not args.cpu_smoke:
        print(f"{SKIP_LINE} (torch {torch.__version__}, built for CUDA {torch.version.cuda or 'no'})")
        return 0
    args.steps = args.steps or (5 if cuda else 2)
    clock = Clock(args.time_limit or (450.0 if cuda else 300.0))
    report = Report(SCRIPT, TITLE, ABOUT)
    device = "cuda" if cuda else "cpu"
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    compile_later: list[tuple[Subject, torch.nn.Module, Reference]] = []
    subjects = [llama(device, not cuda), gpt2(device, not cuda)]
    stopped = None
    determinism = Deterministic()
    with tempfile.TemporaryDirectory() as tmp:
        check = Check(args, cuda, clock, Path(tmp))
        print(check.device_line)
        clock.arm()
        try:
            with determinism.on():
                for subject in subjects:
                    check.run_subject(subject, compile_later)
                # last, the quickest first: the slowest parts, and the first to go when time runs out
                for subject, model, ref in sorted(compile_later, key=lambda entry: entry[0].needs["compile"]):
                    check.run_compile(subject, model, ref)
        except OutOfTime as error:
            stopped = str(error)
        finally:
            clock.disarm()
            from remat_dsl.solve.solvers.ilp import workers

            workers.stop()
            compile_later.clear()
    for subject in subjects:
        report.line(f"{subject.name}: {subject.about}")
    report.line(
        check.device_line + f"; {args.steps} timed steps per module after a warm-up;"
        " torch.use_deterministic_algorithms(True, warn_only=True) throughout"
    )
    for line in table(check.rows):
        report.line(line)
    for number, text in enumerate(check.notes, 1):
        report.line(f"[{number}] {text}")
    if determinism.ops:
        report.line(f"ops PyTorch ran without a deterministic kernel: {', '.join(determinism.ops)}")
    for text in determinism.others:
        print(text, file=sys.stderr)
    ran = ", ".join(f"{name} {seconds:.0f} s" + ("" if outcome == "ok" else f" ({outcome})")
                    for name, seconds, outcome in clock.parts)  # fmt: skip
    for line in textwrap.wrap(f"elapsed: {ran}", width=118, subsequent_indent="  "):
        report.line(line)
    failures = [r for r in check.rows if r.failed]
    verdict = "PASS" if not stopped and not failures else "FAIL"
    why = [stopped] if stopped else []
    why += [f"{len(failures)} row(s) failed: {', '.join(f'{r.model} {r.run}' for r in failures)}"] if failures else []
    report.line(f"{verdict}: {clock.elapsed():.0f} s in all" + (f"; {'; '.join(why)}" if why else ""))
    if args.cpu_smoke:
        print("(--cpu-smoke: docs/measurements.md left as it is)", file=sys.stderr)
    else:
        report.write(args)
    return 0 if verdict == "PASS" else 1


if __name__ == "__main__":
    sys.exit(main())
