"""Every bad invocation in tests/bad_invocations/cases.toml, run as a user types it.

Each case is a `remat` subprocess in an empty working directory of its own: it must exit
with its status (2), say its message on stderr, print no traceback and nothing on stdout,
and leave the directory as it found it.  Two cases run at a time (the machine has two
cores); each takes a few seconds because most import torch.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tomllib
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path

import pytest

from remat_dsl.plan import ir
from remat_dsl.plan.parser import parse_file
from remat_dsl.plan.printer import print_plan

ROOT = Path(__file__).resolve().parent.parent
HERE = ROOT / "tests" / "bad_invocations"
CASES = tomllib.loads((HERE / "cases.toml").read_text())["case"]
VALID = ROOT / "tests" / "plans" / "tiny_mlp_autograd.plan"
TINY = ROOT / "tests" / "models" / "tiny_mlp.py"


def _sealed(edit) -> str:
    """The valid tiny plan with `edit(plan) -> plan` applied in the IR, printed (so its
    digest matches: the mistake is one the digest does not catch)."""
    return print_plan(edit(parse_file(VALID)))


def _op(plan: ir.Plan, name: str, **changes) -> ir.Plan:
    ops = tuple(replace(op, **changes) if op.name == name else op for op in plan.graph.ops)
    return replace(plan, graph=replace(plan.graph, ops=ops))


def _tensor(plan: ir.Plan, name: str, **changes) -> ir.Plan:
    tensors = tuple(replace(t, **changes) if t.name == name else t for t in plan.graph.tensors)
    return replace(plan, graph=replace(plan.graph, tensors=tensors))


def _text_edit(old: str, new: str) -> str:
    text = VALID.read_text()
    assert text.count(old) == 1, old
    return text.replace(old, new)


def _without_digest() -> str:
    text = VALID.read_text()
    return text[: text.index("\ndigest\n")] + "\n"


def _nested() -> str:
    return _text_edit("aten.relu.default(%fc1)", "aten.relu.default(" + "[" * 3000 + "%fc1" + "]" * 3000 + ")")


FILES = {
    "latin1.txt": lambda: "remat-plan 1\nété\n".encode("latin-1"),
    "unknown_kind.constraints": lambda: '# keep the first layer\nkep "fc*"\n',
    "bad_budget.constraints": lambda: "budget lots\n",
    "conflict.constraints": lambda: 'keep "relu*"\nrecompute "relu"\n',
    "typo.constraints": lambda: 'keep "fc9*"\n',
    "keep_all.constraints": lambda: 'keep "*"\n',
    "syntax.plan": lambda: _text_edit("  compute  fc2\n", "  compute  fc2  compute\n"),
    "other.profile": lambda: (
        'remat-profile 1\nmodel   "examples/resnet.py"\ndevice  cpu\ntorch   "2.13.0+cpu"\ninput   x  float32[8, 3, 32,'
        " 32]\n\nops\n  conv  0.100 ms  0 B\n"
    ),
    "syntax.toml": lambda: 'kind = "cuda"\nmemory = \n',
    "missing_key.toml": lambda: 'kind = "cuda"\nmemory = 80e9\n',
    "valid.plan": lambda: VALID.read_text(),
    "empty.plan": lambda: "",
    "nested.plan": _nested,
    "negative_time.plan": lambda: _text_edit("0.004 ms     0 B    forward", "-0.004 ms     0 B    forward"),
    "unknown_operator.plan": lambda: _sealed(lambda p: _op(p, "fc1", target="aten.addmmm.default")),
    "inline_allocation.plan": lambda: _sealed(
        lambda p: _op(p, "relu_1", args=(ir.Call("aten.relu.default", (ir.Ref("fc2"),)),))
    ),
    "unknown_dtype.plan": lambda: _sealed(lambda p: _tensor(p, "fc1", dtype="float33")),
    "huge.plan": lambda: _sealed(lambda p: _tensor(p, "fc1", shape=(10**9, 10**9))),
    "tpu.plan": lambda: _sealed(lambda p: replace(p, header=replace(p.header, device="tpu"))),
    "over_budget.plan": lambda: _sealed(lambda p: replace(p, header=replace(p.header, budget=1000))),
    "no_gradient_line.plan": lambda: _text_edit("  fc1.weight  = aten.t.default(aten.t.default(%fc1.bwd.mm))\n", ""),
    "edited_op.plan": lambda: _text_edit("relu = aten.relu.default(%fc1)", "relu = aten.sigmoid.default(%fc1)"),
    "no_digest.plan": _without_digest,
    "own.plan": lambda: VALID.read_text(),  # a plan that a case tries to write over (NOTE: [Safe outputs])
    "model.py": lambda: TINY.read_text(),  # a model file that a case tries to write over
    "notes.txt": lambda: "notes nobody should lose\n",
}
SPECIAL = {"a_directory", "a_fifo", "big.plan", "link.plan"}  # made by the `files` fixture itself
BIG_BYTES = 200_000_000  # a sparse file: its size is read, never its bytes (NOTE: [Bounded inputs])


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> Path:
    where = tmp_path_factory.mktemp("files")
    (where / "a_directory").mkdir()
    os.mkfifo(where / "a_fifo")
    with open(where / "big.plan", "wb") as handle:
        handle.truncate(BIG_BYTES)
    (where / "link.plan").symlink_to("own.plan")
    for name, make in FILES.items():
        data = make()
        (where / name).write_bytes(data if isinstance(data, bytes) else data.encode("utf-8"))
    return where


def _expand(text: str, tmp: Path, files: Path) -> str:
    return text.format(tmp=tmp, tiny=TINY, models=HERE / "models", files=files, root=ROOT)


def _unchanged(files: Path) -> bool:
    """The files that cases try to write over are as the fixture made them."""
    return all((files / n).read_bytes() == FILES[n]().encode("utf-8") for n in ("own.plan", "model.py", "notes.txt"))


def _run(case: dict, base: Path, files: Path) -> tuple[dict, Path, list[str], subprocess.CompletedProcess]:
    tmp = base / case["name"].replace(" ", "_")
    tmp.mkdir()
    cache = base / "caches" / tmp.name  # its own
    cache.mkdir(parents=True)
    for entry in case.get("precreate", []):
        (tmp / entry).mkdir() if entry.endswith("/") else (tmp / entry).touch()
    before = sorted(os.listdir(tmp))
    args = [_expand(a, tmp, files) for a in case["args"]]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "REMAT_CACHE_DIR": str(cache), **case.get("env", {})}
    result = subprocess.run(
        [sys.executable, "-m", "remat_dsl", *args], cwd=tmp, capture_output=True, text=True, env=env, timeout=300
    )
    return case, tmp, before, result


@pytest.fixture(scope="module")
def results(files, tmp_path_factory) -> dict:
    base = tmp_path_factory.mktemp("cases")
    with ThreadPoolExecutor(max_workers=2) as pool:
        runs = list(pool.map(lambda case: _run(case, base, files), CASES))
    return {case["name"]: (tmp, before, result) for case, tmp, before, result in runs}


def test_the_corpus_is_large_and_names_are_unique():
    names = [case["name"] for case in CASES]
    assert len(names) >= 60
    assert len(set(names)) == len(names)
    assert set(FILES) | SPECIAL >= {a.split("{files}/")[1] for case in CASES for a in case["args"] if "{files}/" in a}


@pytest.mark.parametrize("case", CASES, ids=[case["name"] for case in CASES])
def test_bad_invocation(case, results, files):
    tmp, before, result = results[case["name"]]
    stderr = result.stderr
    assert result.returncode == case.get("status", 2), stderr
    assert "Traceback" not in stderr, stderr
    assert result.stdout == "", result.stdout
    assert _expand(case["message"], tmp, files) in stderr, stderr
    if "where" in case:  # the error line starts with the location (progress lines may come before it)
        assert any(line.startswith(_expand(case["where"], tmp, files)) for line in stderr.splitlines()), stderr
    assert sorted(os.listdir(tmp)) == before, "files left behind"
    assert _unchanged(files), "an input or a file the tool did not write was replaced"
    shutil.rmtree(tmp)
