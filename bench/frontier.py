"""Memory/time frontier: our solvers against torch.utils.checkpoint and torch.compile.

For each model (GPT-2 with 6 and 12 layers, the nn.Transformer, the ResNet and the U-Net of
examples/), in ONE run, this measures the peak memory and the iteration time of a training
step (forward + backward) relative to eager PyTorch for:

* our plans (`make_plan(..., solver=NAME)`, module from `remat_dsl.codegen.generate.generate`):
  `autograd` and `checkpoint-sqrt` (one schedule each, whatever the budget), and `rotor`,
  `rockmate`, `hiremate` over a sweep of budgets, 100/80/70/60/50/40/30 % of the autograd
  plan's peak, plus the smallest feasible budget ("min": `smallest_budget(..., "rotor")` for rotor,
  `BudgetError.smallest` for the others).  A solver that is not in
  `remat_dsl.solve.registry.NAMES` is listed as skipped; an infeasible budget is a row that says
  so, with the smallest feasible budget.  Plans with the same schedule share one module;
* torch.utils.checkpoint (non-reentrant) around every repeated block ("every block":
  GPT-2's `transformer.h.*`, the Transformer's encoder and decoder layers, the ResNet's
  `layer1..4`, the U-Net's `enc*`, `bottleneck`, `dec*`) and around every second one
  (blocks 0, 2, 4, ...: "every 2nd block");
* torch.compile(backend="aot_eager_decomp_partition") with
  `torch._functorch.config.activation_memory_budget` at 1.0, 0.7, 0.5, 0.3, 0.1: the
  eager backend with AOTAutograd's decompositions and min-cut partitioner, so only the
  partitioner's rematerialization decisions differ from eager.  For each value:
  `torch._dynamo.reset()`, then compile and the first training step under
  `torch._functorch.config.patch(activation_memory_budget=v)`.  Even at 1.0 the min-cut
  partitioner recomputes cheap ops, and the decomposed ops cost time on CPU, so read the
  compile points against each other as well as against eager.

Peak memory: bytes one training step allocates above what is resident before it
(parameters, buffers, inputs), from the PyTorch profiler's CPU allocator events
(`remat_dsl.capture.measure.step_peak`): the same count for every method, and what our budgets
bound.  Time: the median over `--rounds` of the wall time of one step with unit output
gradients (`remat_dsl.capture.measure.training_step`), the methods timed round-robin (the order
rotated every round) after one warm-up round, so that this noisy machine's load hits all
alike.  Every ratio is against eager timed in the same rounds: the main phase times eager,
our plans and the checkpointed models together; since `torch._dynamo.reset()` discards
the previously compiled variants, each torch.compile value gets its own phase that times
eager, the compiled model (and, in the matched-memory comparison, our plans at its peak)
together.

Threads: `--threads 1` by default, set before the capture (whose op timings the solvers
use) and kept for every measurement.  On this 2-core machine shared with other jobs, two
OpenMP threads stall at every parallel region's barrier whenever another process holds one
core: the same eager ResNet step took 14-18 ms at one moment and 180-1940 ms at another.  One
thread is immune to that; the ratios compare methods at the same thread count.

Matched memory (`--matched-model`, default gpt2-12l): at 50% of the autograd peak, for
each peer point (rotor at 50%, every-block and every-2nd-block checkpoint, each
torch.compile value) with measured peak P, rockmate and hiremate are planned at
min(50% budget, P) and timed in the same rounds as the peer; the block prints both
measured times and peaks and "faster at equal or lower memory: yes/no".

Solve-time scaling: GPT-2 with 6, 12 and 24 layers (`build_model(n_layer=N)`), in this
process: seconds for capture + profile (`remat_dsl.workflow.capture_model`), for each
solver's `make_plan` at 50%, the total, and the ratios total(24)/total(12) and
total(12)/total(6).  Captures made for the frontier are reused.

"solve/compile s" in the tables: for our plans, the wall time of that one make_plan call
(the solvers keep what they build for a graph in remat_dsl.solve.driver's lru caches, so the
first budget of a sweep pays for the later ones); for torch.compile, compilation plus the
first step.  The scaling section clears those caches before every solve.

Output: a table per model on stdout; frontier.csv, frontier.md (all tables) and
frontier_<model>.png (x: measured peak in MiB, y: time / eager time) in --out; the tables
also become its section of docs/measurements.md (bench/_common.py), unless --no-write.

Usage:
  python bench/frontier.py                              # everything (meant to stay under ~25 min here)
  python bench/frontier.py --quick --models gpt2-6l     # smoke run (about 2 minutes here)
  python bench/frontier.py --models gpt2-12l unet --rounds 15 --out /tmp/frontier
  python bench/frontier.py --scaling-only               # only the solve-time scaling
--quick: budgets 100%, 50% and min, torch.compile at 1.0/0.5/0.1, 3 rounds, scaling at 6
and 12 layers, and make_plan's time_limit 5 s (MILP solvers) unless --time-limit is given.
"""

from __future__ import annotations

import argparse
import csv
import fnmatch
import gc
import statistics
import sys
import tempfile
import time
import traceback
from dataclasses import dataclass, field, replace
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import Report, add_write_flag, checkpointed  # noqa: E402

import remat_dsl  # noqa: E402
from remat_dsl.capture.measure import step_peak, training_step  # noqa: E402
from remat_dsl.capture.model_file import ModelFile  # noqa: E402
from remat_dsl.solve.api import BudgetError  # noqa: E402
from remat_dsl.solve.registry import NAMES  # noqa: E402
from remat_dsl.workflow import capture_model  # noqa: E402

# NOTE: [Plans above their budget] make_plan, smallest_budget and verify(within_budget=False)
# stay internal here: `autograd` and `checkpoint-sqrt` plan one schedule whatever the budget,
# which the API's generate_module (it checks the budget) and solve_captured (it refuses a
# budget below the proven bound before any solve, where this sweep asks the solver for its
# smallest) would refuse.
from remat_dsl.check.verify import verify  # noqa: E402
from remat_dsl.codegen.generate import generate  # noqa: E402
from remat_dsl.solve import driver as solve  # noqa: E402
from remat_dsl.solve.driver import autograd_peak, make_plan  # noqa: E402

ABOUT = """Our plans (rotor, rockmate, hiremate over a sweep of budgets; autograd and
checkpoint-sqrt) against torch.utils.checkpoint and torch.compile's min-cut partitioner:
measured peak and step time over eager's, timed in the same rounds on one thread.  The
CSV and one PNG per model are in `bench/results/`."""

MiB = 2**20


@dataclass(frozen=True)
class ModelSpec:
    """A model file spec and the glob patterns (over module names, matched segment by
    segment) of the blocks that torch.utils.checkpoint wraps."""

    spec: str
    blocks: tuple[str, ...]


MODELS = {
    "gpt2-6l": ModelSpec("examples/gpt2.py:build_gpt2_6l", ("transformer.h.*",)),
    "gpt2-12l": ModelSpec("examples/gpt2.py:build_gpt2_12l", ("transformer.h.*",)),
    "transformer": ModelSpec(
        "examples/transformer.py", ("transformer.encoder.layers.*", "transformer.decoder.layers.*")
    ),
    "resnet": ModelSpec("examples/resnet.py", ("layer*",)),
    "unet": ModelSpec("examples/unet.py", ("enc*", "bottleneck", "dec*")),
}
GPT2_LAYERS = {"gpt2-6l": 6, "gpt2-12l": 12}
SWEEP_SOLVERS = ("rotor", "rockmate", "hiremate")
FIXED_SOLVERS = ("autograd", "checkpoint-sqrt")
FRACTIONS = (100, 80, 70, 60, 50, 40, 30)
QUICK_FRACTIONS = (100, 50)
COMPILE_BUDGETS = (1.0, 0.7, 0.5, 0.3, 0.1)
QUICK_COMPILE_BUDGETS = (1.0, 0.5, 0.1)
SCALING_LAYERS = (6, 12, 24)
QUICK_SCALING_LAYERS = (6, 12)
QUICK_TIME_LIMIT = 5.0  # seconds, make_plan's time_limit for the MILP solvers under --quick
MATCHED_FRACTION = 50


# --- rows ---------------------------------------------------------------------


@dataclass
class Row:
    """One point: a method at one setting, measured (or why it was not)."""

    model: str
    method: str
    setting: str
    budget: int | None = None
    predicted: int | None = None
    measured: int | None = None
    seconds: float | None = None
    eager_seconds: float | None = None
    eager_peak: int | None = None
    solve_seconds: float | None = None
    phase: str = ""
    note: str = ""
    key: object = field(default=None, repr=False)  # the module that runs it (timing/peak)

    @property
    def peak_ratio(self) -> float | None:
        return self.measured / self.eager_peak if self.measured is not None and self.eager_peak else None

    @property
    def time_ratio(self) -> float | None:
        return self.seconds / self.eager_seconds if self.seconds is not None and self.eager_seconds else None

    @property
    def ok(self) -> bool:
        return self.measured is not None and self.seconds is not None


def mib(n: int | None) -> str:
    return "-" if n is None else f"{n / MiB:.2f} MiB"


def ratio(x: float | None) -> str:
    return "-" if x is None else f"{x:.3f}"


# --- modules ------------------------------------------------------------------


def block_modules(model: torch.nn.Module, patterns: tuple[str, ...]) -> list[torch.nn.Module]:
    """Modules whose names match one of `patterns` with as many `.`-segments, in order."""
    found = []
    for name, module in model.named_modules():
        for pattern in patterns:
            if name.count(".") == pattern.count(".") and fnmatch.fnmatchcase(name, pattern):
                found.append(module)
                break
    return found


class CheckpointBlocks(torch.nn.Module):
    """The model with torch.utils.checkpoint (non-reentrant) around blocks 0, every, 2*every..."""

    def __init__(self, model: torch.nn.Module, patterns: tuple[str, ...], every: int = 1):
        super().__init__()
        self.model = model
        blocks = block_modules(model, patterns)
        if not blocks:
            raise ValueError(f"no module matches {patterns}")
        self.wrapped = len(blocks[::every])
        for block in blocks[::every]:
            block.forward = checkpointed(block.forward)

    def forward(self, *inputs):
        return self.model(*inputs)


def interleaved_medians(modules: dict[object, torch.nn.Module], inputs: tuple, rounds: int) -> dict[object, float]:
    """Median step time (s) of each module, timed round-robin (order rotated each round)
    after one warm-up round, so that the machine's noise hits all alike."""
    keys = list(modules)
    steps = {k: training_step(modules[k], inputs) for k in keys}
    samples: dict[object, list[float]] = {k: [] for k in keys}
    with torch.random.fork_rng():
        for index in range(rounds + 1):
            shift = index % len(keys)
            gc.collect()
            for k in keys[shift:] + keys[:shift]:
                modules[k].zero_grad(set_to_none=True)
                start = time.perf_counter()
                steps[k]()
                if index:
                    samples[k].append(time.perf_counter() - start)
                modules[k].zero_grad(set_to_none=True)
    return {k: statistics.median(v) for k, v in samples.items()}


# --- planning -----------------------------------------------------------------


class Planner:
    """Our plans for one captured model, and one generated module per distinct schedule."""

    def __init__(self, model_file: ModelFile, captured, workdir: Path, time_limit: float | None):
        self.model_file, self.captured, self.workdir, self.time_limit = model_file, captured, workdir, time_limit
        self.autograd = autograd_peak(captured.graph, captured.device)
        self.modules: dict[object, torch.nn.Module] = {}
        self.predicted: dict[object, int] = {}
        self.smallest: dict[str, int | None] = {}

    def plan(self, solver: str, budget: int):
        """(plan, seconds) or raises BudgetError / another error."""
        start = time.perf_counter()
        plan = make_plan(
            self.captured.graph,
            model=self.model_file.spec,
            device=self.captured.device,
            budget=budget,
            solver=solver,
            **({"time_limit": self.time_limit} if self.time_limit is not None else {}),
        )
        return plan, time.perf_counter() - start

    def module_key(self, plan) -> object:
        """The key of the module that runs `plan`'s schedule (generated once per schedule)."""
        key = (
            tuple((i.verb, i.target) for i in plan.forward)
            + (("--", "--"),)
            + tuple((i.verb, i.target) for i in plan.backward)
        )
        if key not in self.modules:
            path = self.workdir / f"fast_{len(self.modules)}.py"
            path.write_text(generate(verify(plan, within_budget=False)))  # NOTE: [Plans above their budget]
            self.modules[key] = remat_dsl.load_module(path).FastModel(self.model_file.build_model())
            self.predicted[key] = plan.header.peak_bytes
        return key

    def row(self, name: str, solver: str, setting: str, budget: int) -> Row:
        """A row for `solver` at `budget`: planned and its module made, or why not."""
        row = Row(name, solver, setting, budget=budget)
        try:
            plan, row.solve_seconds = self.plan(solver, budget)
        except BudgetError as error:
            row.note = f"infeasible: smallest feasible budget {mib(error.smallest)}"
            self.smallest.setdefault(solver, error.smallest)
            return row
        except Exception as error:  # a solver being written must not stop the benchmark
            row.note = f"error: {type(error).__name__}: {str(error).splitlines()[0][:120]}"
            traceback.print_exc(limit=3, file=sys.stderr)
            return row
        row.predicted, row.key = plan.header.peak_bytes, self.module_key(plan)
        return row

    def smallest_budget(self, solver: str) -> int | None:
        """The smallest budget at which `solver` plans (None when it cannot tell)."""
        if solver in self.smallest:
            return self.smallest[solver]
        if solver == "rotor":
            value = solve.smallest_budget(self.captured.graph, self.captured.device, "rotor")
        else:
            try:
                self.plan(solver, 1)
                value = 1
            except BudgetError as error:
                value = error.smallest
            except Exception as error:
                print(f"  {solver}: cannot find its smallest budget: {type(error).__name__}: {error}", file=sys.stderr)
                value = None
        self.smallest[solver] = value
        return value


def available(solver: str) -> bool:
    return solver in NAMES


# --- one model ----------------------------------------------------------------


@dataclass
class Matched:
    """One line of the matched-memory comparison."""

    peer: Row
    solver: str
    budget: int
    ours: Row | None
    note: str = ""

    @property
    def faster(self) -> bool:
        o, p = self.ours, self.peer
        return bool(o and o.ok and p.ok and o.seconds < p.seconds and o.measured <= p.measured)


@dataclass
class ModelResult:
    name: str
    rows: list[Row]
    matched: list[Matched]
    autograd: int
    eager_peak: int
    smallest: dict[str, int | None]
    capture_seconds: float
    ops: int


def bench_model(name: str, args, workdir: Path, captures: dict) -> ModelResult:
    spec = MODELS[name]
    model_file = remat_dsl.model_of(str(ROOT / spec.spec))
    call = model_file.sample_inputs()
    assert not call.kwargs, "the benchmarks call the examples with positional arguments"
    inputs = call.args
    log(f"[{name}] capture + profile {spec.spec}")
    start = time.perf_counter()
    captured = capture_model(model_file)
    capture_seconds = time.perf_counter() - start
    captures[name] = (captured, capture_seconds, model_file)
    planner = Planner(model_file, captured, workdir / name, args.time_limit)
    planner.workdir.mkdir(parents=True, exist_ok=True)
    autograd = planner.autograd
    fractions = QUICK_FRACTIONS if args.quick else FRACTIONS
    rows: list[Row] = []

    log(f"[{name}] planning (autograd peak {mib(autograd)})")
    for solver in FIXED_SOLVERS:
        if not available(solver):
            rows.append(Row(name, solver, "-", note="skipped: not in remat_dsl.solve.registry.NAMES"))
            continue
        row = planner.row(name, solver, "fixed", autograd)
        if row.key is None and solver in planner.smallest:  # its one schedule is above the autograd peak
            row = planner.row(name, solver, "fixed", planner.smallest[solver])
        rows.append(row)
    for solver in args.solvers:
        if not available(solver):
            rows.append(Row(name, solver, "-", note="skipped: not in remat_dsl.solve.registry.NAMES (yet)"))
            continue
        for fraction in fractions:
            rows.append(planner.row(name, solver, f"{fraction}%", autograd * fraction // 100))
        smallest = planner.smallest_budget(solver)
        if smallest is None:
            rows.append(Row(name, solver, "min", note="smallest feasible budget unknown"))
        else:
            rows.append(planner.row(name, solver, "min", smallest))
        log(f"[{name}]   {solver}: {sum(r.key is not None for r in rows if r.method == solver)} plans")

    eager = model_file.build_model()
    checkpointed = {
        "every block": CheckpointBlocks(model_file.build_model(), spec.blocks, 1),
        "every 2nd block": CheckpointBlocks(model_file.build_model(), spec.blocks, 2),
    }
    for setting, module in checkpointed.items():
        rows.append(Row(name, "torch checkpoint", f"{setting} ({module.wrapped})", key=("ckpt", setting)))
    modules: dict[object, torch.nn.Module] = {"eager": eager, **planner.modules}
    modules.update({("ckpt", s): m for s, m in checkpointed.items()})

    log(f"[{name}] measuring peaks of {len(modules)} modules")
    peaks = {k: step_peak(m, inputs) for k, m in modules.items()}
    eager_peak = peaks["eager"]

    matched: list[Matched] = []
    do_match = name == args.matched_model
    budget50 = autograd * MATCHED_FRACTION // 100
    matched_solvers = [s for s in ("rockmate", "hiremate") if available(s) and s in args.solvers]
    if do_match:
        peers = [r for r in rows if r.method == "rotor" and r.setting == f"{MATCHED_FRACTION}%" and r.key is not None]
        peers += [r for r in rows if r.method == "torch checkpoint"]
        for peer in peers:
            matched += match_peer(planner, peer, peaks[peer.key], budget50, matched_solvers, rows, name)
        for key, module in planner.modules.items():
            if key not in modules:
                modules[key] = module
                peaks[key] = step_peak(module, inputs)

    log(f"[{name}] timing {len(modules)} modules, {args.rounds} rounds")
    times = interleaved_medians(modules, inputs, args.rounds)
    eager_row = Row(name, "eager", "-", measured=eager_peak, seconds=times["eager"], key="eager")
    for row in [eager_row, *rows]:
        if row.key is not None:
            row.measured, row.seconds = peaks[row.key], times[row.key]
            row.predicted = planner.predicted.get(row.key, row.predicted)
            row.eager_seconds, row.phase = times["eager"], "main"
        row.eager_peak = eager_peak
    rows.insert(0, eager_row)

    compile_values = QUICK_COMPILE_BUDGETS if args.quick else COMPILE_BUDGETS
    for value in compile_values:
        rows += compile_phase(
            name,
            model_file,
            inputs,
            value,
            eager,
            eager_peak,
            planner,
            matched,
            do_match,
            budget50,
            matched_solvers,
            args.rounds,
        )
    torch._dynamo.reset()

    # Drop module references (memory) but keep the numbers.
    for row in rows:
        row.key = None
    return ModelResult(
        name, rows, matched, autograd, eager_peak, planner.smallest, capture_seconds, len(captured.graph.ops)
    )


def match_peer(planner: Planner, peer: Row, peer_peak: int, budget50: int, solvers, rows, name) -> list[Matched]:
    result = []
    if not solvers:
        return [
            Matched(
                peer,
                "rockmate/hiremate",
                min(budget50, peer_peak),
                None,
                "skipped: not in remat_dsl.solve.registry.NAMES (yet)",
            )
        ]
    for solver in solvers:
        budget = min(budget50, peer_peak)
        row = planner.row(name, solver, f"matched {peer.method} {peer.setting}", budget)
        rows.append(row)
        result.append(Matched(peer, solver, budget, row, row.note))
    return result


def compile_phase(
    name, model_file, inputs, value, eager, eager_peak, planner, matched, do_match, budget50, solvers, rounds
) -> list[Row]:
    """torch.compile at one activation_memory_budget, timed against eager (and the matched
    plans) in its own rounds."""
    import torch._functorch.config as functorch_config

    setting = f"budget={value}"
    log(f"[{name}] torch.compile {setting}")
    torch._dynamo.reset()
    row = Row(name, "torch.compile", setting, eager_peak=eager_peak, phase=f"compile {value}")
    start = time.perf_counter()
    try:
        with functorch_config.patch(activation_memory_budget=value):
            compiled = torch.compile(model_file.build_model(), backend="aot_eager_decomp_partition", dynamic=False)
            training_step(compiled, inputs)()
            compiled.zero_grad(set_to_none=True)
    except Exception as error:
        row.note = f"error: {type(error).__name__}: {str(error).splitlines()[0][:120]}"
        traceback.print_exc(limit=3, file=sys.stderr)
        return [row]
    row.solve_seconds = time.perf_counter() - start  # compile + first step
    row.measured = step_peak(compiled, inputs)
    modules: dict[object, torch.nn.Module] = {"eager": eager, "compiled": compiled}
    rows = [row]
    if do_match:
        matched += match_peer(planner, row, row.measured, budget50, solvers, rows, name)
        for other in rows[1:]:
            if other.key is not None:
                modules[other.key] = planner.modules[other.key]
    times = interleaved_medians(modules, inputs, rounds)
    row.seconds, row.eager_seconds = times["compiled"], times["eager"]
    for other in rows[1:]:
        other.eager_peak, other.phase = eager_peak, row.phase
        if other.key is not None:
            other.measured = step_peak(planner.modules[other.key], inputs)
            other.seconds, other.eager_seconds = times[other.key], times["eager"]
            other.predicted = planner.predicted[other.key]
    del compiled, modules
    torch._dynamo.reset()
    return rows


# --- scaling ------------------------------------------------------------------


@dataclass
class ScalingRow:
    layers: int
    ops: int
    capture_seconds: float
    solver: str
    solve_seconds: float | None
    note: str = ""

    @property
    def total(self) -> float | None:
        return None if self.solve_seconds is None else self.capture_seconds + self.solve_seconds


def clear_solver_caches() -> int:
    """Clear the lru caches remat_dsl.solve.driver keeps per graph (built ILP solvers, strategies),
    so that a scaling solve is timed cold; returns how many were cleared."""
    cleared = 0
    for value in vars(solve).values():
        for item in value.values() if isinstance(value, dict) else (value,):
            if callable(getattr(item, "cache_clear", None)):
                item.cache_clear()
                cleared += 1
    return cleared


def bench_scaling(layers_list, captures: dict, time_limit: float | None, solvers=SWEEP_SOLVERS) -> list[ScalingRow]:
    gpt2 = remat_dsl.model_of(str(ROOT / "examples/gpt2.py"))
    rows = []
    for layers in layers_list:
        reused = next((captures[n] for n, L in GPT2_LAYERS.items() if L == layers and n in captures), None)
        if reused:
            captured, capture_seconds, model_file = reused
            log(f"[scaling] gpt2 {layers} layers: capture from the frontier run ({capture_seconds:.1f} s)")
        else:
            model_file = replace(
                gpt2,
                spec=f"examples/gpt2.py:build_model(n_layer={layers})",
                build=lambda n=layers: gpt2.module.build_model(n_layer=n),
            )
            log(f"[scaling] gpt2 {layers} layers: capture + profile")
            start = time.perf_counter()
            captured = capture_model(model_file)
            capture_seconds = time.perf_counter() - start
        budget = autograd_peak(captured.graph, captured.device) * MATCHED_FRACTION // 100
        for solver in solvers:
            if not available(solver):
                rows.append(
                    ScalingRow(
                        layers, len(captured.graph.ops), capture_seconds, solver, None, "skipped: not in SOLVERS"
                    )
                )
                continue
            log(f"[scaling] gpt2 {layers} layers: {solver} at {MATCHED_FRACTION}%")
            clear_solver_caches()
            gc.collect()
            start = time.perf_counter()
            note = ""
            try:
                make_plan(
                    captured.graph,
                    model=model_file.spec,
                    device=captured.device,
                    budget=budget,
                    solver=solver,
                    **({"time_limit": time_limit} if time_limit is not None else {}),
                )
            except BudgetError as error:
                note = f"infeasible (smallest {mib(error.smallest)})"
            except Exception as error:
                note = f"error: {type(error).__name__}: {str(error).splitlines()[0][:80]}"
            rows.append(
                ScalingRow(layers, len(captured.graph.ops), capture_seconds, solver, time.perf_counter() - start, note)
            )
    return rows


# --- output -------------------------------------------------------------------

COLUMNS = [
    "method",
    "setting",
    "budget",
    "predicted peak",
    "measured peak",
    "peak/eager",
    "time/eager",
    "solve/compile s",
    "note",
]


def row_cells(r: Row) -> list[str]:
    return [
        r.method,
        r.setting,
        mib(r.budget),
        mib(r.predicted),
        mib(r.measured),
        ratio(r.peak_ratio),
        ratio(r.time_ratio),
        "-" if r.solve_seconds is None else f"{r.solve_seconds:.2f}",
        r.note,
    ]


def console():
    from rich.console import Console

    return Console(width=max(160, Console().width), highlight=False)


def print_model(con, result: ModelResult) -> None:
    from rich.table import Table

    eager = result.rows[0]
    table = Table(
        title=(
            f"{result.name}: eager peak {mib(result.eager_peak)}, eager step {eager.seconds * 1000:.1f} ms (main"
            f" phase), autograd plan peak {mib(result.autograd)}, {result.ops} ops, capture+profile"
            f" {result.capture_seconds:.1f} s"
        ),
        title_justify="left",
    )
    for column in COLUMNS:
        table.add_column(
            column, justify="left" if column in ("method", "setting", "note") else "right", overflow="fold"
        )
    for r in result.rows:
        if r.setting.startswith("matched"):
            continue
        table.add_row(*row_cells(r))
    con.print(table)
    smallest = ", ".join(
        (
            f"{s} {mib(result.smallest[s])} ({result.smallest[s] / result.autograd:.0%} of autograd)"
            if result.smallest.get(s)
            else f"{s} -"
        )
        for s in SWEEP_SOLVERS
        if available(s)
    )
    con.print(f"smallest feasible budget ({result.name}): {smallest or '-'}")
    skipped = [s for s in SWEEP_SOLVERS if not available(s)]
    if skipped:
        con.print(f"note: {', '.join(skipped)} not in remat_dsl.solve.registry.NAMES: skipped")
    con.print()


def matched_lines(result: ModelResult) -> list[str]:
    budget50 = result.autograd * MATCHED_FRACTION // 100
    lines = [
        f"matched-memory comparison, {result.name}, at {MATCHED_FRACTION}% of the autograd peak ({mib(budget50)}):"
    ]
    if not result.matched:
        lines.append("  (no peer point was measured)")
    peer = None
    for m in result.matched:
        if m.peer is not peer:
            peer = m.peer
            lines.append(
                f"  peer {peer.method} {peer.setting}: measured peak {mib(peer.measured)}, time {fmt_time(peer)}"
                f" ({peer.phase} phase)"
            )
        if m.ours is None or not m.ours.ok:
            lines.append(
                f"    {m.solver} at budget {mib(m.budget)}: {m.note or 'not measured'}; faster at equal or lower"
                " memory: no"
            )
            continue
        o = m.ours
        lines.append(
            f"    {m.solver} at budget {mib(m.budget)}: measured peak {mib(o.measured)}, time {fmt_time(o)}"
            f" -> faster at equal or lower memory: {'yes' if m.faster else 'no'}"
        )
    return lines


def fmt_time(r: Row) -> str:
    if r.seconds is None:
        return "-"
    return f"{r.seconds * 1000:.1f} ms ({r.time_ratio:.3f} x eager)"


def scaling_lines(rows: list[ScalingRow]) -> list[str]:
    lines = ["solve-time scaling, GPT-2, budget 50% of the autograd peak (seconds, this process):"]
    lines.append(f"  {'layers':>6} {'ops':>6} {'capture+profile':>16} {'solver':<10} {'solve':>9} {'total':>9}  note")
    for r in rows:
        solve_s = "-" if r.solve_seconds is None else f"{r.solve_seconds:.2f}"
        total = "-" if r.total is None else f"{r.total:.2f}"
        lines.append(
            f"  {r.layers:>6} {r.ops:>6} {r.capture_seconds:>16.2f} {r.solver:<10} {solve_s:>9} {total:>9}  {r.note}"
        )
    by = {(r.layers, r.solver): r for r in rows}
    for solver in SWEEP_SOLVERS:
        parts = []
        for big, small in ((24, 12), (12, 6)):
            a, b = by.get((big, solver)), by.get((small, solver))
            if a and b and a.total and b.total:
                parts.append(f"total({big})/total({small}) = {a.total / b.total:.2f}")
        if parts:
            lines.append(f"  {solver}: {', '.join(parts)}")
    return lines


def write_outputs(out: Path, results: list[ModelResult], scaling: list[ScalingRow], header: str) -> str:
    """Write frontier.csv, scaling.csv, frontier.md and the PNGs into `out`; returns
    frontier.md's tables (no title, no images) for docs/measurements.md."""
    out.mkdir(parents=True, exist_ok=True)
    if results:
        with open(out / "frontier.csv", "w", newline="") as f:
            w = csv.writer(f)
            w.writerow(
                [
                    "model",
                    "method",
                    "setting",
                    "budget_bytes",
                    "predicted_bytes",
                    "measured_bytes",
                    "eager_peak_bytes",
                    "peak_ratio",
                    "seconds",
                    "eager_seconds",
                    "time_ratio",
                    "solve_seconds",
                    "phase",
                    "note",
                ]
            )
            for res in results:
                for r in res.rows:
                    w.writerow(
                        [
                            res.name,
                            r.method,
                            r.setting,
                            r.budget,
                            r.predicted,
                            r.measured,
                            r.eager_peak,
                            f"{r.peak_ratio:.4f}" if r.peak_ratio else "",
                            f"{r.seconds:.6f}" if r.seconds else "",
                            f"{r.eager_seconds:.6f}" if r.eager_seconds else "",
                            f"{r.time_ratio:.4f}" if r.time_ratio else "",
                            f"{r.solve_seconds:.3f}" if r.solve_seconds is not None else "",
                            r.phase,
                            r.note,
                        ]
                    )
    if scaling:
        with open(out / "scaling.csv", "w", newline="") as f:
            w = csv.writer(f)
            w.writerow(["layers", "ops", "capture_seconds", "solver", "solve_seconds", "total_seconds", "note"])
            for r in scaling:
                w.writerow(
                    [
                        r.layers,
                        r.ops,
                        f"{r.capture_seconds:.3f}",
                        r.solver,
                        "" if r.solve_seconds is None else f"{r.solve_seconds:.3f}",
                        "" if r.total is None else f"{r.total:.3f}",
                        r.note,
                    ]
                )
    md = [f"# Memory/time frontier\n\n{header}\n"]
    for res in results:
        md.append(f"## {res.name}\n")
        md.append(
            f"eager peak {mib(res.eager_peak)}, eager step {res.rows[0].seconds * 1000:.1f} ms (main phase), autograd"
            f" plan peak {mib(res.autograd)}\n"
        )
        md.append("| " + " | ".join(COLUMNS) + " |")
        md.append("|" + "---|" * len(COLUMNS))
        for r in res.rows:
            md.append("| " + " | ".join(c.replace("|", "/") for c in row_cells(r)) + " |")
        md.append("")
        md.append(f"![{res.name}](frontier_{res.name}.png)\n")
        if res.matched:
            md.append("```\n" + "\n".join(matched_lines(res)) + "\n```\n")
    if scaling:
        md.append("## Solve-time scaling\n\n```\n" + "\n".join(scaling_lines(scaling)) + "\n```\n")
    (out / "frontier.md").write_text("\n".join(md))
    for res in results:
        plot(res, out / f"frontier_{res.name}.png")
    return "\n".join(line.replace("## ", "### ", 1) for line in md[1:] if not line.startswith("!["))


def plot(result: ModelResult, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(9, 6))
    markers = {
        "autograd": "s",
        "checkpoint-sqrt": "D",
        "rotor": "o",
        "rockmate": "^",
        "hiremate": "v",
        "torch checkpoint": "P",
        "torch.compile": "X",
    }
    for method, marker in markers.items():
        points = sorted(
            {
                (r.measured / MiB, r.time_ratio, r.setting)
                for r in result.rows
                if r.method == method and r.ok and not r.setting.startswith("matched")
            }
        )
        if not points:
            continue
        xs, ys, labels = zip(*points)
        line = "-" if method in ("rotor", "rockmate", "hiremate", "torch.compile") and len(points) > 1 else ""
        ax.plot(xs, ys, marker=marker, linestyle=line, label=method, alpha=0.85)
        for x, y, label in points:
            ax.annotate(
                label.split(" (")[0].replace("budget=", ""),
                (x, y),
                fontsize=6,
                xytext=(3, 3),
                textcoords="offset points",
            )
    matched = sorted(
        {(r.measured / MiB, r.time_ratio, r.method) for r in result.rows if r.setting.startswith("matched") and r.ok}
    )
    if matched:
        ax.scatter(
            [m[0] for m in matched],
            [m[1] for m in matched],
            marker="*",
            s=60,
            c="k",
            label="rockmate/hiremate matched",
            zorder=3,
        )
    ax.plot(
        [result.eager_peak / MiB], [1.0], marker="*", markersize=14, color="red", linestyle="", label="eager", zorder=4
    )
    ax.axhline(1.0, color="grey", linewidth=0.5)
    ax.set_xlabel("measured peak (MiB above parameters and inputs)")
    ax.set_ylabel("step time / eager step time (same rounds)")
    ax.set_title(f"{result.name}: memory/time frontier (CPU)")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def log(message: str) -> None:
    print(f"{time.strftime('%H:%M:%S')} {message}", file=sys.stderr, flush=True)


# --- main ---------------------------------------------------------------------


def main(argv=None) -> int:
    parser = add_write_flag(
        argparse.ArgumentParser(
            description=__doc__.splitlines()[0], formatter_class=argparse.RawDescriptionHelpFormatter
        )
    )
    parser.add_argument(
        "--models",
        nargs="+",
        choices=list(MODELS),
        default=list(MODELS),
        metavar="NAME",
        help=f"subset of: {', '.join(MODELS)}",
    )
    parser.add_argument("--rounds", type=int, default=None, help="timing rounds per phase (default 10, --quick 3)")
    parser.add_argument(
        "--quick",
        action="store_true",
        help="budgets 100%%/50%%/min, torch.compile 1.0/0.5/0.1, 3 rounds, scaling 6/12 layers, --time-limit 5",
    )
    parser.add_argument(
        "--out", type=Path, default=ROOT / "bench" / "results", help="directory for frontier.csv/.md and the PNGs"
    )
    parser.add_argument(
        "--matched-model", default="gpt2-12l", choices=list(MODELS), help="model of the matched-memory comparison"
    )
    parser.add_argument("--scaling-only", action="store_true", help="only the solve-time scaling section")
    parser.add_argument("--no-scaling", action="store_true", help="skip the solve-time scaling section")
    parser.add_argument(
        "--scaling-layers",
        type=int,
        nargs="+",
        default=None,
        help="GPT-2 depths for the scaling (default 6 12 24, --quick 6 12)",
    )
    parser.add_argument(
        "--solvers",
        nargs="+",
        default=list(SWEEP_SOLVERS),
        choices=list(SWEEP_SOLVERS),
        metavar="NAME",
        help=f"budget-sweep solvers (default: {' '.join(SWEEP_SOLVERS)}); autograd and checkpoint-sqrt always run",
    )
    parser.add_argument(
        "--threads",
        type=int,
        default=1,
        help="torch.set_num_threads for everything, capture included (default 1: see the docstring)",
    )
    parser.add_argument(
        "--time-limit",
        type=float,
        default=None,
        help="time_limit (s) passed to make_plan (MILP solvers); default none, --quick 5",
    )
    args = parser.parse_args(argv)
    args.rounds = args.rounds or (3 if args.quick else 10)
    if args.quick and args.time_limit is None:
        args.time_limit = QUICK_TIME_LIMIT
    scaling_layers = args.scaling_layers or (QUICK_SCALING_LAYERS if args.quick else SCALING_LAYERS)
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    report = Report("bench/frontier.py", "Rockmate and HiRemate against rotor and PyTorch's own tools", ABOUT)
    started = time.perf_counter()
    header = (
        f"torch {torch.__version__}, {torch.get_num_threads()} threads, CPU; solvers in remat_dsl.solve.registry.NAMES:"
        f" {', '.join(NAMES)}; rounds {args.rounds}{' (quick)' if args.quick else ''}; make_plan time_limit"
        f" {args.time_limit if args.time_limit is not None else 'none'}; {time.strftime('%Y-%m-%d %H:%M')}"
    )
    con = console()
    con.print(header)
    for s in SWEEP_SOLVERS:
        if not available(s):
            con.print(
                f"note: solver {s} is not in remat_dsl.solve.registry.NAMES: its points are skipped, not estimated"
            )
    results: list[ModelResult] = []
    captures: dict = {}
    with tempfile.TemporaryDirectory() as tmp:
        if not args.scaling_only:
            for name in args.models:
                result = bench_model(name, args, Path(tmp), captures)
                results.append(result)
                print_model(con, result)
                gc.collect()
    for result in results:
        if result.matched:
            con.print("\n".join(matched_lines(result)))
            con.print()
    if results and args.matched_model not in args.models:
        con.print(f"(no matched-memory comparison: {args.matched_model} is not among --models)")
    if results:
        con.print("smallest feasible budgets:")
        for r in results:
            con.print(
                f"  {r.name:<12} autograd {mib(r.autograd):>12}  "
                + "  ".join(
                    f"{s} {mib(r.smallest.get(s))}"
                    + (f" ({r.smallest[s] / r.autograd:.0%})" if r.smallest.get(s) else "")
                    for s in SWEEP_SOLVERS
                    if available(s)
                )
            )
        con.print()
    scaling: list[ScalingRow] = []
    if args.scaling_only or not args.no_scaling:
        scaling = bench_scaling(scaling_layers, captures, args.time_limit, args.solvers)
        con.print("\n".join(scaling_lines(scaling)))
    tables = write_outputs(args.out, results, scaling, header)
    written = [
        "frontier.csv",
        "frontier.md",
        *(["scaling.csv"] if scaling else []),
        *(f"frontier_{r.name}.png" for r in results),
    ]
    con.print(f"\nwrote {args.out}/{', '.join(written)}; {time.perf_counter() - started:.0f} s in all")
    report.write(args, markdown=f"{header}\n\n{tables}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
