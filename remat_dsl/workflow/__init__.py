"""The whole job from Python: plan a model, check a plan, generate and load its module.

    import remat_dsl
    plan = remat_dsl.plan_model(model, (tokens,), budget="50%", loss_fn=lambda out: out.logits.mean())
    Path("model.plan").write_text(remat_dsl.plan_text(plan))   # the text `remat plan` prints
    Path("fast_model.py").write_text(remat_dsl.generate_module(plan))
    fast = remat_dsl.load_module("fast_model.py").FastModel(model)   # shares model's parameters
    fast = remat_dsl.fast_model(model, plan)   # the same in one call: what Trainer, Accelerate, Lightning train

`model` is an nn.Module built in the caller's own script (with its inputs) or a model file
as `remat plan` takes it (`path.py` or `path.py:factory`).  These functions compose the same
stages the commands do (capture, solver driver, printer, verifier, code generation), so a
plan made here is the plan `remat plan` prints for the same model, inputs, costs and budget.
Errors are remat_dsl.plan.errors.RematError (bad input: a message and a hint) and its
subclasses: PlanError (a plan's text, with path:line:col), BudgetError (no plan fits).
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass, replace
from fractions import Fraction
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from remat_dsl.plan import ir
from remat_dsl.plan.errors import RematError

if TYPE_CHECKING:
    from remat_dsl.solve.api import Solver

MODULE_SPEC = "python:{name}"  # the header's `model` for a module built in a script (no file)


def model_of(model: Any, inputs: Any = None, loss_fn: Callable[[Any], Any] | None = None, autocast: Any = None):
    """A capture.model_file.ModelFile for `model`: a model file spec (str or Path; then
    `inputs` and `loss_fn` come from the file and must be None) or an nn.Module with its
    forward's `inputs` (a tensor, a tuple of positional arguments, a dict of keyword
    arguments, or (args, kwargs)).  The module is deep-copied for every capture, so the
    caller's model, its buffers and its RNG-drawn state are left as they are.  `loss_fn`
    turns the forward's output into the scalar loss (default: the model file contract's,
    the sum of the output's floating-point tensors' means).  Raises RematError."""
    import torch

    from remat_dsl.capture.model_file import ModelFile, load_model_file

    if isinstance(model, (str, Path)):
        if inputs is not None or loss_fn is not None:
            raise RematError(
                f"error: {model}: a model file gives its own inputs and loss",
                hint="define sample_inputs() and loss_fn(output) in the file, or pass the nn.Module itself",
            )
        loaded = load_model_file(str(model))
        return loaded if autocast is None else replace(loaded, autocast=autocast)
    if not isinstance(model, torch.nn.Module):
        raise RematError(f"error: the model is a {type(model).__name__}, not a torch.nn.Module or a model file path")
    if inputs is None:
        raise RematError(
            "error: no inputs given for the model",
            hint="pass the arguments of its forward: a tuple, a dict, or (args, kwargs)",
        )
    if loss_fn is not None and not callable(loss_fn):
        raise RematError(
            f"error: loss_fn is a {type(loss_fn).__name__}, not a function",
            hint="pass loss_fn=lambda output: ... or None",
        )
    if autocast not in (None, torch.bfloat16, torch.float16):
        raise RematError(
            f"error: autocast is {autocast!r}, not torch.bfloat16 or torch.float16",
            hint="pass autocast=torch.bfloat16 or None",
        )
    name = type(model).__qualname__
    if not name.isidentifier():  # a class made inside a function: `f.<locals>.Net`
        name = type(model).__name__
    spec = MODULE_SPEC.format(name=name)
    return ModelFile(
        spec, Path(spec), name, None, lambda: copy.deepcopy(model), lambda: copy.deepcopy(inputs), loss_fn, autocast
    )


def plan_model(
    model: Any,
    inputs: Any = None,
    budget: int | str | None = None,
    *,
    loss_fn: Callable[[Any], Any] | None = None,
    solver: str | type[Solver] = "auto",
    device: str | None = None,
    constraints: str | Path | None = None,
    autocast: Any = None,
    repeats: int = 5,
    time_limit: float | None = None,
    report: Callable[[str], None] | None = None,
    measure: bool = False,
    optimizer: Any = None,
    progress: bool = False,
) -> ir.Plan:
    """Capture `model`'s training step (forward, loss, backward), cost every op, solve for
    `budget` and return the plan (print it with `plan_text`).

    model, inputs, loss_fn, autocast: as `model_of` takes them.
    budget: bytes (an int), a size with its unit ("2GiB", "800MB") or a percentage of the
    autograd peak ("50%"); None: the autograd peak, the store-all plan's memory.
    solver: a name of `remat plan --solver` (auto, rockmate, hiremate, rotor, ...), or a
    subclass of remat_dsl.solve.api.Solver (an outside solver: docs/solvers.md).
    device: a device name (h100, a100, cpu) or a device-description TOML file: the costs
    are predicted for that device (docs/devices.md); None: op times predicted by the
    description of the device the model is on, sizes and temporaries measured here (NOTE:
    [Load-independent costs] in capture/pipeline.py).
    measure: with no device, time every op here instead (`repeats` runs each).
    constraints: a constraints file (keep/recompute/offload lines; docs/plan-language.md).
    repeats: timing runs per op.  time_limit: seconds per solve for the MILP solvers.
    report: called with each progress line (default: none).
    progress: show each stage on stderr as `remat plan` does, a bar on a terminal and plain
    lines with elapsed seconds otherwise (NOTE: [Progress] in remat_dsl/plan/progress.py); the
    solve's lines then go there, so `report` must be None.
    optimizer: the whole step's optimizer (NOTE: [Optimizer in the step] in
    remat_dsl.plan.optimizer): its text (`"adamw lr=1e-4"`, as `remat plan --optimizer`
    takes it) or a torch.optim AdamW, Adam or SGD instance; the budget then counts the
    device's optimizer states and updates.  None: the plan ends at the gradients.
    Measured costs are not cached here (`remat plan` caches them).
    Raises RematError (bad input, a model that cannot be captured), BudgetError (no plan
    of `solver` fits `budget`: it names the smallest budget that does).
    """
    from remat_dsl.capture.cost import load_device
    from remat_dsl.plan.constraints import read_constraints
    from remat_dsl.solve.api import Solver
    from remat_dsl.solve.registry import NAMES, unknown_solver

    # before the capture; the driver says the same of a name it does not know
    if isinstance(solver, type) and not issubclass(solver, Solver):
        raise RematError(f"error: solver {solver.__name__} is not a subclass of remat_dsl.solve.api.Solver")
    if not isinstance(solver, type) and solver not in NAMES:
        raise unknown_solver(solver)
    if progress and report is not None:
        raise RematError(
            "error: plan_model was given both `report` and progress=True",
            hint="pass one: progress=True shows the solve's lines with the stages on stderr",
        )
    amount, percent = _budget(budget)
    with _stage(progress, f"loading {model}" if isinstance(model, (str, Path)) else None, None):
        model_file = model_of(model, inputs, loss_fn, autocast)
    device_model = load_device(device) if device is not None else None
    rules = read_constraints(str(constraints)) if constraints is not None else ()
    step_optimizer = whole_step_optimizer(optimizer)
    with _stage(progress, f"capturing {model_file.spec}", "ops") as stage:
        captured = capture_model(model_file, device=device, repeats=repeats, measure=measure, progress=stage)
    options: dict[str, Any] = {"bandwidth": int(device_model.host_to_device)} if device_model is not None else {}
    if step_optimizer is not None:
        options["optimizer"] = step_optimizer
        options["update_speeds"] = update_speeds(step_optimizer, device_model, captured.device)
    with _stage(progress, "planning", "block classes") as stage:
        plan = solve_captured(
            captured.graph, amount, solver, percent=percent, model=model_file.spec, device=captured.device,
            costs=captured.costs, eager=captured.eager, constraints=rules, report=stage or report,
            time_limit=time_limit, host_link=device_model is not None and device_model.kind == "cuda", **options,
        )  # fmt: skip
    return replace(plan, header=replace(plan.header, solve_seconds=None))


def _stage(progress: bool, description: str | None, unit: str | None):
    """The Progress of one stage of `plan_model` (NOTE: [Progress] in
    remat_dsl/plan/progress.py), or a block that shows nothing (and gives None) without
    `progress` or a `description`."""
    import contextlib

    from remat_dsl.plan.progress import Progress

    if not progress or description is None:
        return contextlib.nullcontext()
    return Progress(description, unit=unit)


def whole_step_optimizer(optimizer: Any):
    """The plan.optimizer.Optimizer of `optimizer` (None, its text, or a torch.optim
    instance).  Raises RematError naming what is not planned."""
    from remat_dsl.plan.optimizer import OptimizerError, from_torch, parse_optimizer

    if optimizer is None:
        return None
    try:
        return parse_optimizer(optimizer) if isinstance(optimizer, str) else from_torch(optimizer)
    except OptimizerError as error:
        raise RematError(f"error: {error}", hint='write e.g. "adamw lr=0.0001 weight_decay=0.01"') from None


def update_speeds(optimizer, device_model, kind: str) -> tuple[int, int, int]:
    """(device, host update speed in bytes of parameter per second, host overhead in
    microseconds) for the header's `update-speed` line: from `device_model` (a
    capture.cost.DeviceModel), or the description of this machine's device of `kind`."""
    from remat_dsl.capture.pipeline import local_device_model
    from remat_dsl.plan.optimizer import device_update_speed

    model = device_model or local_device_model(kind) or local_device_model("cpu")
    device = device_update_speed(optimizer.kind, model.memory_bandwidth * model.memory_efficiency)
    return device, int(model.host_update), int(round(model.host_update_overhead * 1e6))


def capture_model(
    model: Any,
    inputs: Any = None,
    loss_fn: Callable[[Any], Any] | None = None,
    *,
    autocast: Any = None,
    device: str | None = None,
    repeats: int = 5,
    cache: bool = False,
    measure: bool = False,
    progress: Any = None,
):
    """Capture `model`'s training step and cost every op, as `plan_model` does before it
    solves: a capture.pipeline.Captured (its `graph`, the ir.Graph that `solve_captured`
    plans for any number of budgets; `device`, `costs`, `eager` for the plan's header).

    model, inputs, loss_fn, autocast: as `model_of` takes them, or a ModelFile that
    `model_of` returned.  device: a device name or description file predicts the costs
    (docs/devices.md); None predicts op times for the device the model is on and measures
    sizes and temporaries here, or with `measure`, times every op here (`repeats` runs).
    cache: take the measured costs from remat's cache when this graph was profiled here
    before, and store them otherwise, as `remat plan` does (docs/profiles.md).  The step is
    also run eagerly once and compared with the traced one (NOTE: [Eager agreement] in
    remat_dsl/capture/agreement.py).  progress: an object with `start(total)` and
    `advance(n)`, and optionally `phase(what)`: a remat_dsl.plan.progress.Progress (NOTE:
    [Progress] in remat_dsl/plan/progress.py).  Raises RematError."""
    from remat_dsl.capture.cost import load_device
    from remat_dsl.capture.model_file import ModelFile
    from remat_dsl.capture.pipeline import capture_graph
    from remat_dsl.plan.cache import default_cache

    model_file = model if isinstance(model, ModelFile) else model_of(model, inputs, loss_fn, autocast)
    if measure and device is not None:
        raise RematError("error: measure=True and a device both give the op costs", hint="pass one of them")
    device_model = load_device(device) if device is not None else None
    store = default_cache() if cache else None
    return capture_graph(
        model_file, repeats, progress, device_model=device_model, cache=store, check_eager=True, local_model=not measure
    )  # as `remat plan`


def solve_captured(
    graph: ir.Graph,
    budget: float | None,
    solver: str | type[Solver] = "auto",
    *,
    percent: bool = False,
    model: str = "",
    device: str = "cpu",
    costs: str | None = None,
    eager: tuple[str, ...] = (),
    constraints: tuple[ir.Constraint, ...] = (),
    strict: bool = False,
    report: Callable[[str], None] | None = None,
    **planner_options: Any,
) -> ir.Plan:
    """The plan of a captured graph, as `remat plan` and `plan_model` make it: custom
    operators refused, constraints that match nothing warned of (refused when `strict`),
    a budget below the proven bound refused before any solve, then the solve.

    budget: bytes, or with `percent` a percentage of the autograd peak; None: the autograd
    peak.  model, device: the header's model and device kind.  costs, eager: the header's
    costs line and the eager-agreement comments of the capture (capture.pipeline.Captured).
    planner_options: the remaining keyword arguments of solve.driver.Planner (bandwidth,
    time_limit, host_link, host_budget, cache, jobs), and `optimizer` (a
    plan.optimizer.Optimizer) with `update_speeds` for the whole step (Planner.plan_step).  The header keeps the solve's
    seconds.  Raises RematError and BudgetError."""
    from remat_dsl.check.verify import refuse_custom_operators
    from remat_dsl.plan.constraints import unmatched
    from remat_dsl.plan.units import format_bytes
    from remat_dsl.solve.driver import Planner
    from remat_dsl.solve.solvers.ilp import workers

    refuse_custom_operators(graph)  # NOTE: [Custom operators] in remat_dsl/check/verify.py
    for warning in unmatched(graph, constraints):
        if strict:
            raise RematError(
                warning.replace("warning:", "error:", 1),
                hint="fix the pattern or remove the line (without --strict this is a warning)",
            )
        if report:
            report(warning)
    planner_options_step = (planner_options.pop("optimizer", None), planner_options.pop("update_speeds", (0, 0, 0)))
    planner = Planner(graph, model=model, device=device, constraints=constraints, report=report, **planner_options)
    if budget is None or percent:
        peak = planner.autograd_peak
        budget = peak if budget is None else math.floor(peak * budget / 100)
    budget = int(budget)
    if planner_options_step[0] is None:  # the bound holds the gradients to the end of the step
        planner.refuse_below_bound(budget, solver)  # NOTE: [Budgets below the bound] in remat_dsl/solve/driver.py
    if report:
        limit = planner_options.get("time_limit")
        name = solver.name if isinstance(solver, type) else solver
        report(
            f"solving with {name} for a budget of {format_bytes(budget)}"
            + (f", time limit {limit:g} s" if limit is not None else "")
        )
    optimizer, speeds = planner_options_step
    try:
        if optimizer is None:
            plan = planner.plan(budget, solver)
        else:  # NOTE: [Optimizer placement] in remat_dsl/solve/driver.py
            plan = planner.plan_step(budget, optimizer, speeds, solver)
    finally:
        workers.stop()  # NOTE: [Parallel grid]
    return replace(plan, header=replace(plan.header, costs=costs, comments=plan.header.comments + tuple(eager)))


def _budget(budget: int | str | None) -> tuple[float | None, bool]:
    """(amount, is a percentage) of `budget` (plan_model's argument): bytes, or a
    percentage of the autograd peak.  Raises RematError."""
    from remat_dsl.plan.units import UnitError, parse_percent, parse_size

    if budget is None:
        return None, False
    if isinstance(budget, bool) or not isinstance(budget, (int, str)):
        raise RematError(f"error: the budget is a {type(budget).__name__}", hint='pass bytes (an int), "2GiB" or "50%"')
    percent = parse_percent(budget) if isinstance(budget, str) else None
    if percent is not None:
        amount = percent
    elif isinstance(budget, str):
        try:
            amount = parse_size(budget, "budget", exact=False)
        except UnitError as error:
            raise RematError(f"error: {error.message}", hint=error.hint) from None
    else:
        amount = budget
    if amount <= 0:
        raise RematError(f"error: the budget must be more than 0, got {budget!r}", hint='pass e.g. "50%" or "2GiB"')
    return amount, percent is not None


def plan_text(plan: ir.Plan) -> str:
    """The plan as the text `remat plan` prints (the plan language, sealed by its digest)."""
    from remat_dsl.plan.printer import print_plan

    return print_plan(plan)


def read_plan(path: str | Path) -> ir.Plan:
    """Parse a plan file.  Raises PlanError (path:line:col) and RematError (unreadable)."""
    from remat_dsl.plan.parser import parse_file

    return parse_file(str(path))


def check_plan(
    plan: ir.Plan | str | Path, model: Any = None, inputs: Any = None, loss_fn: Callable[[Any], Any] | None = None
) -> ir.Plan:
    """Verify a plan (an ir.Plan, or the path of a plan file) as `remat check` does: its
    digest, declarations and operators, and a simulation within its budget; with `model`
    (and its inputs, as `model_of` takes them), also against what the model is.  Returns
    the plan.  Raises PlanError (what is wrong, with path:line:col for a file) and
    RematError."""
    from remat_dsl.capture.pipeline import check_plan_matches
    from remat_dsl.check.verify import load_checked, verify

    plan = load_checked(str(plan)).plan if isinstance(plan, (str, Path)) else verify(plan).plan
    if model is not None:
        check_plan_matches(plan, model_of(model, inputs, loss_fn))
    return plan


def generate_module(plan: ir.Plan | str | Path) -> str:
    """The source of the standalone module that runs `plan` (an ir.Plan, or the path of a
    plan file), verified first as `check_plan` does: it imports torch and nothing of
    remat_dsl.  Raises PlanError and RematError."""
    from remat_dsl.check.verify import load_checked, verify
    from remat_dsl.codegen.generate import generate

    if isinstance(plan, (str, Path)):
        return generate(load_checked(str(plan)), source=Path(plan).name)
    return generate(verify(plan))


def fast_model(model: Any, plan: ir.Plan | str | Path, optimizer: Any = None):
    """`FastModel(model)` of `plan`'s generated module, in one call: an nn.Module that trains
    in place of `model` in a hand-written loop, Hugging Face `Trainer`, Accelerate or
    PyTorch Lightning, with the model's parameters, output type and state_dict keys (NOTE:
    [Trainers] in remat_dsl/codegen/runtime.py).

    plan: an ir.Plan or a plan file's path (the module is generated, verified first, into a
    temporary directory that lives as long as the module), or the path of a module `remat
    codegen` wrote (`.py`).  optimizer: as `FastModel` takes it (a plan of the whole step).
    Raises PlanError and RematError (the plan), ValueError and TypeError (`FastModel`: another
    model than the plan's)."""
    import tempfile

    if isinstance(plan, (str, Path)) and Path(plan).suffix == ".py":
        return load_module(plan).FastModel(model, optimizer)
    source = generate_module(plan)
    directory = tempfile.TemporaryDirectory(prefix="remat-module-")
    path = Path(directory.name) / "fast_model.py"
    path.write_text(source)
    module = load_module(path)
    module.TEMPORARY_DIRECTORY = directory  # removed with the module
    return module.FastModel(model, optimizer)


def load_module(path: str | Path):
    """Import a generated module from its file (a fresh module object at each call); its
    `FastModel(model)` runs the plan."""
    from remat_dsl.codegen.compare import load_generated

    return load_generated(path)


# NOTE: [Batch choice]
# `remat plan --optimizer ... --choose-batch` plans the whole step at several batch sizes
# and keeps the one with the least predicted time per sample that fits the budget.  X. Zhao,
# "Optimizing Memory Usage when Training Deep Neural Networks" (PhD thesis, Université de
# Bordeaux, 2024), section 4.5.3 "Adaptation: Batch Size Selection", makes r = 1/b a continuous variable of
# OffMate's ILP (O-ILP): compute time and activation memory proportional to the batch,
# parameter-related time and memory (offload, prefetch, optimizer states, update) fixed and
# scaled by r, so a larger batch amortizes the parameter and optimizer-state traffic until
# its activations no longer fit.  Here the batches are enumerated instead, each planned:
# the sample batch B (dim 0 of every tensor input, as `--dynamic batch` takes it), B/2,
# B/4, ... down to 1 (the inputs cut), and 2B, 4B, 8B (the inputs repeated along dim 0),
# upward only until the first batch whose whole step does not fit.  Each is captured
# (fake stays fake) and planned with the same options, and its step time and peaks are
# that plan's own predictions, not the sample's scaled in proportion: recomputation and
# offloading change with the batch, and so does each op's efficiency.  A percentage
# budget is of the sample batch's autograd peak, in bytes for every batch, so that all
# batches compete for the same memory.  Ties go to the smaller batch.


@dataclass(frozen=True)
class BatchTrial:
    """One batch of NOTE: [Batch choice]: its whole-step `plan` and that plan's host peak
    (bytes), or why it has none: `smallest`, the smallest budget that fits it (bytes), or
    `failure`, the message of a capture that failed at that batch."""

    batch: int
    plan: ir.Plan | None = None
    host_peak: int = 0
    smallest: int | None = None
    failure: str | None = None

    @property
    def per_sample(self) -> Fraction | None:
        """The predicted step time per sample (microseconds), None without a plan."""
        return None if self.plan is None else Fraction(self.plan.header.time_us, self.batch)


MAX_GROWTH = 8  # NOTE: [Batch choice]: the largest candidate is this many times the sample batch


def sample_batch(model_file) -> int:
    """The sample inputs' batch: dim 0, shared by every tensor input (NOTE: [Batch
    choice]).  Raises RematError when the inputs have no such dim."""
    import torch

    tensors = [v for v in model_file.sample_inputs().leaves() if isinstance(v, torch.Tensor)]
    shapes = ", ".join(str(list(t.shape)) for t in tensors) or "none"
    if not tensors or any(t.dim() == 0 or t.shape[0] != tensors[0].shape[0] for t in tensors):
        raise RematError(
            f"{model_file.path}: error: --choose-batch needs tensor inputs that share their dim 0, the batch;"
            f" sample_inputs() gives tensors of shapes {shapes}",
            hint="plan without --choose-batch, or give sample_inputs() tensors that share their batch dim",
        )
    return int(tensors[0].shape[0])


def at_batch(model_file, sample: int, batch: int):
    """`model_file` whose sample inputs have batch `batch`: each tensor input cut to its
    first `batch` rows (batch < sample), or repeated along dim 0 (`batch` a multiple of
    `sample`).  Its inputs are made when the capture asks for them (a fake capture makes
    them fake)."""
    import torch
    import torch.utils._pytree as pytree

    from remat_dsl.capture.shapes import NAMED, Dynamic, cut_inputs

    def grown(value):
        return torch.cat([value] * (batch // sample)) if isinstance(value, torch.Tensor) else value

    def inputs():
        given = model_file.sample_inputs()
        if batch <= sample:
            given = cut_inputs(given, Dynamic(NAMED["batch"]), (sample,), (batch,))
        else:
            given = type(given)(pytree.tree_map(grown, given.args), pytree.tree_map(grown, given.kwargs))
        return tuple(given.args), dict(given.kwargs)  # the (args, kwargs) form of the model file contract

    return replace(model_file, inputs=inputs)


def try_batches(sample: int, plan_at: Callable[[int], ir.Plan]) -> list[BatchTrial]:
    """NOTE: [Batch choice]: a BatchTrial for the sample batch, the batches above it up to
    MAX_GROWTH times it until the first that does not fit, and those below it down to 1,
    in increasing batch.  plan_at(batch): the whole step's plan at that batch; its
    BudgetError and, at another batch than the sample's, its RematError are recorded, not
    raised."""
    trials = []
    batch = sample
    while batch <= MAX_GROWTH * sample:
        trials.append(_trial(batch, plan_at, sample))
        if trials[-1].plan is None:
            break
        batch *= 2
    batch = sample
    while batch > 1:
        batch //= 2
        trials.append(_trial(batch, plan_at, sample))
    return sorted(trials, key=lambda t: t.batch)


def _trial(batch: int, plan_at: Callable[[int], ir.Plan], sample: int) -> BatchTrial:
    from remat_dsl.check.replay import simulate
    from remat_dsl.solve.api import BudgetError

    try:
        plan = plan_at(batch)
    except BudgetError as error:
        return BatchTrial(batch, smallest=error.smallest)
    except RematError as error:
        if batch == sample:
            raise
        return BatchTrial(batch, failure=error.message.splitlines()[0])
    return BatchTrial(batch, plan, simulate(plan).host_peak_bytes)


def chosen_batch(trials: list[BatchTrial]) -> BatchTrial:
    """The trial with the least time per sample among those with a plan, the smaller batch
    on a tie (NOTE: [Batch choice]).  Raises RematError when none has one."""
    fitting = [t for t in trials if t.plan is not None]
    if not fitting:
        smallest = min((t for t in trials if t.smallest is not None), key=lambda t: t.batch, default=None)
        hint = "pass a larger --budget"
        if smallest is not None:
            hint = f"plan with --budget {smallest.smallest}B or more (what batch {smallest.batch} needs)"
        raise RematError("error: --choose-batch: the whole step fits the budget at no batch tried", hint=hint)
    return min(fitting, key=lambda t: (t.per_sample, t.batch))
