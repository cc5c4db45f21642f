"""Inputs that are not plans, profiles or constraints files, or too large to be (NOTE:
[Bounded inputs] in remat_dsl/plan/files.py), and error text that stays small whatever a
plan holds (NOTE: [Bounded messages] in remat_dsl/plan/errors.py).

Every command that reads a text file is run as a user types it, on /dev/zero, a FIFO with
no writer, a 200 MB file and a directory: each exits 2 with a message that names the
kind or the size, within 2 s and under 200 MB of memory (the process's peak RSS, from
wait4), and prints nothing on stdout.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from remat_dsl.plan.errors import QUOTE_CHARS, PlanError, RematError
from remat_dsl.plan.files import DEFAULT_MAX_INPUT_SIZE, read_text
from remat_dsl.plan.ir import Span

ROOT = Path(__file__).resolve().parent.parent
VALID = ROOT / "tests" / "plans" / "tiny_mlp_autograd.plan"
TINY = ROOT / "tests" / "models" / "tiny_mlp.py"
BIG_BYTES = 200_000_000
MAX_SECONDS = 2.0
MAX_RSS_KIB = 200 * 1024


@dataclass(frozen=True)
class Run:
    returncode: int
    stdout: str
    stderr: str
    seconds: float
    max_rss_kib: int


# Runs `python -m remat_dsl ARGS` and writes its peak resident memory (KiB, wait4) to a
# file.  A process's peak counts the memory of the process it was forked from (Linux keeps
# it across exec), so the command is forked from this small process, not from pytest.
MEASURE = """
import os, sys
pid = os.fork()
if pid == 0:
    os.execv(sys.executable, [sys.executable, "-m", "remat_dsl", *sys.argv[2:]])
_, status, usage = os.wait4(pid, 0)
with open(sys.argv[1], "w") as handle:
    handle.write(str(usage.ru_maxrss))
sys.exit(os.waitstatus_to_exitcode(status) % 256)
"""


def remat(*args: str, cwd: Path, env: dict | None = None, timeout: float = 30) -> Run:
    """`python -m remat_dsl ARGS` with its wall time and peak resident memory."""
    rss = cwd / "rss.txt"
    start = time.monotonic()
    process = subprocess.Popen(
        [sys.executable, "-c", MEASURE, str(rss), *args],
        cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env={**os.environ, **(env or {})},
        start_new_session=True,
    )  # fmt: skip
    try:
        stdout, stderr = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        stdout, stderr = process.communicate()
    seconds = time.monotonic() - start
    max_rss = int(rss.read_text()) if rss.exists() else -1
    rss.unlink(missing_ok=True)
    return Run(process.returncode, stdout.decode(), stderr.decode(errors="replace"), seconds, max_rss)


@pytest.fixture(scope="module")
def inputs(tmp_path_factory) -> dict[str, tuple[str, str]]:
    """name -> (path, what the refusal says of it)."""
    where = tmp_path_factory.mktemp("inputs")
    os.mkfifo(where / "fifo")
    with open(where / "big.plan", "wb") as handle:
        handle.write(VALID.read_bytes())
        handle.truncate(BIG_BYTES)  # sparse: 200 MB by its size, without writing them
    (where / "directory").mkdir()
    return {
        "zero": ("/dev/zero", "it is a character device, not a regular file"),
        "fifo": (str(where / "fifo"), "it is a FIFO (a named pipe), not a regular file"),
        "big": (
            str(where / "big.plan"),
            "it is 190.73 MiB (200000000 B), more than the 32.00 MiB (33554432 B) the tool reads",
        ),
        "directory": (str(where / "directory"), "it is a directory, not a regular file"),
    }


COMMANDS = {  # how each command is given the file ({}), and what it calls it
    "check": (["check", "{}"], "plan"),
    "textconv": (["textconv", "{}"], "plan"),
    "diff": (["diff", str(VALID), "{}"], "plan"),
    "fmt": (["fmt", "{}"], "plan"),
    "codegen": (["codegen", "{}", "-o", "fast.py"], "plan"),
    "show": (["show", "{}"], "plan"),
    "plan --constraints": (["plan", str(TINY), "--budget", "50%", "--constraints", "{}"], "constraints file"),
    "plan --from": (["plan", str(TINY), "--from", "{}"], "plan"),
    "plan --profile": (["plan", str(TINY), "--budget", "50%", "--profile", "{}"], "profile"),
}


@pytest.mark.parametrize("kind", ["zero", "fifo", "big", "directory"])
@pytest.mark.parametrize("command", list(COMMANDS))
def test_a_file_that_is_not_a_regular_file_or_too_large_is_refused_at_once(command, kind, inputs, tmp_path):
    path, says = inputs[kind]
    args, what = COMMANDS[command]
    run = remat(*(a.format(path) for a in args), cwd=tmp_path)
    assert run.returncode == 2, run.stderr
    assert f"{path}: error: cannot read the {what}: {says}" in run.stderr
    assert "Traceback" not in run.stderr and run.stdout == ""
    assert run.seconds < MAX_SECONDS, run.seconds
    assert 0 < run.max_rss_kib < MAX_RSS_KIB, run.max_rss_kib
    assert list(tmp_path.iterdir()) == []  # no output file


def test_the_cap_is_overridable_and_its_refusal_says_how(tmp_path):
    size = VALID.stat().st_size
    lowered = remat("check", str(VALID), cwd=tmp_path, env={"REMAT_MAX_INPUT_SIZE": "1KiB"})
    assert lowered.returncode == 2
    assert f"it is {size / 1024:.2f} KiB ({size} B), more than the 1.00 KiB (1024 B) the tool reads" in lowered.stderr
    assert "raise the cap: REMAT_MAX_INPUT_SIZE=1MiB remat ..." in lowered.stderr
    assert remat("check", str(VALID), cwd=tmp_path, env={"REMAT_MAX_INPUT_SIZE": f"{size}B"}).returncode == 0
    wrong = remat("check", str(VALID), cwd=tmp_path, env={"REMAT_MAX_INPUT_SIZE": "0"})
    assert wrong.returncode == 2 and "REMAT_MAX_INPUT_SIZE must be more than 0 bytes" in wrong.stderr


def test_a_file_at_the_cap_is_read_and_one_byte_more_is_not(tmp_path, monkeypatch):
    text = "# " + "x" * 1000 + "\n"
    path = tmp_path / "at_cap.plan"
    path.write_text(text)
    monkeypatch.setenv("REMAT_MAX_INPUT_SIZE", f"{len(text)}B")
    assert read_text(path, "plan") == text
    path.write_text(text + "\n")
    with pytest.raises(RematError, match=rf"it is {len(text) + 1} B, more than the {len(text)} B the tool reads"):
        read_text(path, "plan")
    monkeypatch.delenv("REMAT_MAX_INPUT_SIZE")
    assert DEFAULT_MAX_INPUT_SIZE == 32 << 20


def _with_name(old: str, new: str) -> str:
    text = VALID.read_text()
    assert text.count(old) == 1, old
    return text.replace(old, new)


NAME = "n" * 20_000_000  # 20 MB, one word


@pytest.mark.parametrize(
    "where, old, new",
    [
        ("a schedule target", "  compute  fc2\n", f"  compute  {NAME}\n"),  # quoted in the message and the line
        ("an op's argument", "aten.relu.default(%fc1)", f"aten.relu.default(%{NAME})"),  # the digest's line
        ("a verb", "  compute  fc2\n", f"  {NAME}  fc2\n"),  # the parser's message
    ],
    ids=["a schedule target", "an op's argument", "a verb"],
)
def test_one_20_MB_name_makes_a_short_error(where, old, new, tmp_path):
    path = tmp_path / "named.plan"
    path.write_text(_with_name(old, new))
    run = remat("check", str(path), cwd=tmp_path, timeout=120)
    assert run.returncode == 2, run.stderr[:2000]
    assert "Traceback" not in run.stderr
    assert len(run.stderr.encode()) < 4096, (where, len(run.stderr))
    assert "…" in run.stderr  # the name is cut, and says so


def test_the_quoted_line_is_at_most_its_first_200_characters_with_carets_under_the_culprit():
    line = "  compute  " + "a" * 500
    error = PlanError("unknown op", span=Span(1, 12), source=line, length=500)
    quoted, carets = error.format().splitlines()[1:3]
    assert quoted == line[:QUOTE_CHARS] + "…"
    assert carets == " " * 11 + "^" * (QUOTE_CHARS - 11)
    far = "x " * 300 + "culprit"
    quoted, carets = PlanError("here", span=Span(1, 601), source=far, length=7).format().splitlines()[1:3]
    assert quoted.startswith("…") and quoted.endswith("culprit") and len(quoted) <= QUOTE_CHARS + 2
    assert quoted[carets.index("^") :].startswith("culprit") and carets.endswith("^" * 7)
