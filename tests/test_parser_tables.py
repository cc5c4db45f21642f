"""The grammars' parse tables ship with the package (NOTE: [Parser tables] in
remat_dsl/plan/parser.py): grammar/NAME.tables.json is what the grammar gives, whatever the
hash seed; it is used only for the grammar, options and Lark it was made from, and only with
options that run no code; and nothing in the package unpickles anything."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from lark import Lark

from remat_dsl.plan import parser, tables

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize("name", sorted(tables.GRAMMARS))
def test_the_shipped_tables_are_what_the_grammar_gives(name):
    shipped = tables.tables_path(name)
    assert shipped.exists() and shipped.read_text(encoding="utf-8") == tables.tables_text(
        name
    ), f"{shipped.relative_to(ROOT)} is not what grammar/{name}.lark gives: run `{tables.REGENERATE}` (make tables)"


@pytest.mark.parametrize("name", sorted(tables.GRAMMARS))
def test_the_shipped_tables_are_used_and_parse_as_the_grammar_does(name, monkeypatch):
    built = tables.build(name)
    monkeypatch.setattr(Lark, "open", lambda *a, **k: pytest.fail("built, not read from the shipped tables"))
    loaded = tables.parser(name)
    assert loaded.options.options == built.options.options
    assert [t.name for t in loaded.terminals] == [t.name for t in built.terminals]
    texts = {"plan": [p.read_text() for p in sorted((ROOT / "tests" / "plans").glob("*.plan"))]}
    for text in texts.get(name, []):
        assert loaded.parse(text) == built.parse(text)


def test_one_grammar_gives_one_file_whatever_the_hash_seed():
    # Lark numbers states by the iteration order of sets; the file renumbers them
    env = {**os.environ, "PYTHONHASHSEED": "12345", "PYTHONPATH": str(ROOT)}
    result = subprocess.run(
        [sys.executable, "-m", "remat_dsl.plan.tables", "--check"], capture_output=True, text=True, env=env, cwd=ROOT
    )
    assert result.returncode == 0, result.stderr


def _grammar_copy(tmp_path: Path, monkeypatch) -> Path:
    """A copy of grammar/ (tables included) that `tables` reads instead of the shipped one."""
    copy = tmp_path / "grammar"
    shutil.copytree(ROOT / "grammar", copy)
    monkeypatch.setattr(tables, "data_path", lambda *parts: tmp_path.joinpath(*parts))
    return copy


def test_tables_of_another_grammar_are_not_used(tmp_path, monkeypatch):
    copy = _grammar_copy(tmp_path, monkeypatch)
    assert tables.load("plan") is not None
    (copy / "common.lark").write_text((copy / "common.lark").read_text() + "\n// an edit of an imported file\n")
    assert tables.load("plan") is None and tables.load("constraints") is None
    assert tables.parser("plan").parse((ROOT / "tests" / "plans" / "tiny_mlp_recompute.plan").read_text())


def _edited(copy: Path, edit) -> None:
    path = copy / "plan.tables.json"
    document = tables.decode(path.read_text())
    edit(document)
    path.write_text(json.dumps(tables._encode(document)))


@pytest.mark.parametrize(
    "edit",
    [
        lambda d: d["data"]["options"].update(keep_all_tokens=True),
        lambda d: d["data"]["options"].update(regex=True),
        lambda d: d["data"]["options"].update(postlex="x"),
        lambda d: d["data"]["options"].update(lexer_callbacks={"NAME": "x"}),
        lambda d: d["data"]["options"].update(tree_class="x"),
        lambda d: d["data"].update(grammar={"rule_defs": [], "term_defs": []}),
        lambda d: d.update(lark="0.0.1", digest="0" * 64),
        lambda d: d.update(format=2),
        lambda d: d.update(grammar="profile"),
        lambda d: d.pop("memo"),
    ],
    ids=[
        "keep_all_tokens",
        "regex",
        "postlex",
        "lexer_callbacks",
        "tree_class",
        "grammar",
        "lark",
        "format",
        "name",
        "memo",
    ],
)
def test_tables_with_other_options_or_provenance_are_not_used(tmp_path, monkeypatch, edit):
    copy = _grammar_copy(tmp_path, monkeypatch)
    _edited(copy, lambda d: None)
    assert tables.load("plan") is not None  # the edit below is what refuses it
    _edited(copy, edit)
    assert tables.load("plan") is None  # and `parser` builds it (test_tables_of_another_grammar_are_not_used)


@pytest.mark.parametrize("damage", ["", "{", "[]", '{"(": 1}', "\udcff", "[" * 100_000])
def test_damaged_tables_are_built_again(tmp_path, monkeypatch, damage):
    copy = _grammar_copy(tmp_path, monkeypatch)
    (copy / "plan.tables.json").write_text(damage, errors="surrogateescape")
    assert tables.load("plan") is None
    (copy / "plan.tables.json").unlink()
    assert tables.load("plan") is None


def test_the_plan_parser_reads_nothing_from_the_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("REMAT_CACHE_DIR", str(tmp_path))
    parser._lark.cache_clear()
    try:
        assert parser.parse((ROOT / "tests" / "plans" / "tiny_mlp_recompute.plan").read_text())
    finally:
        parser._lark.cache_clear()
    assert list(tmp_path.iterdir()) == []


def test_nothing_in_the_package_unpickles():
    pattern = re.compile(
        r"\bimport (c?pickle|marshal|shelve|dill)\b|\bfrom (c?pickle|marshal|shelve) import|Lark\.load\b"
    )
    found = [
        f"{path.relative_to(ROOT)}:{number}"
        for path in sorted((ROOT / "remat_dsl").rglob("*.py"))
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if pattern.search(line)
    ]
    assert found == []
