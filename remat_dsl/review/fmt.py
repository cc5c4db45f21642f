"""Canonical text of plan files: what `remat fmt` writes (remat_dsl.cli.fmt).

Formatting is parse + print with the one printer (remat_dsl.plan.printer): comments are
kept (the parser attaches them to items), and the result is a fixed point
(`fmt(fmt(text)) == fmt(text)`).  `formatted` reads and formats every file before any is
written, so an unreadable or invalid file changes nothing.
"""

from __future__ import annotations

from remat_dsl.plan.errors import PlanError
from remat_dsl.plan.files import read_text


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


def formatted(paths: list[str]) -> list[tuple[str, str, str]]:
    """(path, current text, canonical text) of every file, all parsed before returning."""
    result = []
    for path in dict.fromkeys(paths):  # a file named twice is formatted once
        text = read_text(path, "plan")
        result.append((path, text, canonical_text(text, path)))
    return result
