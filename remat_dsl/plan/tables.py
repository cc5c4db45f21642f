"""The grammars' LALR(1) parsers, from tables shipped with the package (NOTE: [Parser tables] in
remat_dsl/plan/parser.py).

`parser(name)` gives the Lark parser of grammar/NAME.lark.  Its tables are read from
grammar/NAME.tables.json (a wheel carries it as remat_dsl/grammar/NAME.tables.json) when that
file was made from this grammar, these options and this Lark; otherwise the parser is built in
memory from the grammar.  `python -m remat_dsl.plan.tables` (or `make tables`) writes the files
again; `--check` says which are out of date.

The file is Lark's own serialization of a built parser (`memo_serialize`, what
`python -m lark.tools.standalone` writes as Python) in JSON, which has neither tuples nor
integer keys: a tuple is written `{"(": [items]}` and a dict with integer keys
`{"#": [[key, value], ...]}`.  Lark numbers the parse states and the symbols of a table by the
iteration order of sets, which changes with Python's hash seed; the states are renumbered in
the order a walk from the start state meets them and the symbols by name, so that one grammar
gives one file.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import sys
from pathlib import Path
from typing import Any

import lark
from lark import Lark
from lark.grammar import Rule
from lark.lark import LarkOptions
from lark.lexer import TerminalDef

from remat_dsl.plan.resources import data_path

FORMAT = 1
GRAMMARS: dict[str, dict[str, Any]] = {  # grammar/NAME.lark -> the options of its Lark parser
    "plan": dict(parser="lalr", lexer="contextual", propagate_positions=True, maybe_placeholders=False),
    "constraints": dict(parser="lalr", lexer="contextual", propagate_positions=True),
    "profile": dict(parser="lalr", lexer="contextual", propagate_positions=True),
}
REGENERATE = "python -m remat_dsl.plan.tables"
SHIFT = 0  # Lark's action code in a serialized parse table (1 is Reduce)
IMPORT = re.compile(r"^%import\s+\.(\w+)", re.MULTILINE)


def parser(name: str) -> Lark:
    """The Lark parser of grammar/NAME.lark: from its shipped tables when they are this
    grammar's, else built in memory (1.2-1.6 s for the plan grammar).  Never reads the cache."""
    return load(name) or build(name)


def build(name: str) -> Lark:
    """The parser of grammar/NAME.lark, built from the grammar."""
    return Lark.open(str(data_path("grammar", f"{name}.lark")), **GRAMMARS[name])


def tables_path(name: str) -> Path:
    """Where the tables of grammar/NAME.lark are shipped."""
    return data_path("grammar", f"{name}.tables.json")


def grammar_digest(name: str) -> str:
    """SHA-256 of what the tables of `name` depend on: the grammar file and the files it
    %imports, the Lark options, Lark's version and this file format."""
    texts, pending = {}, [name]
    while pending:
        current = pending.pop()
        if current not in texts:
            texts[current] = data_path("grammar", f"{current}.lark").read_text(encoding="utf-8")
            pending.extend(IMPORT.findall(texts[current]))
    identity = (FORMAT, name, sorted(texts.items()), sorted(GRAMMARS[name].items()), lark.__version__)
    return hashlib.sha256(repr(identity).encode()).hexdigest()


def load(name: str) -> Lark | None:
    """The parser of `name` from its shipped tables, or None when they are missing, made
    from another grammar, options or Lark, or not what `tables_text` writes."""
    try:
        document = decode(tables_path(name).read_text(encoding="utf-8"))
        if not _is_current(document, name):
            return None
        loaded = Lark._load_from_dict(document["data"], document["memo"])
    except Exception:  # any damage to the shipped file: build the parser instead
        return None
    return loaded if _plain_options(loaded.options, name) else None


def _is_current(document: Any, name: str) -> bool:
    """Whether `document` holds tables of this grammar with exactly the expected options
    (no callbacks, post-lexer, tree class or transformer: nothing but data reaches Lark)."""
    if not isinstance(document, dict) or set(document) != {
        "about",
        "format",
        "grammar",
        "digest",
        "lark",
        "data",
        "memo",
    }:
        return False
    if (document["format"], document["grammar"], document["digest"]) != (FORMAT, name, grammar_digest(name)):
        return False
    data = document["data"]
    return (
        isinstance(data, dict)
        and set(data) == {"parser", "rules", "options", "__type__"}
        and data["options"] == expected_options(name)
        and isinstance(document["memo"], dict)
    )


def expected_options(name: str) -> dict:
    """The serialized Lark options a parser of `name` is built with: Lark's defaults, the
    grammar's GRAMMARS options, the start rule `start` and (as Lark sets it) priority `normal`."""
    return {**LarkOptions._defaults, **GRAMMARS[name], "start": ["start"], "priority": "normal"}


def _plain_options(options: LarkOptions, name: str) -> bool:
    """Whether a loaded parser runs no code of its options: no lexer callbacks, post-lexer,
    tree class, transformer, terminal editor or plugins, the `re` module, and `name`'s options."""
    hooks = (options.lexer_callbacks, options.postlex, options.tree_class, options.transformer, options.edit_terminals)
    return (
        not any(hooks)
        and not options._plugins
        and not options.regex
        and all(getattr(options, key) == value for key, value in GRAMMARS[name].items())
    )


def tables_text(name: str) -> str:
    """The text of grammar/NAME.tables.json, from the parser built from the grammar."""
    data, memo = build(name).memo_serialize([TerminalDef, Rule])
    data["parser"]["parser"] = _canonical_table(data["parser"]["parser"])
    document = {
        "about": f"LALR(1) tables of grammar/{name}.lark, written by `{REGENERATE}`; do not edit",
        "format": FORMAT,
        "grammar": name,
        "digest": grammar_digest(name),
        "lark": lark.__version__,
        "data": data,
        "memo": memo,
    }
    return _layout(_encode(document), 0) + "\n"


def _canonical_table(table: dict) -> dict:
    """Lark's serialized parse table with its symbols numbered by name and its states in the
    order a breadth-first walk from the start states meets them (shifts in symbol order)."""
    names = sorted(str(symbol) for symbol in table["tokens"].values())
    symbol = {old: names.index(str(name)) for old, name in table["tokens"].items()}
    actions = {
        state: sorted(((symbol[token], action) for token, action in row.items()), key=lambda item: item[0])
        for state, row in table["states"].items()
    }
    order = list(dict.fromkeys(table["start_states"][start] for start in sorted(table["start_states"])))
    seen = set(order)
    for state in order:  # grows while it is walked
        for _, (kind, arg) in actions[state]:
            if kind == SHIFT and arg not in seen:
                seen.add(arg)
                order.append(arg)
    if sorted(order) != sorted(actions):
        raise ValueError("the parse table has states no shift reaches")
    number = {old: new for new, old in enumerate(order)}
    states = {
        number[state]: {token: (kind, number[arg] if kind == SHIFT else arg) for token, (kind, arg) in actions[state]}
        for state in order
    }
    return {
        "tokens": dict(enumerate(names)),
        "states": dict(sorted(states.items())),
        "start_states": {start: number[state] for start, state in sorted(table["start_states"].items())},
        "end_states": {start: number[state] for start, state in sorted(table["end_states"].items())},
        **{key: value for key, value in table.items() if key not in ("tokens", "states", "start_states", "end_states")},
    }


def _encode(value):
    """`value` (Lark's serialization: dicts, lists, tuples, strings, ints, bools, None) as JSON
    values, tuples and integer-keyed dicts tagged as the module docstring says."""
    if isinstance(value, str):
        return str(value)  # Lark's Token is a str
    if isinstance(value, tuple):
        return {"(": [_encode(item) for item in value]}
    if isinstance(value, list):
        return [_encode(item) for item in value]
    if isinstance(value, dict):
        if value and all(type(key) is int for key in value):
            return {"#": [[key, _encode(item)] for key, item in value.items()]}
        if not all(isinstance(key, str) for key in value) or set(value) in ({"("}, {"#"}):
            raise ValueError(f"cannot write a dict with keys {sorted(map(repr, value))[:5]}")
        return {str(key): _encode(item) for key, item in value.items()}
    if value is None or type(value) in (bool, int):
        return value
    raise ValueError(f"cannot write a {type(value).__name__} in parser tables")


def decode(text: str):
    """The value `tables_text` wrote.  Raises ValueError for text that is not JSON."""
    return json.loads(text, object_hook=_untag)


def _untag(obj: dict):
    if len(obj) == 1 and "(" in obj and isinstance(obj["("], list):
        return tuple(obj["("])
    if len(obj) == 1 and "#" in obj and isinstance(obj["#"], list):
        return {int(key): item for key, item in obj["#"]}
    return obj


def _layout(value, depth: int) -> str:
    """`value` as JSON, a container that does not fit a line of 120 characters written one
    item a line (so that a grammar edit changes the lines it changes)."""
    compact = json.dumps(value, separators=(",", ":"), ensure_ascii=True)
    if len(compact) + depth <= 120 or not value or not isinstance(value, (dict, list)):
        return compact
    pad = " " * (depth + 1)
    if isinstance(value, dict):
        items = [f"{pad}{json.dumps(key)}:{_layout(item, depth + 1)}" for key, item in value.items()]
        return "{\n" + ",\n".join(items) + "\n" + " " * depth + "}"
    return "[\n" + ",\n".join(pad + _layout(item, depth + 1) for item in value) + "\n" + " " * depth + "]"


def _write(path: Path, text: str) -> None:
    """Write `text` to `path` through a temporary file renamed over it (no half-written file)."""
    temporary = path.with_name(f".{path.name}.tmp")
    temporary.write_text(text, encoding="utf-8")
    os.replace(temporary, path)


def main(argv: list[str] | None = None) -> int:
    """Write grammar/NAME.tables.json for every grammar (or, with --check, list the files
    that are not what the grammar gives: exit 1)."""
    options = argparse.ArgumentParser(prog=REGENERATE, description=main.__doc__)
    options.add_argument("--check", action="store_true", help="write nothing; exit 1 if a file is out of date")
    args = options.parse_args(argv)
    stale = []
    for name in GRAMMARS:
        path, text = tables_path(name), tables_text(name)
        current = path.read_text(encoding="utf-8") if path.exists() else None
        if current == text:
            continue
        stale.append(path)
        if not args.check:
            _write(path, text)
            print(f"wrote {path}", file=sys.stderr)
    if args.check and stale:
        print("out of date: " + ", ".join(map(str, stale)) + f"; run `{REGENERATE}`", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
