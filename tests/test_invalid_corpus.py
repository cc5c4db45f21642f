"""The corpus of invalid plans: each produces exactly its golden diagnostic, exit 2, no traceback.

tests/invalid_plans/NAME.plan is a small edit of a valid tiny-MLP plan (regenerate with
tests/invalid_plans/make_corpus.py); NAME.diag is the exact stderr of
`remat check tests/invalid_plans/NAME.plan` run from the repository root.  Every case
runs in-process (cli.main with captured streams); a handful also run as a subprocess.
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
CORPUS = ROOT / "tests" / "invalid_plans"

_spec = importlib.util.spec_from_file_location("make_corpus", CORPUS / "make_corpus.py")
make_corpus = importlib.util.module_from_spec(_spec)
sys.modules.setdefault("make_corpus", make_corpus)  # dataclasses look their module up
_spec.loader.exec_module(make_corpus)

NAMES = sorted(path.stem for path in CORPUS.glob("*.plan"))
SUBPROCESS_CASES = [
    "syntax_missing_on",
    "unknown_tensor",
    "saved_tensor_deleted_in_forward",
    "use_before_wait",
    "peak_above_budget",
]


def _golden(name: str) -> str:
    return (CORPUS / f"{name}.diag").read_text(encoding="utf-8")


def test_corpus_is_large_and_complete():
    assert len(NAMES) >= 30
    assert NAMES == sorted(case.name for case in make_corpus.CASES)
    for name in NAMES:
        assert (CORPUS / f"{name}.diag").exists(), name


@pytest.mark.parametrize("case", make_corpus.CASES, ids=lambda case: case.name)
def test_corpus_plans_are_up_to_date(case):
    assert (CORPUS / f"{case.name}.plan").read_text(encoding="utf-8") == make_corpus.canonical(
        make_corpus.plan_text(case)
    )


@pytest.mark.parametrize("name", NAMES)
def test_diagnostic_in_process(name):
    status, _, stderr = make_corpus.check_in_process(make_corpus.relative_path(name))
    assert status == 2
    assert "Traceback" not in stderr
    assert stderr == _golden(name)


@pytest.mark.parametrize("name", SUBPROCESS_CASES)
def test_diagnostic_of_remat_check(name):
    result = subprocess.run(
        [sys.executable, "-m", "remat_dsl", "check", make_corpus.relative_path(name)],
        capture_output=True,
        text=True,
        cwd=ROOT,
    )
    assert result.returncode == 2
    assert "Traceback" not in result.stderr
    assert result.stderr == _golden(name)


def test_every_diagnostic_locates_quotes_and_fixes():
    for name in NAMES:
        lines = _golden(name).rstrip("\n").split("\n")
        assert lines[0].startswith(f"{make_corpus.relative_path(name)}:"), name
        assert ": error: " in lines[0], name
        assert "^" in lines[2], name
        assert lines[-1].startswith("  hint: "), name


def test_the_parser_from_its_shipped_tables_gives_every_diagnostic(monkeypatch):
    # NOTE: [Parser tables]: the parser read from grammar/plan.tables.json must say exactly
    # what the parser built from the grammar says, on every invalid plan and every valid one.
    from lark import Lark

    from remat_dsl.plan import parser, tables

    valid = sorted((ROOT / "tests" / "plans").glob("*.plan"))

    def outcomes() -> list:
        parser._lark.cache_clear()
        parser._terminal_names.cache_clear()
        diagnostics = [make_corpus.check_in_process(make_corpus.relative_path(name)) for name in NAMES]
        return [(status, stderr) for status, _, stderr in diagnostics] + [
            parser.parse(p.read_text(), str(p)) for p in valid
        ]

    try:
        with monkeypatch.context() as patch:
            patch.setattr(tables, "load", lambda name: None)  # built from the grammar
            built = outcomes()
        with monkeypatch.context() as patch:

            def no_build(*args, **kwargs):
                raise AssertionError("the parser was built, not read from its shipped tables")

            patch.setattr(Lark, "open", no_build)
            assert outcomes() == built
            assert parser._terminal_names() and parser._lark().options.propagate_positions
        assert built[: len(NAMES)] == [(2, _golden(name)) for name in NAMES]
    finally:
        parser._lark.cache_clear()
        parser._terminal_names.cache_clear()
