"""remat-dsl installs like a library: a wheel carries the grammar and the template.

The fast test builds the wheel (with the pinned setuptools of .venv, no network), unpacks
it into a folder outside the repository and runs plan, check and codegen from there with
that folder first on sys.path, so nothing is read from the checkout.  The slow test
(`pytest -m slow`) does what a new user does: a fresh venv, `pip install torch==2.13.0`,
then a non-editable `pip install '.[examples]'`, and plans, checks and generates GPT-2.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import venv
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
IGNORED = shutil.ignore_patterns(".venv", ".git", "build", "*.egg-info", "__pycache__", ".pytest_cache", ".hypothesis")


def _source_copy(tmp_path: Path) -> Path:
    source = tmp_path / "src"
    shutil.copytree(ROOT, source, ignore=IGNORED)
    return source


def run(command: list[str], cwd: Path, **env: str) -> subprocess.CompletedProcess:
    result = subprocess.run(command, cwd=cwd, capture_output=True, text=True, env={**os.environ, **env}, timeout=1500)
    assert result.returncode == 0, f"{' '.join(command)}\n{result.stdout[-2000:]}\n{result.stderr[-3000:]}"
    return result


def test_a_wheel_runs_without_the_repository(tmp_path):
    source = _source_copy(tmp_path)
    run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "-q",
            "-w",
            str(tmp_path / "dist"),
            str(source),
        ],
        tmp_path,
    )
    (wheel,) = (tmp_path / "dist").glob("remat_dsl-*.whl")
    site = tmp_path / "site"
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
        archive.extractall(site)
    assert "remat_dsl/grammar/plan.lark" in names and "remat_dsl/templates/module.py.jinja" in names
    assert "remat_dsl/grammar/plan.tables.json" in names  # NOTE: [Parser tables] in remat_dsl/plan/parser.py
    work = tmp_path / "elsewhere"
    work.mkdir()
    shutil.copy(ROOT / "tests" / "models" / "tiny_mlp.py", work)
    env = {"PYTHONPATH": str(site)}
    where = run(
        [
            sys.executable,
            "-c",
            (
                "import remat_dsl.plan.parser as p, remat_dsl.codegen.generate as c, remat_dsl.plan.tables as t;"
                " print(p.GRAMMAR_PATH); print(c.TEMPLATES); print(t.tables_path('plan')); assert t.load('plan')"
            ),
        ],
        work,
        **env,
    )
    assert all(line.startswith(str(site)) for line in where.stdout.split()), where.stdout
    plan = run(
        [sys.executable, "-m", "remat_dsl", "plan", "tiny_mlp.py", "--budget", "90%", "--repeats", "1"], work, **env
    )
    (work / "t.plan").write_text(plan.stdout)
    run([sys.executable, "-m", "remat_dsl", "check", "t.plan"], work, **env)
    run([sys.executable, "-m", "remat_dsl", "codegen", "t.plan", "-o", "fast.py"], work, **env)
    assert "class FastModel" in (work / "fast.py").read_text()


@pytest.mark.slow
def test_pip_install_into_a_fresh_venv_plans_gpt2(tmp_path):
    source = _source_copy(tmp_path)
    env_dir = tmp_path / "venv"
    venv.create(env_dir, with_pip=True)
    python = str(env_dir / "bin" / "python")
    lock = str(ROOT / "requirements.lock")
    run([python, "-m", "pip", "install", "-q", "-c", lock, "torch==2.13.0"], tmp_path)
    run([python, "-m", "pip", "install", "-q", "-c", lock, f"{source}[examples]"], tmp_path)
    remat = str(env_dir / "bin" / "remat")
    work = tmp_path / "work"
    shutil.copytree(ROOT / "examples", work / "examples")
    run(
        [
            "bash",
            "-c",
            (
                f"set -e; {remat} plan examples/gpt2.py --budget 50% > g.plan; {remat} check g.plan; {remat} codegen"
                " g.plan -o f.py"
            ),
        ],
        work,
    )
    assert (work / "g.plan").read_text().startswith("remat-plan ")
