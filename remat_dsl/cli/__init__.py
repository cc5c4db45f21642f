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
import atexit
import gc
import io
import os
import signal
import sys
import threading
from typing import NoReturn

from remat_dsl.cli import check, codegen, diff, fmt, git, plan, profile, show
from remat_dsl.cli.console import flush_c_stdio, stdout_to_stderr, write_stdout
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
    except Terminated as ended:  # NOTE: [Signals]
        print(f"terminated by {signal.Signals(ended.signum).name}", file=sys.stderr)
        return 128 + ended.signum
    write_stdout(args.out.getvalue())
    if args.whole_process:
        gc.freeze()  # exiting need not traverse what the command made (NOTE: [Garbage collection])
    return code


# NOTE: [Exit]
# When a `remat` process has done its work, the interpreter still tears down every module
# it imported: torch's, and a model file's transformers, hundreds of thousands of objects
# freed one by one, a measurable part of a warm `remat plan` (docs/measured-notes.md;
# NOTE: [Garbage collection] in cli/plan.py takes the collector's share out of it).
# Nothing the command made needs it: its output is written and flushed (NOTE: [Stdout is
# the data], NOTE: [Output files]).  So the program (`program`, what the `remat` script and
# `python -m remat_dsl` run) does what a normal exit does that can matter (the atexit
# functions, which finalize temporary directories too; Python's and C's buffered output),
# and then ends the process with os._exit.  While a thread other than the main one still
# runs, the exit is the normal one, which waits for it.  `main` itself returns normally:
# the tests and the DDP workers call it inside their own process.


# NOTE: [Signals]
# Python turns SIGINT into KeyboardInterrupt, so Ctrl-C unwinds a command: its `finally`
# blocks run (`remat plan` stops its worker processes, NOTE: [Workers end with their
# parent] in remat_dsl/solve/solvers/ilp/workers.py) and nothing is half-written (NOTE: [Output
# files]).  SIGTERM (`kill`, a CI job's timeout) and SIGHUP (a closed terminal) end a
# process at once, without unwinding: its workers would go on solving.  So the `remat`
# program turns them into
# the exception Terminated, handled as KeyboardInterrupt is: `terminated by SIGTERM` and
# exit status 128 + the signal's number.  The handler is the program's, not `main`'s,
# which the tests call inside their own process.  A second such signal while the first
# unwinds ends the process at once (the default action): the workers then end by
# themselves.


class Terminated(BaseException):
    """SIGTERM or SIGHUP reached the `remat` program (NOTE: [Signals]); `signum` says which.
    A BaseException, as KeyboardInterrupt is, so that `except Exception` lets it through."""

    def __init__(self, signum: int):
        super().__init__(signum)
        self.signum = signum


TERMINATING = (signal.SIGTERM, signal.SIGHUP)


def _terminate(signum, frame) -> None:
    for number in TERMINATING:  # a second signal ends the process at once
        signal.signal(number, signal.SIG_DFL)
    raise Terminated(signum)


def program() -> NoReturn:
    """The `remat` program: `main()` on sys.argv, then exit with its status (0 success,
    2 a user error, 130 interrupted, 128 + N ended by signal N: NOTE: [Signals]) without
    tearing down the modules it imported (NOTE: [Exit]).  An error of the tool itself (a
    traceback) exits as Python does."""
    for number in TERMINATING:
        if signal.getsignal(number) is not signal.SIG_IGN:  # `nohup remat ...` keeps SIGHUP ignored
            signal.signal(number, _terminate)
    code: str | int | None
    try:
        code = main()
    except SystemExit as exc:  # argparse: --help, a usage error
        code = exc.code
    except Terminated as ended:  # before `main` handles it (while the arguments are read)
        code = 128 + ended.signum
    for number in TERMINATING:
        if signal.getsignal(number) is _terminate:
            signal.signal(number, signal.SIG_DFL)
    if code is None:
        code = 0
    elif not isinstance(code, int):  # sys.exit("message"): printed, status 1
        print(code, file=sys.stderr)
        code = 1
    if any(thread is not threading.main_thread() and not thread.daemon for thread in threading.enumerate()):
        sys.exit(code)
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # closed, or a closed pipe: as at a normal exit, nothing more to write
            pass
    flush_c_stdio()
    os._exit(code)


def parser() -> argparse.ArgumentParser:
    """The `remat` argument parser with every command's subparser."""
    top = argparse.ArgumentParser(
        prog="remat", description="Plan, check and compile rematerialization plans for PyTorch training."
    )
    sub = top.add_subparsers(required=True, metavar="COMMAND")
    for command in COMMANDS:
        command.register(sub)
    return top
