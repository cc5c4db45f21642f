"""`remat codegen PLAN -o FILE`: write the standalone module that runs a verified plan."""

from __future__ import annotations

from pathlib import Path

from remat_dsl.cli.console import check_writable, status, write_atomically


def register(subparsers) -> None:
    codegen = subparsers.add_parser("codegen", help="generate a standalone PyTorch module that runs a plan")
    codegen.add_argument("plan")
    codegen.add_argument("-o", "--output", required=True, help="the .py file to write")
    codegen.add_argument(
        "--force",
        action="store_true",
        help="replace the output even when it is the plan or a file that is not a module remat generated",
    )
    codegen.set_defaults(run=run)


def run(args) -> int:
    from remat_dsl.workflow import generate_module

    output = check_writable(args.output, "module", inputs=((args.plan, "plan"),), force=args.force)
    write_atomically(output, generate_module(Path(args.plan)))
    status(f"wrote {args.output}")
    return 0
