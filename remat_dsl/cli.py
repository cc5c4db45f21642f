"""The `remat` command: plan, check, codegen.

Every user-facing error is a RematError: printed as `file:line:col: error: ...` with a
hint, exit status 2, no traceback, and no output file left behind.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

from remat_dsl import diff, fmt, profile_file, show
from remat_dsl.errors import RematError

EXIT_USER_ERROR = 2


def main(argv: list[str] | None = None) -> int:
    parser = _argument_parser()
    args = parser.parse_args(argv)
    try:
        return args.run(args)
    except RematError as error:
        print(error.format(), file=sys.stderr)
        return EXIT_USER_ERROR
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


def _argument_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="remat", description="Plan, check and compile rematerialization plans for PyTorch training.")
    sub = parser.add_subparsers(required=True, metavar="COMMAND")

    plan = sub.add_parser("plan", help="capture and profile a model, solve, print the plan on stdout")
    plan.add_argument("model", help="model file, optionally path.py:factory")
    plan.add_argument("--budget", help="bytes with a unit (1.5GiB, 800MB) or a percentage of the autograd peak (50%%); default: the constraints' budget")
    plan.add_argument("--constraints", help="a file of constraint lines: keep/recompute/offload/no-offload \"GLOB\", budget SIZE")
    plan.add_argument("--from", dest="from_plan", help="re-solve with this plan's constraints and budget")
    plan.add_argument(
        "--solver",
        default="auto",
        help="auto (default: picks checkmate, rockmate or hiremate by graph structure and size), "
        "rockmate, hiremate, checkmate, rotor, checkpoint-sqrt or autograd",
    )
    plan.add_argument("--bandwidth", default="12GB", help="host<->device bandwidth per second (default 12GB)")
    plan.add_argument("--repeats", type=int, default=5, help="timed runs per operation (median)")
    plan.add_argument("--time-limit", type=_seconds, metavar="SECONDS", help="stop the solver after this many seconds (MILP solvers: the best plan found so far, status `feasible` with its gap); default: no limit")
    plan.add_argument("--profile", help="take every operation's time and temporary memory from this profile file (see `remat profile`) instead of measuring")
    plan.add_argument("-o", "--output", help="write the plan here instead of stdout")
    plan.set_defaults(run=_plan)

    check = sub.add_parser("check", help="validate a plan and report its predicted peak memory and time")
    check.add_argument("plan")
    check.add_argument("--model", nargs="?", const="", help="also check the plan against a model file (default: the one in its header)")
    check.set_defaults(run=_check)

    codegen = sub.add_parser("codegen", help="generate a standalone PyTorch module that runs a plan")
    codegen.add_argument("plan")
    codegen.add_argument("-o", "--output", required=True, help="the .py file to write")
    codegen.set_defaults(run=_codegen)
    for module in (profile_file, fmt, diff, show):
        module.add_parsers(sub)
    return parser


def _plan(args) -> int:
    from remat_dsl.model_file import load_model_file
    from remat_dsl.pipeline import capture_graph
    from remat_dsl.printer import print_plan
    from remat_dsl.solve import autograd_peak, make_plan, parse_budget, parse_bytes

    model_file = load_model_file(args.model)
    if args.profile:
        from dataclasses import replace

        from remat_dsl.profile_file import apply_profile, load_profile

        profile = load_profile(args.profile)
        with _Progress(f"capturing {model_file.spec}") as progress:
            captured = capture_graph(model_file, args.repeats, progress, measure_time=False)
        captured = replace(captured, graph=apply_profile(captured.graph, profile, model=model_file.spec))
        _status(f"costs from {args.profile}")
    else:
        with _Progress(f"profiling {model_file.spec}") as progress:
            captured = capture_graph(model_file, args.repeats, progress)
    constraints, budget_text = _constraints_and_budget(args)
    budget = parse_budget(budget_text, lambda: autograd_peak(captured.graph, captured.device))
    bandwidth = parse_bytes(args.bandwidth, "bandwidth", "per second")
    limit = f", time limit {args.time_limit:g} s" if args.time_limit is not None else ""
    _status(f"solving with {args.solver} for a budget of {budget} bytes{limit}")
    plan = make_plan(
        captured.graph, model=model_file.spec, device=captured.device, budget=budget, solver=args.solver,
        bandwidth=bandwidth, constraints=constraints, time_limit=args.time_limit,
    )  # fmt: skip
    text = print_plan(plan)
    if args.output:
        write_atomically(Path(args.output), text)
    else:
        sys.stdout.write(text)
    _status(f"predicted peak {plan.header.peak_bytes} bytes at {plan.header.peak_at}, time {plan.header.time_us / 1000:.3f} ms; {solver_status(plan.header)}")
    return 0


def _seconds(text: str) -> float:
    """An argparse type: a number of seconds > 0 (`--time-limit`)."""
    import math

    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of seconds, e.g. 60 or 2.5, got '{text}'") from None
    if not math.isfinite(value) or value <= 0:
        raise argparse.ArgumentTypeError(f"expected a number of seconds > 0, got '{text}' (leave the option out for no limit)")
    return value


def solver_status(header) -> str:
    """`status optimal`, or with what the header records of the solve: `status feasible, gap 1.23%, solve time 2.4 s`."""
    from remat_dsl.printer import format_gap, format_seconds

    parts = [f"status {header.status}"]
    if header.gap is not None:
        parts.append(f"gap {format_gap(header.gap)}")
    if header.solve_seconds is not None:
        parts.append(f"solve time {format_seconds(header.solve_seconds)}")
    return ", ".join(parts)


def _constraints_and_budget(args) -> tuple[tuple, str]:
    """Constraints from --from PLAN and --constraints FILE, and the budget text to use:
    --budget, else the last `budget` constraint, else the --from plan's budget."""
    from remat_dsl.constraints import budget_of, located, read_constraints
    from remat_dsl.parser import parse_file

    constraints, fallback = (), None
    if args.from_plan:
        old = parse_file(args.from_plan)
        constraints, fallback = located(old.constraints, args.from_plan), old.header.budget
    if args.constraints:
        constraints += read_constraints(args.constraints)
    budget = args.budget or budget_of(constraints) or fallback
    if budget is None:
        raise RematError("error: no budget given", hint="pass --budget (2GiB, 50%), or a `budget SIZE` constraint, or --from PLAN")
    return constraints, str(budget)


def load_checked(path: str):
    """Parse and simulate a plan file: (plan, simulation).  Raises PlanError."""
    from remat_dsl.constraints import check_plan
    from remat_dsl.errors import PlanError
    from remat_dsl.parser import parse
    from remat_dsl.simulate import simulate

    try:
        text = Path(path).read_text()
    except OSError as exc:
        raise RematError(f"{path}: error: cannot read the plan: {exc.strerror}") from None
    plan = parse(text, path)
    try:
        simulation = simulate(plan)
        check_plan(plan)
        return plan, simulation
    except PlanError as error:
        error.path, error.source = error.path or path, error.source or text
        raise


def _check(args) -> int:
    from remat_dsl.report import check_report

    plan, sim = load_checked(args.plan)
    if args.model is not None:
        _check_model(args.plan, plan, args.model or plan.header.model)
    print(check_report(args.plan, plan, sim))
    if plan.header.gap is not None or plan.header.solve_seconds is not None:
        print(solver_status(plan.header))
    if sim.peak_bytes > plan.header.budget:
        from remat_dsl.errors import PlanError
        from remat_dsl.report import check_budget

        try:
            check_budget(plan, sim)
        except PlanError as error:
            raise error.with_source(args.plan, Path(args.plan).read_text()) from None
    return 0


def _check_model(path: str, plan, spec: str) -> None:
    from remat_dsl.errors import PlanError
    from remat_dsl.model_file import check_plan_matches, load_model_file

    try:
        check_plan_matches(plan, load_model_file(spec))
    except PlanError as error:
        raise error.with_source(path, Path(path).read_text()) from None


def _codegen(args) -> int:
    from remat_dsl.codegen import generate

    plan, _ = load_checked(args.plan)
    source = generate(plan, source=os.path.basename(args.plan))
    write_atomically(Path(args.output), source)
    _status(f"wrote {args.output}")
    return 0


def write_atomically(path: Path, text: str) -> None:
    """Write `text` to `path` through a temporary file, so a failure leaves no half file."""
    directory = path.resolve().parent
    fd, temp = tempfile.mkstemp(dir=directory, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as handle:
            handle.write(text)
        os.replace(temp, path)
    except BaseException:
        Path(temp).unlink(missing_ok=True)
        raise


def _status(message: str) -> None:
    print(message, file=sys.stderr)


class _Progress:
    """A rich progress bar on stderr (plain when stderr is not a terminal)."""

    def __init__(self, description: str):
        from rich.console import Console
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        console = Console(stderr=True)
        self.bar = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(), console=console, transient=not console.is_terminal)
        self.description = description
        self.task = None

    def __enter__(self):
        self.bar.start()
        self.task = self.bar.add_task(self.description + " (capturing)", total=None)
        return self

    def start(self, total: int) -> None:
        self.bar.update(self.task, total=total, description=self.description)

    def advance(self, n: int) -> None:
        self.bar.advance(self.task, n)

    def __exit__(self, *exc) -> None:
        self.bar.stop()


if __name__ == "__main__":
    sys.exit(main())
