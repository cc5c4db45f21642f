"""The adversarial corpus (tests/adversarial/corpus.py): no edit of a plan, sealed again or
not, makes `remat` or the module it generates run anything but the plan's operators and data
containers (issue 45, parts 1, 7 and 8).

Each case's plan sits in a directory of its own.  One subprocess, for every case in its
directory, runs `remat codegen`, `check`, `textconv`, `diff`, `fmt --check` and `show` on it
(in process, `remat_dsl.cli.main`: one import of torch for all), imports the module codegen
wrote, if any, and trains the tiny MLP through it beside eager.  The cases of SUBPROCESS go
through `remat codegen` as a user runs it instead, a process of its own each.
The file `sentinel`, which every payload tries to create, must never appear, and outside the
module's string constants none of a payload's text may be there.
"""

from __future__ import annotations

import ast
import importlib.util
import io
import json
import os
import subprocess
import sys
import tokenize
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
HERE = ROOT / "tests" / "adversarial"
_spec = importlib.util.spec_from_file_location("adversarial_corpus", HERE / "corpus.py")
corpus = importlib.util.module_from_spec(_spec)
sys.modules.setdefault("adversarial_corpus", corpus)  # dataclasses look their module up
_spec.loader.exec_module(corpus)
CASES = corpus.CASES

# In each case's directory: every command a user types on the plan, then the module; all
# cases in one process (one import of torch), each reported in its own report.json.
PROBE = """
import contextlib, io, json, os, sys
from pathlib import Path
from remat_dsl.cli import main
from remat_dsl.capture.model_file import load_model_file
from remat_dsl.codegen.compare import compare_training, load_generated
base, model = sys.argv[1:3]
for where in sys.argv[3:]:
    os.chdir(where)
    report = {}
    codegen = [] if Path("codegen.json").exists() else [["codegen", "case.plan", "-o", "fast.py"]]
    for command in (*codegen, ["check", "case.plan"], ["textconv", "case.plan"], ["diff", base, "case.plan"],
                    ["fmt", "--check", "case.plan"], ["show", "case.plan"]):
        err = io.StringIO()
        with contextlib.redirect_stderr(err):
            try:
                code = main(command)
            except SystemExit as exc:
                code = exc.code
        report[command[0]] = [code, err.getvalue()]
    if Path("fast.py").exists():
        try:
            comparison = compare_training(load_model_file(model), load_generated("fast.py"), steps=1)
            report["runtime"] = "trains" if comparison.identical else "differs: " + ", ".join(comparison.mismatched)
        except Exception as error:
            report["runtime"] = f"{type(error).__name__}: {error}"
    Path("report.json").write_text(json.dumps(report))
"""


# a payload in each part of a plan: the header, the outputs, a constant, an op's target
SUBPROCESS = ("header_model_breakout", "outputs_popen", "constant_call", "op_target_os_system")


def _codegen(case, base: Path) -> None:
    """The case's directory with its plan; for the cases of SUBPROCESS, `remat codegen` run
    there as a command, its exit status and stderr in codegen.json."""
    where = base / case.name
    where.mkdir()
    (where / "case.plan").write_text((HERE / f"{case.name}.plan").read_text(encoding="utf-8"), encoding="utf-8")
    if case.name in SUBPROCESS:
        command = [sys.executable, "-m", "remat_dsl", "codegen", "case.plan", "-o", "fast.py"]
        run = subprocess.run(command, cwd=where, capture_output=True, text=True, timeout=600)
        (where / "codegen.json").write_text(json.dumps([run.returncode, run.stderr]))


@pytest.fixture(scope="module")
def results(tmp_path_factory) -> dict:
    """{case: (codegen's exit status and stderr, the probe's report, the case's directory)}."""
    base = tmp_path_factory.mktemp("adversarial")
    with ThreadPoolExecutor(max_workers=2) as pool:
        list(pool.map(lambda case: _codegen(case, base), CASES))
    places = [str(base / case.name) for case in CASES]
    probe = subprocess.run(
        [sys.executable, "-c", PROBE, str(corpus.BASE), str(corpus.MODEL), *places],
        capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=1200,
    )  # fmt: skip
    assert probe.returncode == 0, probe.stderr[-3000:]
    results = {}
    for case in CASES:
        where = base / case.name
        report = json.loads((where / "report.json").read_text())
        ran = where / "codegen.json"
        code, stderr = json.loads(ran.read_text()) if ran.exists() else report["codegen"]
        results[case.name] = (subprocess.CompletedProcess(["remat", "codegen"], code, "", stderr), report, where)
    return results


def test_the_corpus_files_are_what_the_corpus_makes():
    assert sorted(p.stem for p in HERE.glob("*.plan")) == sorted(case.name for case in CASES)
    for case in CASES:
        assert (HERE / f"{case.name}.plan").read_text(encoding="utf-8") == case.make(), f"python {HERE / 'corpus.py'}"


@pytest.mark.parametrize("case", CASES, ids=[case.name for case in CASES])
def test_adversarial_plan(case, results):
    codegen, report, where = results[case.name]
    assert not (where / corpus.SENTINEL).exists(), "a payload ran"
    assert "Traceback" not in codegen.stderr, codegen.stderr
    assert codegen.returncode == case.status, codegen.stderr
    assert report["check"][0] == case.status, report["check"]
    for command in ("check", "textconv", "diff", "fmt", "show"):
        code, stderr = report[command]
        assert code in (0, 1, 2) and "Traceback" not in stderr, (command, stderr)
    if case.status:
        assert case.message in codegen.stderr and case.message in report["check"][1], codegen.stderr
        assert not (where / "fast.py").exists()
        return
    assert case.runtime in report["runtime"], report["runtime"]
    source = (where / "fast.py").read_text()
    plan_strings = _plan_strings(where / "case.plan")
    # every string of the plan that could be code sits in the module as a string constant, whole
    constants = {
        node.value
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.Constant) and isinstance(node.value, str)
    }
    for text in plan_strings:
        if any(mark in text for mark in ('"', "'", "\n", "{", "(")):
            assert text in constants, text
    # outside string constants, nothing of a payload: no template ran the plan's text, no code of it is there
    tokens = list(tokenize.generate_tokens(io.StringIO(source).readline))
    code = " ".join(t.string for t in tokens if t.type not in (tokenize.STRING, tokenize.COMMENT))
    comments = " ".join(t.string for t in tokens if t.type == tokenize.COMMENT)
    for mark in ("pwned", "{{", "{%", corpus.SENTINEL, "__import__", "pathlib"):
        assert mark not in code and mark not in comments, mark


def _plan_strings(path: Path) -> list[str]:
    """The plan's strings the module carries (MODEL, SOLVER, CONSTANTS)."""
    from remat_dsl.plan.parser import parse_file

    plan = parse_file(path)
    return [plan.header.model, plan.header.solver, *(c.value for c in plan.graph.constants if isinstance(c.value, str))]
