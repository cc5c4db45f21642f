"""What the `remat` command does to the terminal and the file system, in one place.

NOTE: [Stdout is the data]
`remat plan model.py > model.plan` must leave nothing but the plan in `model.plan`.  C
libraries we load (HiGHS prints a banner on file descriptor 1), torch's own C++ code and
any subprocess write to descriptor 1 behind Python's back, so while a command works,
`stdout_to_stderr()` points descriptor 1 at descriptor 2 (os.dup2) and the command writes
its real output into a buffer; `main` writes the buffer to the real stdout at the end, and
only when the command succeeded.  C stdio buffers are flushed before descriptor 1 is
restored, so nothing buffered in C reaches the real stdout later.

NOTE: [Output files]
Every file the tool writes goes through `write_atomically`: a temporary file in the
target's directory, renamed over the target, so a failure leaves no half-written file;
the result gets the permissions any new file gets (0666 less the umask) or keeps those
of the file it replaces.  A symbolic link is written through: the file it points to is
replaced and the link stays a link (`remat fmt link.plan` formats the plan the link
names).  `check_writable` tries the same thing up front, so a command refuses an output
path it cannot write before it spends minutes profiling.

NOTE: [Safe outputs]
`-o` is one typo away from an input: `remat codegen x.plan -o x.plan` would replace the
plan with Python, `remat plan m.py -o m.py` the model file.  So `check_writable`, given the
command's inputs and the kind of file it writes, refuses (exit 2, unless `--force`):

* an output that is one of the command's inputs: the same file on disk (st_dev, st_ino),
  whatever the path, a symbolic or a hard link;
* an existing file that does not start as the tool writes that kind of file
  (`written_by_tool`): a plan starts with `remat-plan N` after `#` comment lines and blank
  lines; a profile with `remat-profile N` the same way; a generated module with
  MODULE_PREFIX (the template's first words); a picture of `remat show --png` is a PNG
  whose `Software` text chunk is remat_dsl.review.show's PNG_SOFTWARE.  An empty
  file is as good as a missing one.

Whatever `--force` says, only a regular file (or a new name) is written: the rename
would put a file where a FIFO or a device (`-o /dev/null` as root) was.
"""

from __future__ import annotations

import ctypes
import os
import stat
import sys
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from remat_dsl.plan.errors import RematError
from remat_dsl.plan.progress import Progress, status  # noqa: F401  (the commands import them from here)


@contextmanager
def stdout_to_stderr() -> Iterator[None]:
    """Point file descriptor 1 at descriptor 2 until the block ends (NOTE: [Stdout is the data])."""
    try:
        sys.stdout.flush()
        saved = os.dup(1)
    except (OSError, ValueError):  # stdout closed: nothing to protect
        yield
        return
    try:
        os.dup2(2, 1)
        yield
    finally:
        try:
            sys.stdout.flush()
        except (OSError, ValueError):
            pass
        flush_c_stdio()
        os.dup2(saved, 1)
        os.close(saved)


def flush_c_stdio() -> None:
    """fflush(NULL): C libraries' buffered stdout goes out now, to where fd 1 points now."""
    try:
        ctypes.CDLL(None).fflush(None)
    except (OSError, AttributeError):
        pass


def write_stdout(text: str) -> None:
    """Write a command's output to the real stdout; a closed pipe (`| head`) is not an error."""
    try:
        sys.stdout.write(text)
        sys.stdout.flush()
    except BrokenPipeError:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)


def positive_int(text: str) -> int:
    """An argparse type: a whole number >= 1 (`--repeats`)."""
    import argparse

    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a whole number >= 1, got '{text}'")
    return value


NAMED = 5  # unsettled ops a warning names


def report_noisy_timing(captured) -> None:
    """Say when some ops' timings never settled (NOTE: [Robust timing] in
    remat_dsl.capture.profile): costs measured on a busy machine make plans that differ."""
    if captured.noisy:
        ops = sum(1 for op in captured.graph.ops)
        more = len(captured.noisy) - NAMED
        named = ", ".join(captured.noisy[:NAMED]) + (f" and {more} more" if more > 0 else "")
        status(
            f"warning: the timings of {len(captured.noisy)} of {ops} ops did not settle (their timing passes disagreed "
            f"by more than 1.5x): {named}; the machine was busy: measure on an idle machine, or leave out --measure "
            "for op times predicted from shapes, which do not depend on its load"
        )


# ---------------------------------------------------------------------------
# Output files
# ---------------------------------------------------------------------------


MODULE_PREFIX = b'"""Generated by remat-dsl'  # the generated module's first bytes (templates/module.py.jinja)
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
HEAD_BYTES = 64 << 10  # bytes of an existing output read to recognise it (NOTE: [Safe outputs])
_MAGIC = {"plan": "remat-plan", "profile": "remat-profile"}


def written_by_tool(head: bytes, kind: str) -> bool:
    """Whether a file that starts with `head` is one the tool writes as `kind` (`plan`,
    `profile`, `module`, `picture`): NOTE: [Safe outputs].  An empty file counts as one."""
    if not head:
        return True
    if kind == "module":
        return head.startswith(MODULE_PREFIX)
    if kind == "picture":
        from remat_dsl.review.show import PNG_SOFTWARE

        return head.startswith(PNG_SIGNATURE) and b"tEXtSoftware\x00" + PNG_SOFTWARE.encode() in head
    magic = _MAGIC[kind]
    for line in head.decode("utf-8", errors="replace").splitlines():
        stripped = line.strip()
        if stripped and not stripped.startswith("#"):
            words = stripped.split()
            return len(words) >= 2 and words[0] == magic and words[1].isdigit()
    return False


def check_writable(path: str | Path, what: str = "output", *, inputs: tuple = (), force: bool = False) -> Path:
    """`path` as a Path after checking that a file can be written there now.

    what: the kind of file (`plan`, `profile`, `module`, `picture`, or any other word, for
    which the contents of an existing file are not checked); inputs: (path, what) of each
    file the command reads.  Raises RematError when its directory is missing, when it is a
    directory or not a regular file, when a file cannot be created beside it
    (permissions, read-only file system), and unless `force` when it is one of `inputs`
    or an existing file the tool did not write (NOTE: [Safe outputs]).
    """
    target = Path(path)
    _check_regular(path, what)
    if not force:
        _check_not_an_input(path, what, inputs)
        _check_written_by_tool(path, what)
    if target.is_dir():
        raise RematError(
            f"{path}: error: cannot write the {what}: it is a directory", hint="give a file name, e.g. out/model.plan"
        )
    directory = target.parent
    if not directory.is_dir():
        reason = "does not exist" if not directory.exists() else "is not a directory"
        raise RematError(
            f"{path}: error: cannot write the {what}: {directory} {reason}",
            hint=f"create it first (mkdir -p {directory}) or write elsewhere",
        )
    try:
        fd, probe = tempfile.mkstemp(dir=directory, prefix=f".{target.name}.", suffix=".tmp")
    except OSError as exc:
        raise RematError(
            f"{path}: error: cannot write the {what}: {exc.strerror or exc}", hint="choose a path you can write"
        ) from None
    os.close(fd)
    os.unlink(probe)
    if target.exists() and not os.access(target, os.W_OK):
        raise RematError(
            f"{path}: error: cannot write the {what}: permission denied", hint="choose a path you can write"
        )
    return target


def _check_regular(path, what: str) -> None:
    """Refuse an existing output that is neither a regular file nor a directory (which
    check_writable refuses on its own)."""
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return  # missing (or a dangling link): a new file
    if stat.S_ISREG(mode) or stat.S_ISDIR(mode):
        return
    kind = "a FIFO" if stat.S_ISFIFO(mode) else "a device" if stat.S_ISCHR(mode) or stat.S_ISBLK(mode) else "a socket"
    raise RematError(
        f"{path}: error: cannot write the {what}: it is {kind}; the tool writes regular files",
        hint="give a file name, e.g. out/model.plan",
    )


def _identity(path) -> tuple[int, int] | None:
    try:
        info = os.stat(path)
    except (OSError, ValueError):
        return None
    return info.st_dev, info.st_ino


def _check_not_an_input(path, what: str, inputs: tuple) -> None:
    output = _identity(path)
    if output is None:
        return
    for source, source_what in inputs:
        if source is not None and _identity(source) == output:
            same = "" if os.path.abspath(source) == os.path.abspath(path) else f" ({source}, the same file)"
            raise RematError(
                f"{path}: error: cannot write the {what}: it is the {source_what} this command reads{same}",
                hint=f"write the {what} to another file, or pass --force to replace the {source_what} with it",
            )


def _check_written_by_tool(path, what: str) -> None:
    from remat_dsl.plan.files import read_head

    if what not in (*_MAGIC, "module", "picture") or not os.path.isfile(path):
        return
    if written_by_tool(read_head(path, HEAD_BYTES, what), what):
        return
    starts = {"module": f"`{MODULE_PREFIX.decode()}`", "picture": "a PNG from `remat show --png`"}
    raise RematError(
        f"{path}: error: cannot write the {what}: the file exists and is not a {what} that remat wrote "
        f"(it does not start with {starts.get(what, f'`{_MAGIC.get(what)} N`')})",
        hint="write to another file, or pass --force to replace it",
    )


def write_atomically(path: str | Path, data: str | bytes) -> None:
    """Write `data` (text as UTF-8, or bytes) to `path` through a temporary file, through
    a symbolic link to the file it names (NOTE: [Output files]).  Raises RematError when
    the file cannot be written."""
    target = check_writable(os.path.realpath(path) if os.path.islink(path) else path)
    mode = target.stat().st_mode & 0o777 if target.exists() else 0o666 & ~_umask()
    fd, temp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data.encode("utf-8") if isinstance(data, str) else data)
        os.chmod(temp, mode)
        os.replace(temp, target)
    except OSError as exc:
        Path(temp).unlink(missing_ok=True)
        raise RematError(f"{path}: error: cannot write it: {exc.strerror or exc}") from None
    except BaseException:
        Path(temp).unlink(missing_ok=True)
        raise


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask
