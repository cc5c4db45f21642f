"""`remat plan MODEL --budget B > model.plan`: capture, cost, solve, print the plan.

NOTE: [Fail fast]
`remat plan` reads and checks every argument it can without the model (budget, solver,
bandwidth, constraints, `--from`, `--profile`, `--repeats`, the output path) before it
imports the model file, so a typo costs a second, not a capture: a budget, host budget or
bandwidth without its unit (`--budget 50`: 50 bytes, or 50%?) is refused first of all.
Right after the capture, a budget below the proven bound is refused before any solve
(NOTE: [Budgets below the bound] in remat_dsl/solve/driver.py).
"""

from __future__ import annotations

import argparse
import gc
import math
import sys
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

from remat_dsl.cli.console import Progress, check_writable, positive_int, report_noisy_timing, status, write_atomically
from remat_dsl.plan.errors import RematError

if TYPE_CHECKING:
    from remat_dsl.capture.cost import DeviceModel
    from remat_dsl.plan.optimizer import Optimizer
    from remat_dsl.capture.profile_file import ProfileFile
    from remat_dsl.plan import ir
    from remat_dsl.solve.api import Solver


def seconds(text: str) -> float:
    """An argparse type: a number of seconds > 0 (`--time-limit`)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of seconds, e.g. 60 or 2.5, got '{text}'") from None
    if not math.isfinite(value) or value <= 0:
        raise argparse.ArgumentTypeError(
            f"expected a number of seconds > 0, got '{text}' (leave the option out for no limit)"
        )
    return value


def autocast_dtype(text: str):
    """`--autocast`: torch.bfloat16 (`bf16`, `bfloat16`), torch.float16 (`fp16`, `float16`)
    or None (`none`).  Raises RematError (exit status 2) for anything else."""
    import torch

    from remat_dsl.capture.fx import AUTOCAST_FLAGS

    if text.lower() == "none":
        return None
    if text.lower() not in AUTOCAST_FLAGS:
        raise RematError(
            f"error: unknown --autocast dtype '{text}'",
            hint=(
                "torch.autocast runs in bf16 (torch.bfloat16) or fp16 (torch.float16); pass --autocast bf16, fp16 or"
                " none"
            ),
        )
    return getattr(torch, AUTOCAST_FLAGS[text.lower()])


def solver_choice(text: str):
    """`--solver`: a registered name (or `auto`), or an outside solver's class, imported
    from `path/to/file.py:Class` or `package.module:Class` (NOTE: [Outside solvers] in
    remat_dsl.solve.registry: the command line is the only place a solver is imported
    from).  Raises RematError (exit status 2) for anything else."""
    from remat_dsl.solve.registry import NAMES, is_outside_spec, outside_solver, unknown_solver

    if text in NAMES:
        return text
    if is_outside_spec(text):
        return outside_solver(text)
    raise unknown_solver(text)


class HelpSolver(argparse.Action):
    """`--help-solver [NAME]`: print the solver's settings (its Config: each field, its
    default and meaning) and exit; the solver is NAME, else the `--solver` given before."""

    def __call__(self, parser, namespace, values, option_string=None):
        from remat_dsl.solve.api import config_help
        from remat_dsl.solve.registry import NAMES, solver_class

        try:
            solver = solver_choice(values or namespace.solver)
        except RematError as error:
            parser.exit(2, error.format() + "\n")
        if solver == "auto":
            text = ("solver auto: picks a registered solver by the graph (docs/solvers.md); its settings are that "
                    f"solver's: pass --solver NAME --help-solver, NAME one of {', '.join(NAMES[1:])}\n")  # fmt: skip
        else:
            text = config_help(solver if isinstance(solver, type) else solver_class(solver))
        sys.stdout.write(text)  # help, as --help prints it: on stdout
        parser.exit(0)


def register(subparsers) -> None:
    plan = subparsers.add_parser("plan", help="capture and profile a model, solve, print the plan on stdout")
    plan.add_argument("model", help="model file, optionally path.py:factory")
    plan.add_argument(
        "--budget",
        help="a size with its unit (1.5GiB, 800MB, 65536B) or a percentage of the autograd peak (50%%); a number "
        "without a unit is refused; default: the constraints' budget (not needed with --solver autograd)",
    )
    plan.add_argument(
        "--constraints", help='a file of constraint lines: keep/recompute/offload/no-offload "GLOB", budget SIZE'
    )
    plan.add_argument(
        "--strict", action="store_true", help="a constraint pattern that matches no tensor is an error, not a warning"
    )
    plan.add_argument("--from", dest="from_plan", help="re-solve with this plan's constraints and budget")
    plan.add_argument(
        "--solver",
        default="auto",
        metavar="NAME|FILE.py:CLASS|MODULE:CLASS",
        help="auto (default: picks checkmate, rockmate or hiremate by graph structure and size, offmate when "
        "--bandwidth or a --device with a host link is given), offmate, rockmate, hiremate, checkmate, rotor, "
        "twremat (any graph size, no ILP), moccasin, checkpoint-sqrt or autograd; or an outside solver, a subclass of "
        "remat_dsl.solve.api.Solver: path/to/file.py:Class or package.module:Class (docs/solvers.md)",
    )
    plan.add_argument(
        "--help-solver",
        nargs="?",
        metavar="NAME",
        action=HelpSolver,
        help="print the settings of the --solver given before it (or of NAME): each field of its Config, its default "
        "and meaning; then exit",
    )
    plan.add_argument(
        "--device",
        metavar="NAME|FILE",
        help=(
            "plan for this device with costs predicted from op shapes (roofline): a100 (= a100-80gb), a100-40gb,"
            " h100 (= h100-sxm), h100-pcie, h200, gh200, l4, l40s, rtx3060, rtx4090, cpu (this machine kind), or a"
            " device-description .toml file (docs/devices.md); default: op times"
            " predicted for the device the model is on (its description: `cpu` here), sizes and temporaries measured"
            " here, so that the plan does not depend on this machine's load"
        ),
    )
    plan.add_argument(
        "--measure",
        action="store_true",
        help=(
            "time every operation here instead (--repeats runs; CUDA events on a GPU): the plan then depends on this"
            " machine and its load"
        ),
    )
    plan.add_argument(
        "--fake",
        action="store_true",
        help=(
            "capture with fake tensors (a FakeTensorMode): no weights or activations are allocated, costs come from"
            " --device (default cpu); automatic when the model would not fit in host memory"
        ),
    )
    plan.add_argument(
        "--autocast",
        metavar="bf16|fp16|none",
        help=(
            "capture and plan the step under torch.autocast(device, dtype) (bf16: torch.bfloat16, fp16: torch.float16);"
            " default: the model file's `autocast`, else none"
        ),
    )
    plan.add_argument(
        "--bandwidth",
        help="host<->device bandwidth per second, with its unit (12GB, 12GB/s; default: the --device's host link, "
        "else 12GB)",
    )
    plan.add_argument(
        "--host-budget",
        metavar="SIZE",
        help="host memory the offloaded activations may take, with its unit (offmate; 8GiB, 500MB, 0); "
        "default: unlimited",
    )
    plan.add_argument(
        "--optimizer",
        metavar='"KIND [NAME=VALUE ...]"',
        help=(
            "plan the whole step, ending with this optimizer's update of every parameter (adamw, adam, sgd; e.g."
            ' "adamw lr=1e-4 weight_decay=0.01"): the budget then counts the optimizer states kept on the device, and'
            " parameters whose states do not fit are updated on the host (docs/plan-language.md)"
        ),
    )
    plan.add_argument(
        "--choose-batch",
        action="store_true",
        help=(
            "with --optimizer: plan the whole step at the sample batch B (dim 0 of the inputs) and at B/2, B/4, ... 1"
            " and 2B, 4B, 8B (up to the first that does not fit), print a line per batch on stderr, and print the plan"
            " of the batch with the least predicted time per sample (docs/commands.md)"
        ),
    )
    plan.add_argument(
        "--repeats",
        type=positive_int,
        default=5,
        help="timed runs per operation, split over two timing passes; the least counts (default 5)",
    )
    plan.add_argument(
        "--time-limit",
        type=seconds,
        metavar="SECONDS",
        help=(
            "stop the solver after this many seconds (MILP solvers: the best plan found so far, status `feasible` with"
            " its gap); default: no limit (moccasin: 570 s per budget)"
        ),
    )
    plan.add_argument(
        "--jobs",
        type=positive_int,
        metavar="N",
        help=(
            "worker processes that may solve a block's ILPs at once when they are slow; the plan is the same for any N"
            " (default: the cores this process may use)"
        ),
    )
    plan.add_argument(
        "--record-solve-time",
        action="store_true",
        help=(
            "write the solver's run time into the header (`solve-time`); off by default so that plans are"
            " byte-identical from run to run"
        ),
    )
    plan.add_argument(
        "--profile",
        help=(
            "take every operation's time and temporary memory from this profile file (see `remat profile`) instead of"
            " measuring"
        ),
    )
    plan.add_argument(
        "--no-cache",
        action="store_true",
        help=(
            "neither read nor write the cache of measured op times and block solutions ($REMAT_CACHE_DIR, else"
            " ~/.cache/remat-dsl); it makes another budget for the same model take seconds"
        ),
    )
    plan.add_argument(
        "-q",
        "--quiet",
        action="store_true",
        help="show no progress on stderr (warnings and errors still show); stdout holds the plan either way",
    )
    plan.add_argument(
        "--dynamic",
        metavar="SIZES",
        help="batch: one plan for every batch size up to the sample inputs' (their dim 0), named `B` in the plan;"
        " batch,seq: also every sequence length up to theirs (dim 1), named `S`; B=0,S=1 or S=0,B=1: the dims"
        " explicitly (sequence-first layouts).  An op that pins a size is named and the plan made with that size"
        " fixed (NOTE: [Size probe] in remat_dsl/capture/shapes.py); default: the sample inputs' shapes only",
    )
    plan.add_argument("-o", "--output", help="write the plan here instead of stdout")
    plan.add_argument(
        "--force",
        action="store_true",
        help="with -o: replace the file even when it is one of the inputs or a file that is not a plan remat wrote",
    )
    plan.set_defaults(run=run)


@dataclass(frozen=True)
class PlanRequest:
    """Everything `remat plan` was asked, read and checked before the model is touched.

    budget: bytes, a percentage (`50%` -> 50.0) of the autograd peak, or None (autograd).
    bandwidth: bytes per second.  constraints: from --from, then --constraints.
    device_model: the `cost.DeviceModel` of --device, None to measure.  host_link: a
    bandwidth was given, or a --device with a host link (a `cuda` one).  host_budget:
    bytes (--host-budget), None for unlimited.
    """

    budget: int | float | None
    budget_is_percent: bool
    bandwidth: int
    constraints: tuple[ir.Constraint, ...]
    profile: ProfileFile | None
    output: Path | None
    device_model: DeviceModel | None = None
    host_link: bool = False
    host_budget: int | None = None
    solver: str | type[Solver] = "auto"  # a registry name, `auto`, or an outside solver's class
    optimizer: Optimizer | None = None  # --optimizer: the whole step (NOTE: [Optimizer in the step])


def _quantity(parse, text: str, what: str, **options):
    """`parse(text, what, **options)` (a function of remat_dsl.plan.units), its UnitError
    raised as a RematError."""
    from remat_dsl.plan.units import UnitError

    try:
        return parse(text, what, **options)
    except UnitError as error:
        raise RematError(f"error: {error.message}", hint=error.hint) from None


def _inputs(args) -> tuple:
    """(path, what) of every file `remat plan` reads (NOTE: [Safe outputs] in remat_dsl/cli/console.py)."""
    from remat_dsl.capture.model_file import split_spec

    model = split_spec(args.model)[0]
    return (
        (model, "model file"),
        (args.constraints, "constraints file"),
        (args.from_plan, "plan"),
        (args.profile, "profile"),
        (args.device, "device description"),
    )


def read_request(args) -> PlanRequest:
    """NOTE: [Fail fast]: the arguments of `remat plan`, checked.  Raises RematError."""
    from remat_dsl.plan.constraints import budget_of, located, read_constraints
    from remat_dsl.plan.parser import parse_file
    from remat_dsl.plan.units import parse_bandwidth, parse_percent, parse_size, refuse_bare_number
    from remat_dsl.solve.lowering import DEFAULT_BANDWIDTH

    solver = solver_choice(args.solver)
    if getattr(args, "dynamic", None) is not None:
        from remat_dsl.capture.shapes import parse_dynamic

        parse_dynamic(args.dynamic)  # NOTE: [Fail fast]: before the model is imported
    optimizer = None
    if getattr(args, "optimizer", None) is not None:
        from remat_dsl.workflow import whole_step_optimizer

        optimizer = whole_step_optimizer(args.optimizer)
    if getattr(args, "choose_batch", False):
        _refuse_batch_choice(args)
    for text, what in ((args.budget, "budget"), (args.host_budget, "host budget"), (args.bandwidth, "bandwidth")):
        if text is not None:  # a number without its unit: 50 is rarely meant as 50 bytes
            _quantity(refuse_bare_number, text, what, percent=what == "budget", per_second=what == "bandwidth")
    output = check_writable(args.output, "plan", inputs=_inputs(args), force=args.force) if args.output else None
    device_model = None
    if args.device is not None:
        from remat_dsl.capture.cost import load_device

        device_model = load_device(args.device)
    if args.bandwidth is None:
        bandwidth = int(device_model.host_to_device) if device_model is not None else DEFAULT_BANDWIDTH
    else:
        bandwidth = _quantity(parse_bandwidth, args.bandwidth, "bandwidth", exact=False)
    if bandwidth <= 0:
        raise RematError(
            f"error: the bandwidth must be more than 0 bytes per second, got '{args.bandwidth}'",
            hint="pass e.g. --bandwidth 12GB",
        )
    host_link = args.bandwidth is not None or (device_model is not None and device_model.kind == "cuda")
    host_budget = None
    if getattr(args, "host_budget", None) is not None:
        host_budget = _quantity(parse_size, args.host_budget, "host budget", exact=False)
        if host_budget < 0:
            raise RematError(
                f"error: the host budget must be 0 or more, got '{args.host_budget}'",
                hint="pass e.g. --host-budget 8GiB",
            )
    constraints: tuple[ir.Constraint, ...] = ()
    from_budget = None
    if args.from_plan:
        old = parse_file(args.from_plan)
        constraints, from_budget = located(old.constraints, args.from_plan), old.header.budget
    if args.constraints:
        constraints += read_constraints(args.constraints)
    profile = None
    if args.measure and (device_model is not None or args.profile or args.fake):
        given = "--device" if device_model is not None else "--profile" if args.profile else "--fake"
        raise RematError(
            f"error: --measure and {given} both give the op costs",
            hint=f"pass --measure to time every op here, or {given} alone",
        )
    if args.profile and device_model is not None:
        raise RematError(
            "error: --profile and --device both give the op costs",
            hint="pass --profile to use measured costs, or --device to predict them",
        )
    if args.profile:
        from remat_dsl.capture.profile_file import load_profile

        profile = load_profile(args.profile)
    fallback = budget_of(constraints) if budget_of(constraints) is not None else from_budget
    text = args.budget or (None if fallback is None else str(fallback))
    if text is None:
        if args.solver == "autograd":
            return PlanRequest(
                None, False, bandwidth, constraints, profile, output, device_model, host_link, host_budget, solver,
                optimizer,
            )  # fmt: skip
        raise RematError(
            "error: no budget given", hint="pass --budget (2GiB, 50%), or a `budget SIZE` constraint, or --from PLAN"
        )
    percent = parse_percent(text)
    budget = percent if percent is not None else _quantity(parse_size, text, "budget", exact=False)
    if budget <= 0:
        raise RematError(
            f"error: the budget must be more than 0, got '{text}'", hint="pass e.g. --budget 50% or --budget 2GiB"
        )
    return PlanRequest(
        budget,
        percent is not None,
        bandwidth,
        constraints,
        profile,
        output,
        device_model,
        host_link,
        host_budget,
        solver,
        optimizer,
    )


def _refuse_batch_choice(args) -> None:
    """NOTE: [Fail fast]: `--choose-batch` needs `--optimizer` and refuses `--dynamic` and
    `--profile`.  Raises RematError."""
    if args.optimizer is None:
        raise RematError(
            "error: --choose-batch plans the whole step: it needs --optimizer",
            hint='add e.g. --optimizer "adamw lr=1e-4" (a larger batch amortizes the parameters\' update)',
        )
    if getattr(args, "dynamic", None) is not None:
        raise RematError(
            "error: --choose-batch and --dynamic both set the batch the plan is for",
            hint="pass --choose-batch for the batch with the least time per sample, or --dynamic for every batch",
        )
    if args.profile:
        raise RematError(
            "error: --choose-batch captures the model at other batches, where --profile's op costs do not hold",
            hint="pass --choose-batch without --profile (op costs predicted or measured at each batch)",
        )


def run(args) -> int:
    from remat_dsl.capture.model_file import load_model_file
    from remat_dsl.plan.printer import print_plan
    from remat_dsl.plan.units import format_bytes, format_duration

    request = read_request(args)
    autocast = autocast_dtype(args.autocast) if args.autocast is not None else None  # NOTE: [Fail fast]
    quiet = getattr(args, "quiet", False)
    say = (lambda line: None) if quiet else status
    with Progress(f"loading {args.model}", unit=None, quiet=quiet):  # NOTE: [Progress] in plan/progress.py
        with imports_without_collection(getattr(args, "whole_process", False)):  # NOTE: [Garbage collection]
            model_file = load_model_file(args.model)
    if args.autocast is not None:  # overrides the model file's `autocast`
        model_file = replace(model_file, autocast=autocast)
    if getattr(args, "choose_batch", False):
        plan = _batch_chosen(model_file, args, request)
    else:
        plan = _planned(model_file, args, request, request.budget, request.budget_is_percent)
    seconds = plan.header.solve_seconds
    if not args.record_solve_time:
        plan = replace(plan, header=replace(plan.header, solve_seconds=None))
    text = print_plan(plan)
    if request.output:
        write_atomically(request.output, text)
    else:
        args.out.write(text)
    h = replace(plan.header, solve_seconds=seconds)
    say(
        f"predicted peak {format_bytes(h.peak_bytes)} at {h.peak_at}, time {format_duration(h.time_us)};"
        f" {solver_status(h)}"
    )
    return 0


def _planned(model_file, args, request: PlanRequest, budget, percent: bool) -> ir.Plan:
    """The plan of `model_file` as `remat plan` makes it: captured (NOTE: [Fake capture] in
    capture/pipeline.py), with the sizes of --dynamic, solved for `budget` (bytes, or with
    `percent` a percentage of the autograd peak).  Raises RematError and BudgetError."""
    from remat_dsl.solve.solvers.ilp import workers
    from remat_dsl.workflow import solve_captured, update_speeds

    quiet = getattr(args, "quiet", False)
    graph, device, costs, eager = _captured(model_file, args, request)
    if getattr(args, "dynamic", None) is not None:
        graph = _with_sizes(graph, model_file, args.dynamic, quiet)
    if eager:  # NOTE: [Eager agreement] in remat_dsl/capture/agreement.py; also above the plan's header
        status(" ".join(eager).replace("  ", " "))
    step = {}
    if request.optimizer is not None:  # NOTE: [Optimizer in the step]
        speeds = update_speeds(request.optimizer, request.device_model, device)
        step = dict(optimizer=request.optimizer, update_speeds=speeds)
    with Progress("planning", unit="block classes", quiet=quiet) as progress:
        return solve_captured(
            graph, budget, request.solver, percent=percent, model=model_file.spec,
            device=device, costs=costs, eager=eager, constraints=request.constraints, strict=args.strict,
            report=progress, bandwidth=request.bandwidth, time_limit=args.time_limit, host_link=request.host_link,
            host_budget=request.host_budget, cache=_cache(args), jobs=args.jobs or workers.usable_cores(), **step,
        )  # fmt: skip


def _batch_chosen(model_file, args, request: PlanRequest) -> ir.Plan:
    """NOTE: [Batch choice] in remat_dsl/workflow/__init__.py: the whole step planned at each candidate
    batch, a line per batch on stderr, and the plan of the chosen one with a comment on top
    that says why.  Raises RematError (no batch fits, a capture that fails at the sample
    batch)."""
    from remat_dsl.solve.api import BudgetError
    from remat_dsl.workflow import at_batch, chosen_batch, sample_batch, try_batches

    sample = sample_batch(model_file)
    # a percentage is of the sample batch's autograd peak, planned first: bytes for every batch
    budget, percent = request.budget, request.budget_is_percent

    def plan_at(batch: int) -> ir.Plan:
        nonlocal budget, percent
        if not getattr(args, "quiet", False):
            status(f"batch {batch}:")
        try:
            plan = _planned(at_batch(model_file, sample, batch), args, request, budget, percent)
        except BudgetError as error:
            budget, percent = error.budget, False
            raise
        budget, percent = plan.header.budget, False
        return plan

    trials = try_batches(sample, plan_at)
    for trial in trials:
        status(_batch_line(trial))
    chosen = chosen_batch(trials)
    status(f"chose batch {chosen.batch}: the least predicted time per sample of the batches that fit")
    tried = ", ".join(f"{t.batch}: {_per_sample(t, unit='')}" for t in trials)
    comment = f"remat plan --choose-batch: batch {chosen.batch}, the least predicted us per sample of {tried}"
    assert chosen.plan is not None  # chosen among the trials with a plan
    header = chosen.plan.header
    return replace(chosen.plan, header=replace(header, comments=(comment, *header.comments)))


def _per_sample(trial, unit: str = " us/sample") -> str:
    """The predicted time per sample (`12.34 us/sample`), or why the batch has no plan."""
    if trial.per_sample is not None:
        return f"{float(trial.per_sample):.2f}{unit}"
    return "does not fit" if trial.failure is None else "does not run"


def _batch_line(trial) -> str:
    """One line of the --choose-batch table (NOTE: [Batch choice] in remat_dsl/workflow/__init__.py)."""
    from remat_dsl.plan.units import format_bytes, format_duration

    if trial.plan is not None:
        h = trial.plan.header
        return (
            f"batch {trial.batch}: step {format_duration(h.time_us)}, {_per_sample(trial)}, peak"
            f" {format_bytes(h.peak_bytes)}, host peak {format_bytes(trial.host_peak)}"
        )
    if trial.failure is not None:
        return f"batch {trial.batch}: does not run ({trial.failure})"
    return f"batch {trial.batch}: does not fit (the smallest budget that fits is {format_bytes(trial.smallest)})"


# NOTE: [Garbage collection]
# Importing a model file imports torch and its libraries (transformers): hundreds of
# thousands of objects that live as long as the process.  Python's cyclic collector
# would traverse them all at every full collection, during the imports, then while dynamo
# traces the model, and once more when the interpreter exits: a large share of a warm
# `remat plan` (docs/measured-notes.md).  So in a `remat` process (`main()` run as the
# program, `args.whole_process`) the collector is paused while the model file is
# imported, what the imports made is then frozen (`gc.freeze`: kept out of every later
# collection), and `main` freezes everything again before it returns, so that exiting
# does not traverse it.  Garbage made later (the capture's) is still collected, only
# less often (every GC_THRESHOLD allocations, not 700: dynamo makes millions of objects
# while it traces); nothing a plan holds depends on when objects are collected.
# `main(argv)` called inside another program (the tests) leaves its collector alone:
# frozen objects that became cyclic garbage there would never be freed.


GC_THRESHOLD = 10_000  # allocations between two collections of the youngest generation


@contextmanager
def imports_without_collection(whole_process: bool):
    """NOTE: [Garbage collection]: in a `remat` process (`whole_process`), the cyclic
    garbage collector paused inside the block (if it was running), the objects made until
    its end frozen, and the collector then run every GC_THRESHOLD allocations; otherwise
    nothing."""
    enabled = gc.isenabled()
    if whole_process:
        gc.disable()
    try:
        yield
    finally:
        if whole_process:
            gc.freeze()
            gc.set_threshold(GC_THRESHOLD, *gc.get_threshold()[1:])
            if enabled:
                gc.enable()


def _captured(model_file, args, request: PlanRequest):
    """(graph, device kind, costs, comment lines) of the model: measured, predicted for
    --device (NOTE: [Fake capture] in capture/pipeline.py), or with costs from --profile;
    the lines say where eager PyTorch computes other bits (NOTE: [Eager agreement])."""
    import torch

    from remat_dsl.capture.pipeline import capture_graph, too_large_for_host
    from remat_dsl.plan.units import format_bytes

    fake, device_model = args.fake, request.device_model
    if not fake:
        sizes = too_large_for_host(model_file)
        if sizes is not None:
            status(
                f"the model's parameters and buffers take {format_bytes(sizes[0])}, too much of the"
                f" {format_bytes(sizes[1])} of host memory available: capturing it with fake tensors"
            )
            fake = True
    if not fake and device_model is not None and device_model.kind == "cuda" and not torch.cuda.is_available():
        fake = True  # NOTE: [Fused attention]: the GPU's attention kernels do not run here
        status(f"capturing with fake tensors: a plan for {device_model.name} holds kernels that run on CUDA only")
    if fake and device_model is None:
        from remat_dsl.capture.cost import load_device

        device_model = load_device("cpu")
        status("op costs predicted for this CPU (the `cpu` device description); pass --device for another device")
    if request.profile is None:
        verb = "profiling" if args.measure else "capturing"
        description = f"{verb} {model_file.spec}" + (" with fake tensors" if fake else "")
        with Progress(description, quiet=getattr(args, "quiet", False)) as progress:
            captured = capture_graph(
                model_file,
                args.repeats,
                progress,
                device_model=device_model,
                fake=fake,
                cache=_cache(args),
                check_eager=True,
                local_model=not args.measure,
            )
        report_noisy_timing(captured)
        if captured.cached:
            what = "times" if args.measure else "sizes and temporaries"
            if not getattr(args, "quiet", False):
                status(
                    f"op costs from the cache: {what} measured here in an earlier run (--no-cache measures them again)"
                )
        return captured.graph, captured.device, captured.costs, captured.eager
    from remat_dsl.capture.profile_file import apply_profile

    with Progress(f"capturing {model_file.spec}", quiet=getattr(args, "quiet", False)) as progress:
        captured = capture_graph(
            model_file,
            args.repeats,
            progress,
            measure_time=False,
            device_model=device_model,
            fake=fake,
            check_eager=True,
        )
    status(f"costs from {args.profile}")
    return apply_profile(captured.graph, request.profile, model=model_file.spec), captured.device, None, captured.eager


def _with_sizes(graph, model_file, dynamic: str, quiet: bool):
    """`graph` with the size symbols of --dynamic on its inputs and tangents and the size
    expressions in its ops; where an op pins a size, with a comment on its inputs that names
    it (NOTE: [Size probe] in remat_dsl/capture/shapes.py; the reason also goes to stderr)."""
    from remat_dsl.capture.shapes import parse_dynamic, probe_sizes, with_sizes

    with Progress(f"tracing {model_file.spec} at smaller sizes", unit=None, quiet=quiet):
        probe = probe_sizes(model_file, parse_dynamic(dynamic), model_file.autocast)
    graph = with_sizes(graph, probe)
    reasons = [pinned.reason() for pinned in probe.pinned]
    for reason in reasons:
        fixed = (
            "sample sizes"
            if not probe.sizes
            else "sample " + " and ".join(s for s in ("B", "S") if s not in probe.sizes)
        )
        status(f"warning: {reason}; the plan is for its {fixed} alone")
    if not reasons or not graph.inputs:
        return graph
    first = graph.inputs[0]
    return replace(graph, inputs=(replace(first, comments=(*first.comments, *reasons)), *graph.inputs[1:]))


def _cache(args):
    """The cache of measured op times and block solutions (NOTE: [Solution cache] in
    remat_dsl.plan.cache), or one that holds nothing with --no-cache."""
    from remat_dsl.plan.cache import NO_CACHE, default_cache

    return NO_CACHE if args.no_cache else default_cache()


def solver_status(header) -> str:
    """`status optimal`, or with what the header records of the solve:
    `status feasible, gap 1.23%, solve time 2.4 s`."""
    from remat_dsl.plan.units import format_gap, format_seconds

    parts = [f"status {header.status}"]
    if header.gap is not None:
        parts.append(f"gap {format_gap(header.gap)}")
    if header.solve_seconds is not None:
        parts.append(f"solve time {format_seconds(header.solve_seconds)}")
    return ", ".join(parts)
