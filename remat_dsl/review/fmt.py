"""`remat fmt FILE...`: rewrite plan files in the canonical layout of `remat_dsl.plan.printer`.

Formatting is parse + print: comments are kept (the parser attaches them to items), and
the result is a fixed point (`fmt(fmt(text)) == fmt(text)`).  Every file is read and
parsed before any is written, so an unreadable or invalid file changes nothing.

`--check` writes nothing: it lists the files that would change on stdout and exits 1
when there are any (0 otherwise), for CI.
"""

from __future__ import annotations

from pathlib import Path

from remat_dsl.cli.console import read_text, status, write_atomically
from remat_dsl.plan.errors import PlanError

EXIT_WOULD_CHANGE = 1


def read_plan_text(path: str) -> str:
    """The UTF-8 text of the plan file at `path`; raises RematError when it cannot be read."""
    return read_text(path, "plan")


def canonical_text(text: str, path: str | None = None) -> str:
    """The canonical text of a plan's `text`.

    Raises PlanError (with `path`) when it does not parse, or when its graph sections no
    longer match its digest: printing writes the digest of the graph as it now is, so
    formatting an edited graph would seal the edit (NOTE: [Graph digest]).
    """
    from remat_dsl.check.verify import check_digest
    from remat_dsl.plan.parser import parse
    from remat_dsl.plan.printer import print_plan

    plan = parse(text, path)
    try:
        check_digest(plan)
        return print_plan(plan)
    except PlanError as error:
        raise error.with_source(path, text) from None
    except ValueError as exc:
        raise PlanError(f"cannot print the plan canonically: {exc}", path=path) from None


def add_parsers(subparsers) -> None:
    """Register `remat fmt` on the `add_subparsers()` object of the `remat` command."""
    fmt = subparsers.add_parser(
        "fmt",
        help="rewrite plan files IN PLACE in the canonical layout (comments kept); --check changes nothing",
        description="Rewrite each plan file in place in the canonical layout of `remat plan` (comments kept). "
        "Every file is read and checked before any is written; with --check nothing is written.",
    )
    fmt.add_argument("files", nargs="+", metavar="FILE", help="plan files to rewrite in place")
    fmt.add_argument("--check", action="store_true", help="change nothing; list the files that would change and exit 1 if any")
    fmt.set_defaults(run=run_fmt)


def run_fmt(args) -> int:
    """`remat fmt [--check] FILE...`: 0 when done (or nothing to change), 1 for --check with changes."""
    formatted = _formatted(args.files)
    changed = [(path, new) for path, old, new in formatted if new != old]
    if args.check:
        for path, _ in changed:
            args.out.write(f"{path}\n")
        if changed:
            status(f"{len(changed)} of {len(formatted)} plan file(s) would be rewritten by `remat fmt`")
        return EXIT_WOULD_CHANGE if changed else 0
    for path, new in changed:
        write_atomically(Path(path), new)
        status(f"rewrote {path} in place")
    status(f"{len(changed)} of {len(formatted)} plan file(s) rewritten in place" + ("" if changed else ": all were canonical already"))
    return 0


def _formatted(paths: list[str]) -> list[tuple[str, str, str]]:
    """(path, current text, canonical text) of every file, all parsed before returning."""
    result = []
    for path in dict.fromkeys(paths):  # a file named twice is formatted once
        text = read_plan_text(path)
        result.append((path, text, canonical_text(text, path)))
    return result
