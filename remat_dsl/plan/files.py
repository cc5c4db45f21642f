"""Reading the tool's text files (plans, constraints, profiles) with one kind of error."""

from __future__ import annotations

from pathlib import Path

from remat_dsl.plan.errors import RematError


def read_text(path: str | Path, what: str) -> str:
    """The UTF-8 text of the file at `path`.

    Raises RematError when it is missing, unreadable, a directory or not UTF-8 text.
    """
    try:
        return Path(path).read_text(encoding="utf-8")
    except IsADirectoryError:
        raise RematError(f"{path}: error: cannot read the {what}: it is a directory") from None
    except OSError as exc:
        raise RematError(f"{path}: error: cannot read the {what}: {exc.strerror or exc}") from None
    except UnicodeDecodeError as exc:
        raise RematError(
            f"{path}: error: cannot read the {what}: not UTF-8 text ({exc.reason} at byte {exc.start})",
            hint=f"is {path} really a {what}?",
        ) from None
