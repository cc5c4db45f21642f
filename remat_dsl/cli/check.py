"""`remat check PLAN [--model [MODEL]]`: verify a plan and report its predicted peak and time."""

from __future__ import annotations


def register(subparsers) -> None:
    check = subparsers.add_parser("check", help="validate a plan and report its predicted peak memory and time")
    check.add_argument("plan")
    check.add_argument(
        "--model",
        nargs="?",
        const="",
        help=(
            "also check the plan against a model file (default: the one in its header): its inputs, parameters and"
            " captured graph"
        ),
    )
    check.add_argument(
        "--host-budget",
        metavar="SIZE",
        help="also refuse the plan when its host memory (offloaded copies; with an optimizer, the host's master "
        "copies, optimizer states and parameters) is above SIZE (8GiB, 500MB)",
    )
    check.set_defaults(run=run)


def run(args) -> int:
    from remat_dsl.check.report import check_report
    from remat_dsl.check.verify import load_checked
    from remat_dsl.cli.plan import solver_status

    host_budget = None
    if args.host_budget is not None:  # NOTE: [Fail fast]: before the plan is read
        from remat_dsl.cli.plan import _quantity
        from remat_dsl.plan.units import parse_size

        host_budget = _quantity(parse_size, args.host_budget, "host budget", exact=False)
    verified = load_checked(args.plan)
    plan = verified.plan
    host = verified.simulation.host_peak_bytes
    if host_budget is not None and host > host_budget:
        from remat_dsl.plan.errors import RematError
        from remat_dsl.plan.units import format_bytes

        raise RematError(
            f"error: {args.plan}: the plan holds {format_bytes(host)} of host memory, above the host budget "
            f"{format_bytes(host_budget)}",
            hint="plan again with --host-budget, or raise it",
        )
    if args.model is not None:
        _check_model(args.plan, plan, args.model or plan.header.model)
    args.out.write(check_report(args.plan, verified) + "\n")
    if plan.header.gap is not None or plan.header.solve_seconds is not None:
        args.out.write(solver_status(plan.header) + "\n")
    return 0


def _check_model(path: str, plan, spec: str) -> None:
    from remat_dsl.capture.model_file import load_model_file
    from remat_dsl.capture.pipeline import check_plan_matches
    from remat_dsl.plan.errors import PlanError
    from remat_dsl.plan.files import read_text

    try:
        check_plan_matches(plan, load_model_file(spec))
    except PlanError as error:
        raise error.with_source(path, read_text(path, "plan")) from None
