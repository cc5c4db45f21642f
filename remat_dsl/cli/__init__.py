"""The `remat` command: plan, check, codegen (and profile, fmt, diff, show, git drivers).

Every user-facing error is a RematError: printed as `file:line:col: error: ...` with a
hint, exit status 2, no traceback, and no output file left behind.  A command writes its
output (a plan, a report) into `args.out`; `main` copies it to the real stdout only when
the command succeeded, and while the command runs file descriptor 1 points at stderr
(NOTE: [Stdout is the data] in remat_dsl.cli.console), so `remat plan m.py > m.plan` holds the
plan and nothing else, or nothing at all.

NOTE: [Fail fast]
`remat plan` reads and checks every argument it can without the model (budget, solver,
bandwidth, constraints, `--from`, `--profile`, `--repeats`, the output path) before it
imports the model file, so a typo costs a second, not a capture.
"""

from __future__ import annotations

import argparse
import io
import math
import re
import sys
from dataclasses import dataclass, replace
from pathlib import Path

from remat_dsl.capture import profile_file
from remat_dsl.review import diff, fmt, show
from remat_dsl.cli.console import Progress, check_writable, positive_int, status, stdout_to_stderr, write_atomically, write_stdout
from remat_dsl.plan.errors import RematError

EXIT_USER_ERROR = 2
SOLVERS = ("auto", "autograd", "checkpoint-sqrt", "rotor", "rockmate", "hiremate", "checkmate")


def main(argv: list[str] | None = None) -> int:
    parser = _argument_parser()
    args = parser.parse_args(argv)
    args.out = io.StringIO()
    try:
        with stdout_to_stderr():
            code = args.run(args)
    except RematError as error:
        print(error.format(), file=sys.stderr)
        return EXIT_USER_ERROR
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    write_stdout(args.out.getvalue())
    return code


def _seconds(text: str) -> float:
    """An argparse type: a number of seconds > 0 (`--time-limit`)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of seconds, e.g. 60 or 2.5, got '{text}'") from None
    if not math.isfinite(value) or value <= 0:
        raise argparse.ArgumentTypeError(f"expected a number of seconds > 0, got '{text}' (leave the option out for no limit)")
    return value


def _argument_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="remat", description="Plan, check and compile rematerialization plans for PyTorch training.")
    sub = parser.add_subparsers(required=True, metavar="COMMAND")

    plan = sub.add_parser("plan", help="capture and profile a model, solve, print the plan on stdout")
    plan.add_argument("model", help="model file, optionally path.py:factory")
    plan.add_argument("--budget", help="bytes with a unit (1.5GiB, 800MB) or a percentage of the autograd peak (50%%); default: the constraints' budget (not needed with --solver autograd)")
    plan.add_argument("--constraints", help="a file of constraint lines: keep/recompute/offload/no-offload \"GLOB\", budget SIZE")
    plan.add_argument("--strict", action="store_true", help="a constraint pattern that matches no tensor is an error, not a warning")
    plan.add_argument("--from", dest="from_plan", help="re-solve with this plan's constraints and budget")
    plan.add_argument(
        "--solver",
        default="auto",
        choices=SOLVERS,
        help="auto (default: picks checkmate, rockmate or hiremate by graph structure and size), "
        "rockmate, hiremate, checkmate, rotor, checkpoint-sqrt or autograd",
    )
    plan.add_argument("--bandwidth", default="12GB", help="host<->device bandwidth per second (default 12GB)")
    plan.add_argument("--repeats", type=positive_int, default=5, help="timed runs per operation (median)")
    plan.add_argument("--time-limit", type=_seconds, metavar="SECONDS", help="stop the solver after this many seconds (MILP solvers: the best plan found so far, status `feasible` with its gap); default: no limit")
    plan.add_argument("--record-solve-time", action="store_true", help="write the solver's run time into the header (`solve-time`); off by default so that plans are byte-identical from run to run")
    plan.add_argument("--profile", help="take every operation's time and temporary memory from this profile file (see `remat profile`) instead of measuring")
    plan.add_argument("-o", "--output", help="write the plan here instead of stdout")
    plan.set_defaults(run=_plan)

    check = sub.add_parser("check", help="validate a plan and report its predicted peak memory and time")
    check.add_argument("plan")
    check.add_argument("--model", nargs="?", const="", help="also check the plan against a model file (default: the one in its header): its inputs, parameters and captured graph")
    check.set_defaults(run=_check)

    codegen = sub.add_parser("codegen", help="generate a standalone PyTorch module that runs a plan")
    codegen.add_argument("plan")
    codegen.add_argument("-o", "--output", required=True, help="the .py file to write")
    codegen.set_defaults(run=_codegen)
    for module in (profile_file, fmt, diff, show):
        module.add_parsers(sub)
    return parser


# ---------------------------------------------------------------------------
# remat plan
# ---------------------------------------------------------------------------


@dataclass(frozen=True)
class PlanRequest:
    """Everything `remat plan` was asked, read and checked before the model is touched.

    budget: bytes, a percentage (`50%` -> 50.0) of the autograd peak, or None (autograd).
    bandwidth: bytes per second.  constraints: from --from, then --constraints.
    """

    budget: int | float | None
    budget_is_percent: bool
    bandwidth: int
    constraints: tuple
    profile: object | None
    output: Path | None


def read_request(args) -> PlanRequest:
    """NOTE: [Fail fast]: the arguments of `remat plan`, checked.  Raises RematError."""
    from remat_dsl.plan.constraints import budget_of, located, read_constraints
    from remat_dsl.plan.parser import parse_file
    from remat_dsl.solve.driver import parse_bytes

    output = check_writable(args.output, "plan") if args.output else None
    bandwidth = parse_bytes(args.bandwidth, "bandwidth", "per second, e.g. 12GB")
    if bandwidth <= 0:
        raise RematError(f"error: the bandwidth must be more than 0 bytes per second, got '{args.bandwidth}'", hint="pass e.g. --bandwidth 12GB")
    constraints, from_budget = (), None
    if args.from_plan:
        old = parse_file(args.from_plan)
        constraints, from_budget = located(old.constraints, args.from_plan), old.header.budget
    if args.constraints:
        constraints += read_constraints(args.constraints)
    profile = None
    if args.profile:
        from remat_dsl.capture.profile_file import load_profile

        profile = load_profile(args.profile)
    fallback = budget_of(constraints) if budget_of(constraints) is not None else from_budget
    text = args.budget or (None if fallback is None else str(fallback))
    if text is None:
        if args.solver == "autograd":
            return PlanRequest(None, False, bandwidth, constraints, profile, output)
        raise RematError("error: no budget given", hint="pass --budget (2GiB, 50%), or a `budget SIZE` constraint, or --from PLAN")
    percent = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*%\s*", text)
    budget = float(percent.group(1)) if percent else parse_bytes(text, "budget", "or a percentage of the autograd peak (50%)")
    if budget <= 0:
        raise RematError(f"error: the budget must be more than 0, got '{text}'", hint="pass e.g. --budget 50% or --budget 2GiB")
    return PlanRequest(budget, bool(percent), bandwidth, constraints, profile, output)


def _plan(args) -> int:
    from remat_dsl.plan.constraints import unmatched
    from remat_dsl.capture.model_file import load_model_file
    from remat_dsl.plan.printer import print_plan
    from remat_dsl.solve.driver import autograd_peak, make_plan

    request = read_request(args)
    model_file = load_model_file(args.model)
    graph, device = _captured(model_file, args, request)
    for warning in unmatched(graph, request.constraints):
        if args.strict:
            raise RematError(warning.replace("warning:", "error:", 1), hint="fix the pattern or remove the line (without --strict this is a warning)")
        status(warning)
    if request.budget is None or request.budget_is_percent:
        peak = autograd_peak(graph, device)
        budget = peak if request.budget is None else math.floor(peak * request.budget / 100)
    else:
        budget = int(request.budget)
    limit = f", time limit {args.time_limit:g} s" if args.time_limit is not None else ""
    status(f"solving with {args.solver} for a budget of {budget} bytes{limit}")
    plan = make_plan(
        graph, model=model_file.spec, device=device, budget=budget, solver=args.solver,
        bandwidth=request.bandwidth, constraints=request.constraints, time_limit=args.time_limit,
    )  # fmt: skip
    seconds = plan.header.solve_seconds
    if not args.record_solve_time:
        plan = replace(plan, header=replace(plan.header, solve_seconds=None))
    text = print_plan(plan)
    if request.output:
        write_atomically(request.output, text)
    else:
        args.out.write(text)
    status(f"predicted peak {plan.header.peak_bytes} bytes at {plan.header.peak_at}, time {plan.header.time_us / 1000:.3f} ms; {solver_status(replace(plan.header, solve_seconds=seconds))}")
    return 0


def _captured(model_file, args, request: PlanRequest):
    """(graph, device) of the model: measured, or with costs from --profile."""
    from remat_dsl.capture.pipeline import capture_graph

    if request.profile is None:
        with Progress(f"profiling {model_file.spec}") as progress:
            captured = capture_graph(model_file, args.repeats, progress)
        return captured.graph, captured.device
    from remat_dsl.capture.profile_file import apply_profile

    with Progress(f"capturing {model_file.spec}") as progress:
        captured = capture_graph(model_file, args.repeats, progress, measure_time=False)
    status(f"costs from {args.profile}")
    return apply_profile(captured.graph, request.profile, model=model_file.spec), captured.device


def solver_status(header) -> str:
    """`status optimal`, or with what the header records of the solve: `status feasible, gap 1.23%, solve time 2.4 s`."""
    from remat_dsl.plan.printer import format_gap, format_seconds

    parts = [f"status {header.status}"]
    if header.gap is not None:
        parts.append(f"gap {format_gap(header.gap)}")
    if header.solve_seconds is not None:
        parts.append(f"solve time {format_seconds(header.solve_seconds)}")
    return ", ".join(parts)


# ---------------------------------------------------------------------------
# remat check, remat codegen
# ---------------------------------------------------------------------------


def _check(args) -> int:
    from remat_dsl.check.verify import load_checked
    from remat_dsl.check.report import check_report

    plan, sim = load_checked(args.plan)
    if args.model is not None:
        _check_model(args.plan, plan, args.model or plan.header.model)
    args.out.write(check_report(args.plan, plan, sim) + "\n")
    if plan.header.gap is not None or plan.header.solve_seconds is not None:
        args.out.write(solver_status(plan.header) + "\n")
    return 0


def _check_model(path: str, plan, spec: str) -> None:
    from remat_dsl.cli.console import read_text
    from remat_dsl.plan.errors import PlanError
    from remat_dsl.capture.model_file import check_plan_matches, load_model_file

    try:
        check_plan_matches(plan, load_model_file(spec))
    except PlanError as error:
        raise error.with_source(path, read_text(path, "plan")) from None


def _codegen(args) -> int:
    from remat_dsl.check.verify import load_checked
    from remat_dsl.codegen.generate import generate

    output = check_writable(args.output, "module")
    plan, _ = load_checked(args.plan)
    source = generate(plan, source=Path(args.plan).name)
    write_atomically(output, source)
    status(f"wrote {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
