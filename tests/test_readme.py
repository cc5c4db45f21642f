"""The README and the docs are executed: every `sh` block runs as written, as a user types it.

Each block runs with bash (`set -euo pipefail`) in a temporary copy of the repository
(a git repository of its own, so the git driver set-up works), with `.venv/bin` first on
PATH, so `remat` is the installed command and `> gpt2.plan` is a real shell redirection.
The README's blocks run first, in order, then those of each file of DOCS, in DOCS order;
all share the copy, as a reader's shell would (the docs' blocks use the README's
quickstart plan, `gpt2.plan`).  A block that fails fails the test with its output.

One line is not run: `make test` is this suite itself.  The "Adding a solver" block
(docs/solvers.md) adds a solver to the copy; its plan's module is then trained beside
eager PyTorch.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from remat_dsl.capture.model_file import load_model_file
from remat_dsl.codegen.compare import compare_training, load_generated

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
# The docs whose `sh` blocks run after the README's, in this order: exactly the files of
# docs/ that have one (test_every_doc_with_sh_blocks_is_listed).
DOCS = tuple(
    ROOT / "docs" / name
    for name in ("commands.md", "profiles.md", "devices.md", "generated-module.md", "solvers.md", "plan-language.md")
)
SKIPPED_LINES = {"make test"}  # the suite that runs this test
COPY_IGNORED = shutil.ignore_patterns(
    ".venv", ".git", "build", "*.egg-info", "__pycache__", ".pytest_cache", ".hypothesis"
)


def sh_blocks(text: str) -> list[tuple[int, str]]:
    """(line number, body) of every ```sh block, in order."""
    blocks = []
    for match in re.finditer(r"^```sh\n(.*?)^```$", text, flags=re.M | re.S):
        blocks.append((text[: match.start()].count("\n") + 1, match.group(1)))
    return blocks


def all_sh_blocks() -> list[tuple[str, int, str]]:
    """(file, line number, body) of every ```sh block of the README, then of DOCS, in order."""
    return [
        (path.relative_to(ROOT).as_posix(), line, body)
        for path in (README, *DOCS)
        for line, body in sh_blocks(path.read_text())
    ]


def runnable(body: str) -> str:
    lines = [line for line in body.splitlines() if line.split("#")[0].strip() not in SKIPPED_LINES]
    return "\n".join(lines) + "\n"


@pytest.fixture(scope="module")
def workdir(tmp_path_factory) -> Path:
    stamp = ROOT / ".venv" / ".installed"
    for source in (ROOT / "pyproject.toml", ROOT / "requirements.lock"):  # the Makefile's stamp prerequisites
        if not stamp.exists() or stamp.stat().st_mtime < source.stat().st_mtime:
            pytest.fail(
                f"the .venv is older than {source.name}: run `make venv` (the copy's `make demo` would reinstall "
                "it, with the shared .venv's `remat` pointing into the copy)"
            )
    work = tmp_path_factory.mktemp("readme") / "remat-dsl"
    shutil.copytree(ROOT, work, ignore=COPY_IGNORED)
    os.symlink(ROOT / ".venv", work / ".venv")
    env = {
        **os.environ,
        "GIT_AUTHOR_NAME": "t",
        "GIT_AUTHOR_EMAIL": "t@t",
        "GIT_COMMITTER_NAME": "t",
        "GIT_COMMITTER_EMAIL": "t@t",
    }
    for command in (["git", "init", "-q"], ["git", "add", "-A"], ["git", "commit", "-qm", "copy"]):
        subprocess.run(command, cwd=work, check=True, env=env)
    return work


def test_every_doc_with_sh_blocks_is_listed():
    with_blocks = {path.name for path in (ROOT / "docs").glob("*.md") if sh_blocks(path.read_text())}
    assert with_blocks == {path.name for path in DOCS}, with_blocks


def test_readme_has_the_blocks_a_user_runs():
    blocks = [body for _, body in sh_blocks(README.read_text())]
    assert blocks[0].split("#")[0].strip() == "make demo", "the README starts with `make demo` and `make test`"
    assert "remat plan examples/gpt2.py --budget 50% > gpt2.plan" in blocks[1], "then the quickstart"
    text = "".join(body for _, _, body in all_sh_blocks())
    for command in (
        "remat plan examples/gpt2.py --budget 50% > gpt2.plan",
        "remat codegen",
        "remat fmt",
        "remat diff",
        "git config diff.remat.command",
        "--constraints gpt2.constraints",
    ):
        assert command in text, command


def test_every_sh_block_runs_as_written(workdir):
    # PYTHONPATH: `remat` imports the copy's remat_dsl (the .venv's editable install points
    # at this checkout), as it would a user's checkout after the "Adding a solver" block.
    env = {
        **os.environ,
        "PATH": f"{workdir / '.venv' / 'bin'}{os.pathsep}{os.environ['PATH']}",
        "PYTHON": sys.executable,
        "PYTHONPATH": str(workdir),
    }
    for name, line, body in all_sh_blocks():
        script = "set -euo pipefail\n" + runnable(body)
        result = subprocess.run(
            ["bash", "-c", script], cwd=workdir, env=env, capture_output=True, text=True, timeout=900
        )
        assert result.returncode == 0, (
            f"{name}:{line}: this block failed (exit {result.returncode}):\n{body}\n---"
            f" stdout\n{result.stdout[-3000:]}\n--- stderr\n{result.stderr[-3000:]}"
        )
    plan = (workdir / "gpt2.plan").read_text()
    assert plan.startswith("remat-plan "), plan[:200]  # the redirected plan holds the plan and nothing else
    assert (workdir / "fast_gpt2.py").exists() and (workdir / "timeline.png").exists()
    assert (workdir / "gpt2.plan.new").read_text().startswith("remat-plan ")
    # "Adding a solver": the new solver's plan says so, and its module trains exactly like eager
    twice = (workdir / "twice.plan").read_text()
    # at 100% polish drops every recomputation of its order (NOTE: [Polish and repair])
    assert 'solver      "forward-twice; polished -' in twice and "  recompute   0.000 ms" in twice
    assert not re.search(r"^  recompute  +[A-Za-z_]", twice, re.MULTILINE)
    model_file = load_model_file(str(ROOT / "tests" / "models" / "tiny_mlp.py"))
    comparison = compare_training(model_file, load_generated(workdir / "fast_twice.py"), steps=2)
    assert comparison.identical, comparison.mismatched[:10]
