"""Reading the tool's text files (plans, constraints, profiles): one bounded reader, one kind of error.

NOTE: [Bounded inputs]
Every text file the tool reads (a plan, `--from`, a constraints file, a profile) comes through `read_text`, and
any of them may be a mistake or hostile: read whole, `/dev/zero` never ends, a FIFO blocks the open until a
writer comes, and a 50 MB plan takes minutes and a gigabyte to parse.  So `read_text` reads regular files only,
and at most a cap of bytes:

* the path is stat'ed and anything that is not a regular file (a directory, a FIFO, a character or block
  device, a socket) is refused by its type before it is opened; it is then opened with O_NONBLOCK (a FIFO put
  in its place meanwhile does not block the open) and fstat'ed, so the checks hold for what is read;
* a file above the cap is refused by its size before any byte is read, and at most cap + 1 bytes are read
  (a file that grows while it is read is refused as well);
* the cap is DEFAULT_MAX_INPUT_SIZE, or the size in the environment variable MAX_INPUT_SIZE_VARIABLE
  (`REMAT_MAX_INPUT_SIZE=64MiB`, read with remat_dsl.plan.units).

The default holds a 70B model's plan with room: a plan grows by about 51,500 bytes a layer, so an 80-layer
Llama-2-70B plan is about 4.1 MB, and 32 MiB is eight times that (the measurements: docs/measured-notes.md).
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from remat_dsl.plan.errors import RematError, clipped

DEFAULT_MAX_INPUT_SIZE = 32 << 20  # bytes (NOTE: [Bounded inputs])
MAX_INPUT_SIZE_VARIABLE = "REMAT_MAX_INPUT_SIZE"
READ_CHUNK = 1 << 20  # bytes per read

_KINDS = (
    (stat.S_ISDIR, "a directory"),
    (stat.S_ISFIFO, "a FIFO (a named pipe)"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISSOCK, "a socket"),
)


def max_input_size() -> int:
    """The most bytes `read_text` reads (NOTE: [Bounded inputs]).  Raises RematError when
    REMAT_MAX_INPUT_SIZE is set to something other than a size above 0."""
    from remat_dsl.plan.units import UnitError, parse_size

    text = os.environ.get(MAX_INPUT_SIZE_VARIABLE)
    if text is None or not text.strip():
        return DEFAULT_MAX_INPUT_SIZE
    try:
        size = parse_size(text, MAX_INPUT_SIZE_VARIABLE, exact=False)
    except UnitError as error:
        raise RematError(
            f"error: {clipped(error.message)}", hint=f"set {MAX_INPUT_SIZE_VARIABLE} to a size, e.g. 64MiB"
        ) from None
    if size <= 0:
        raise RematError(
            f"error: {MAX_INPUT_SIZE_VARIABLE} must be more than 0 bytes, got '{clipped(text)}'", hint="e.g. 64MiB"
        )
    return size


def read_text(path: str | Path, what: str) -> str:
    """The UTF-8 text of the regular file at `path`, read up to the cap (NOTE: [Bounded inputs]).

    Raises RematError when it is missing or unreadable, not a regular file (a directory,
    FIFO, device or socket), larger than the cap, or not UTF-8 text.
    """
    data = read_bytes(path, what)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise RematError(
            f"{path}: error: cannot read the {what}: not UTF-8 text ({exc.reason} at byte {exc.start})",
            hint=f"is {path} really a {what}?",
        ) from None


def read_bytes(path: str | Path, what: str) -> bytes:
    """The bytes of the regular file at `path`, at most the cap (NOTE: [Bounded inputs]).
    Raises RematError as `read_text` does, decoding aside."""
    cap = max_input_size()
    try:
        fd = _open_regular(path, what)
    except OSError as exc:
        raise RematError(f"{path}: error: cannot read the {what}: {exc.strerror or exc}") from None
    try:
        _check_size(path, what, os.fstat(fd).st_size, cap)
        data = _read_at_most(fd, cap + 1)
    except OSError as exc:
        raise RematError(f"{path}: error: cannot read the {what}: {exc.strerror or exc}") from None
    finally:
        os.close(fd)
    if len(data) > cap:  # it grew while it was read
        _check_size(path, what, len(data), cap, grew=True)
    return data


def check_input(path: str | Path, what: str) -> None:
    """Refuse, without reading it, a file that `read_text` would refuse for its kind or
    its size (a command that reads several files refuses a bad later one before it
    parses the first).  Raises RematError."""
    cap = max_input_size()
    try:
        info = os.stat(path)
    except OSError as exc:
        raise RematError(f"{path}: error: cannot read the {what}: {exc.strerror or exc}") from None
    _check_kind(path, what, info.st_mode)
    _check_size(path, what, info.st_size, cap)


def read_head(path: str | Path, size: int, what: str) -> bytes:
    """The first `size` bytes (or fewer) of the regular file at `path`: how a command
    recognises a file it is about to replace (NOTE: [Safe outputs] in
    remat_dsl/cli/console.py).  Raises RematError as `read_bytes` does, the cap aside."""
    try:
        fd = _open_regular(path, what)
    except OSError as exc:
        raise RematError(f"{path}: error: cannot read the {what}: {exc.strerror or exc}") from None
    try:
        return _read_at_most(fd, size)
    except OSError as exc:
        raise RematError(f"{path}: error: cannot read the {what}: {exc.strerror or exc}") from None
    finally:
        os.close(fd)


def _open_regular(path, what: str) -> int:
    """A read-only descriptor of the regular file at `path`, opened without blocking (a
    FIFO's open would wait for a writer).  Raises RematError for what is not a regular
    file, OSError when it cannot be opened."""
    _check_kind(path, what, os.stat(path).st_mode)
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
    try:
        _check_kind(path, what, os.fstat(fd).st_mode)
    except BaseException:
        os.close(fd)
        raise
    return fd


def _check_kind(path, what: str, mode: int) -> None:
    if stat.S_ISREG(mode):
        return
    kind = next((name for test, name in _KINDS if test(mode)), "of another kind")
    raise RematError(
        f"{path}: error: cannot read the {what}: it is {kind}, not a regular file",
        hint=f"give the path of a {what} file (to read a pipe's output, write it to a file first)",
    )


def _check_size(path, what: str, size: int, cap: int, grew: bool = False) -> None:
    from remat_dsl.plan.units import format_bytes

    if size <= cap:
        return
    found = "it grew past" if grew else f"it is {format_bytes(size)}, more than"
    enough = -(-max(size, 2 * cap) // (1 << 20)) if grew else -(-size // (1 << 20))  # MiB
    raise RematError(
        f"{path}: error: cannot read the {what}: {found} the {format_bytes(cap)} the tool reads",
        hint=f"is {path} really a {what}? To read larger files, raise the cap: "
        f"{MAX_INPUT_SIZE_VARIABLE}={enough}MiB remat ...",
    )


def _read_at_most(fd: int, limit: int) -> bytes:
    """Up to `limit` bytes from `fd`, until the end of the file."""
    chunks, left = [], limit
    while left > 0:
        chunk = os.read(fd, min(left, READ_CHUNK))
        if not chunk:
            break
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)
