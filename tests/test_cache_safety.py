"""A cache is data, never code, and never a wrong plan (issue 45 part 2; NOTE: [Solution cache]
in remat_dsl/plan/cache.py, NOTE: [Parser tables] in remat_dsl/plan/parser.py).

Every case runs `remat` as a subprocess, as a user or git types it, with REMAT_CACHE_DIR set:
an entry edited in place (dropout's p, an op's time, a block's schedule) is a miss and the plan
is the one the untouched cache gives; a pickle in every file of the cache runs nothing in the
commands that read plans (`textconv`, `diff`, `check`, `fmt --check`) nor in `plan`; a cache
directory others can write is not used."""

from __future__ import annotations

import hashlib
import json
import os
import pickle
import shutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from remat_dsl.plan.cache import entry_digest
from remat_dsl.plan.tables import GRAMMARS

ROOT = Path(__file__).resolve().parent.parent
TINY_MLP = ROOT / "tests" / "models" / "tiny_mlp.py"
PLANS = sorted((ROOT / "tests" / "plans").glob("*.plan"))


def remat(cache: Path | str, *args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    env = {**os.environ, "REMAT_CACHE_DIR": str(cache), "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    return subprocess.run(
        [sys.executable, "-m", "remat_dsl", *args], capture_output=True, text=True, env=env, cwd=cwd, timeout=600
    )


def planned(cache: Path, *args: str) -> tuple[str, str]:
    """(plan text without its solve-time line, stderr) of `remat plan ARGS`, which must succeed."""
    result = remat(cache, "plan", *args)
    assert result.returncode == 0, result.stderr
    return (
        "".join(line for line in result.stdout.splitlines(True) if not line.lstrip().startswith("solve-time")),
        result.stderr,
    )


def entries(cache: Path, kind: str) -> list[Path]:
    return sorted((cache / kind).rglob("*.json"))


def rewrite(path: Path, edit, reseal: bool = False) -> None:
    """Apply `edit` to the value of the entry at `path`, keeping it well-formed JSON; its
    sha256 stays as it was unless `reseal`."""
    entry = json.loads(path.read_text())
    edit(entry["value"])
    if reseal:
        entry["sha256"] = entry_digest(path.parent.parent.name, entry["key"], entry["value"])
    path.write_text(json.dumps(entry))


def dropout_p(value: float):
    def edit(graph_entry: dict) -> None:
        (op,) = [op for op in graph_entry["graph"]["ops"] if op["target"] == "aten.native_dropout.default"]
        assert op["args"][1] == 0.1
        op["args"][1] = value

    return edit


@pytest.fixture(scope="module")
def filled(tmp_path_factory) -> tuple[Path, str]:
    """A cache filled by planning the tiny MLP at 90%, and that plan."""
    cache = tmp_path_factory.mktemp("filled") / "cache"
    plan, _ = planned(cache, str(TINY_MLP), "--budget", "90%")
    assert [len(entries(cache, kind)) for kind in ("graphs", "profiles")] == [1, 1]
    return cache, plan


def copy_of(filled: tuple[Path, str], tmp_path: Path) -> Path:
    cache = tmp_path / "cache"
    shutil.copytree(filled[0], cache)
    return cache


def test_an_edited_graph_entry_is_a_miss_and_the_plan_is_the_same(filled, tmp_path):
    cache = copy_of(filled, tmp_path)
    (graph,) = entries(cache, "graphs")
    rewrite(graph, dropout_p(0.5))
    plan, err = planned(cache, str(TINY_MLP), "--budget", "90%")
    assert plan == filled[1] and "aten.native_dropout.default(%relu, 0.1, True)" in plan
    assert "op costs from the cache" in err  # the profile was still a hit: only the edited graph was redone
    rewrite(
        graph, dropout_p(0.5), reseal=True
    )  # what a writer who recomputes the hash gets: why the root is owner-only
    resealed, _ = planned(cache, str(TINY_MLP), "--budget", "90%")
    assert "aten.native_dropout.default(%relu, 0.5, True)" in resealed


def test_an_edited_profile_entry_is_a_miss(filled, tmp_path):
    cache = copy_of(filled, tmp_path)
    shutil.rmtree(cache / "graphs")  # else the profiled graph is found first and the profile never read
    (profile,) = entries(cache, "profiles")

    def slower(value: dict) -> None:
        for row in value["forward"]:
            row[3] = 987_654_321  # time_us

    rewrite(profile, slower)
    plan, err = planned(cache, str(TINY_MLP), "--budget", "90%")
    assert "op costs from the cache" not in err and "987654" not in plan  # measured again
    rewrite(entries(cache, "profiles")[0], slower, reseal=True)
    shutil.rmtree(cache / "graphs")
    _, err = planned(cache, str(TINY_MLP), "--budget", "90%")
    assert "op costs from the cache" in err  # the control: a resealed edit is read


def test_a_graph_entry_that_does_not_decode_is_a_miss(filled, tmp_path):
    cache = copy_of(filled, tmp_path)
    (graph,) = entries(cache, "graphs")

    def undecodable(value: dict) -> None:
        value["graph"]["ops"][0]["$"] = "NotAnIrClass"  # decode_ir's ValueError

    rewrite(graph, undecodable, reseal=True)
    plan, _ = planned(cache, str(TINY_MLP), "--budget", "90%")
    assert plan == filled[1]
    deep = json.loads(graph.read_text())
    deep["value"]["graph"] = json.loads("[" * 900 + "]" * 900)  # nesting past Python's stack in decode_ir
    deep["sha256"] = entry_digest("graphs", deep["key"], deep["value"])
    graph.write_text(json.dumps(deep))
    plan, _ = planned(cache, str(TINY_MLP), "--budget", "90%")
    assert plan == filled[1]


def test_an_edited_block_entry_is_a_miss_and_the_plan_is_the_same(tmp_path):
    cache = tmp_path / "cache"
    args = (str(ROOT / "tests" / "models" / "tiny_cnn.py"), "--budget", "90%", "--solver", "rockmate")
    first, err = planned(cache, *args)
    blocks = entries(cache, "blocks")
    classes = err.count("solving block class")
    assert blocks and classes

    def store_all_only(value: dict) -> None:
        value["schedules"] = value["schedules"][:1]

    edited = [block for block in blocks if len(json.loads(block.read_text())["value"]["schedules"]) > 1]
    assert edited
    for block in edited:
        rewrite(block, store_all_only)
    again, err = planned(cache, *args)
    assert again == first
    assert err.count("solving block class") == classes  # the edited entries are misses, solved again
    assert 0 < classes - err.count("(from the cache)") <= len(edited)


class Payload:
    """Unpickled, it creates `path` (what an attacker's code would do first)."""

    def __init__(self, path: Path):
        self.path = str(path)

    def __reduce__(self):
        return (open, (self.path, "w"))


def old_parser_tables_name() -> str:
    """The file under `parsers/` that earlier versions read the plan parser from with
    `Lark.load` (a pickle): named by the grammar texts, options and versions."""
    import lark

    texts = [(path.name, path.read_text()) for path in sorted((ROOT / "grammar").glob("*.lark"))]
    identity = (texts, sorted(GRAMMARS["plan"].items()), lark.__version__, sys.version_info[:2])
    return f"plan-{hashlib.sha256(repr(identity).encode()).hexdigest()[:32]}.lark"


def poisoned(filled: tuple[Path, str], tmp_path: Path, sentinel: Path) -> Path:
    """A copy of the filled cache with a pickle that creates `sentinel` in every file, and in
    the parser tables' old place."""
    cache = copy_of(filled, tmp_path)
    (cache / "parsers").mkdir(mode=0o700)
    (cache / "parsers" / old_parser_tables_name()).touch()
    for kind in ("blocks", "chains"):
        (cache / kind / "00").mkdir(parents=True, mode=0o700)
        (cache / kind / "00" / f"{'0' * 64}.json").touch()
    payload = pickle.dumps(Payload(sentinel))
    files = [path for path in cache.rglob("*") if path.is_file()]
    for path in files:
        path.write_bytes(payload)
    assert len(files) == 5
    return cache


def reading_commands(work: Path) -> list[list[str]]:
    names = [str(work / path.name) for path in PLANS]
    return (
        [["textconv", name] for name in names]
        + [["check", name] for name in names[::2]]  # 2 s each: three of the six
        + [["diff", names[0], names[-1]], ["diff", names[1], names[2]]]
        + [["fmt", "--check", *names]]
    )


def test_a_pickle_anywhere_in_the_cache_runs_nothing(filled, tmp_path):
    sentinel = tmp_path / "sentinel"
    cache = poisoned(filled, tmp_path, sentinel)
    work = tmp_path / "plans"
    work.mkdir()
    for path in PLANS:
        shutil.copy(path, work)
    clean = tmp_path / "clean"
    commands = reading_commands(work)
    with ThreadPoolExecutor(max_workers=2) as pool:
        runs = list(
            pool.map(lambda command: (remat(cache, *command, cwd=work), remat(clean, *command, cwd=work)), commands)
        )
    assert not sentinel.exists()
    for command, (with_pickles, without) in zip(commands, runs):
        assert (with_pickles.returncode, with_pickles.stdout, with_pickles.stderr) == (
            without.returncode,
            without.stdout,
            without.stderr,
        ), command
        assert without.returncode in (0, 1) and "Traceback" not in without.stderr, command
    assert not clean.exists()  # commands that read plans do not touch a cache
    planned(cache, str(TINY_MLP), "--budget", "90%")  # every entry a miss: measured and solved again
    assert not sentinel.exists()


def test_a_cache_directory_others_can_write_is_not_used(filled, tmp_path):
    cache = copy_of(filled, tmp_path)
    cache.chmod(0o775)
    before = sorted(p.relative_to(cache) for p in cache.rglob("*"))
    result = remat(cache, "plan", str(TINY_MLP), "--budget", "90%")
    assert result.returncode == 0, result.stderr
    warnings = [line for line in result.stderr.splitlines() if line.startswith("warning: not using the cache")]
    assert warnings == [
        f"warning: not using the cache {cache}: group or others can write it (mode 0o775); "
        f"run `chmod go-w {cache}` or set REMAT_CACHE_DIR (it only saves time)"
    ]
    assert "op costs from the cache" not in result.stderr
    assert sorted(p.relative_to(cache) for p in cache.rglob("*")) == before


@pytest.mark.skipif(os.getuid() != 0, reason="only root can make a directory that belongs to another user")
def test_a_cache_directory_of_another_user_is_not_used(filled, tmp_path):
    cache = copy_of(filled, tmp_path)
    os.chown(cache, 65534, 65534)
    result = remat(cache, "plan", str(TINY_MLP), "--budget", "90%")
    assert result.returncode == 0, result.stderr
    assert f"warning: not using the cache {cache}: it belongs to user id 65534, not to you;" in result.stderr
    assert "op costs from the cache" not in result.stderr


def test_a_new_cache_directory_is_owner_only(tmp_path):
    cache = tmp_path / "new" / "cache"
    result = subprocess.run(
        f"umask 000 && {sys.executable} -m remat_dsl plan {TINY_MLP} --budget 90% > /dev/null",
        shell=True,
        capture_output=True,
        text=True,
        env={**os.environ, "REMAT_CACHE_DIR": str(cache), "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"},
    )
    assert result.returncode == 0, result.stderr
    directories = [cache, *(p for p in cache.rglob("*") if p.is_dir())]
    files = [p for p in cache.rglob("*") if p.is_file()]
    assert len(directories) == 5 and len(files) == 2
    assert {oct(p.stat().st_mode & 0o777) for p in directories} == {"0o700"}
    assert {oct(p.stat().st_mode & 0o777) for p in files} == {"0o600"}
