"""The `remat` command: one module per command, no domain code.

Every user-facing error is a RematError: printed as `file:line:col: error: ...` with a
hint, exit status 2, no traceback, and no output file left behind.  A command writes its
output (a plan, a report) into `args.out`; `main` copies it to the real stdout only when
the command succeeded, and while the command runs file descriptor 1 points at stderr
(NOTE: [Stdout is the data] in remat_dsl.cli.console), so `remat plan m.py > m.plan` holds
the plan and nothing else, or nothing at all.
"""

from __future__ import annotations

import argparse
import gc
import io
import sys

from remat_dsl.cli import check, codegen, diff, fmt, git, plan, profile, show
from remat_dsl.cli.console import stdout_to_stderr, write_stdout
from remat_dsl.plan.errors import RematError

EXIT_USER_ERROR = 2
COMMANDS = (plan, check, codegen, profile, fmt, diff, git, show)  # each registers its subcommands


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    args.out = io.StringIO()
    args.whole_process = argv is None  # the `remat` program (NOTE: [Garbage collection] in cli/plan.py)
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
    if args.whole_process:
        gc.freeze()  # exiting need not traverse what the command made (NOTE: [Garbage collection])
    return code


def parser() -> argparse.ArgumentParser:
    """The `remat` argument parser with every command's subparser."""
    top = argparse.ArgumentParser(prog="remat", description="Plan, check and compile rematerialization plans for PyTorch training.")
    sub = top.add_subparsers(required=True, metavar="COMMAND")
    for command in COMMANDS:
        command.register(sub)
    return top
