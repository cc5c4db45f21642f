"""The cache of measured op times and block solutions (NOTE: [Solution cache] in
remat_dsl/plan/cache.py; issue 13 part 6): reused across budgets and runs, byte-identical
plans from it, never a stale or foreign entry, off with --no-cache."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from remat_dsl.plan.cache import NO_CACHE, Cache, default_cache, entry_digest

ROOT = Path(__file__).resolve().parent.parent
REMAT = Path(sys.executable).parent / "remat"


def test_entries_round_trip_and_bad_ones_are_misses(tmp_path):
    cache = Cache(tmp_path)
    key = Cache.key("profile", (1, 2), "x")
    assert key == Cache.key("profile", (1, 2), "x") and key != Cache.key("profile", (1, 3), "x")
    assert cache.get("profiles", key) is None
    cache.put("profiles", key, {"op": 12})
    assert cache.get("profiles", key) == {"op": 12}
    path = next((tmp_path / "profiles").rglob("*.json"))
    path.write_text(path.read_text()[:-5])  # truncated
    assert cache.get("profiles", key) is None
    other = Cache.key("other")
    path.write_text(
        '{"key": "%s", "value": 1, "sha256": "%s"}' % (other, entry_digest("profiles", other, 1))
    )  # another key's entry
    assert cache.get("profiles", key) is None
    assert list(tmp_path.rglob("*.tmp")) == []  # written by rename: no leftovers
    NO_CACHE.put("profiles", key, 1)
    assert NO_CACHE.get("profiles", key) is None


def _entry_file(cache: Cache, kind: str, key: str) -> Path:
    cache.put(kind, key, {"p": 0.1, "ops": [1, 2]})
    (path,) = (cache.root / kind).rglob("*.json")
    return path


def test_an_entry_is_used_only_as_its_own_hash_says(tmp_path):
    """NOTE: [Solution cache]: every entry holds a SHA-256 of its kind, key and value; an
    edited, unhashed or malformed entry is a miss (None), never an error or another value."""
    import json

    cache = Cache(tmp_path)
    key = Cache.key("graph")
    path = _entry_file(cache, "graphs", key)
    entry = json.loads(path.read_text())
    assert set(entry) == {"key", "value", "sha256"} and entry["sha256"] == entry_digest("graphs", key, entry["value"])
    assert cache.get("graphs", key) == {"p": 0.1, "ops": [1, 2]}
    assert cache.get("profiles", key) is None  # another kind: another file
    edits = {
        "edited value": {**entry, "value": {"p": 0.5, "ops": [1, 2]}},
        "no hash": {"key": key, "value": entry["value"]},
        "hash of another kind": {**entry, "sha256": entry_digest("profiles", key, entry["value"])},
        "hash of another value": {**entry, "sha256": entry_digest("graphs", key, {"p": 0.5})},
        "hash not a string": {**entry, "sha256": 1},
        "hash not ascii": {**entry, "sha256": "\u00e9" * 64},
        "extra field": {**entry, "more": 1},
        "a list": [entry],
    }
    for name, edited in edits.items():
        path.write_text(json.dumps(edited))
        assert cache.get("graphs", key) is None, name
    for name, data in {"deep": b"[" * 200_000, "not utf-8": b"\xff\xfe", "empty": b"", "nan": b"NaN"}.items():
        path.write_bytes(data)
        assert cache.get("graphs", key) is None, name
    path.write_text(json.dumps(entry))
    assert cache.get("graphs", key) == {"p": 0.1, "ops": [1, 2]}  # the original reads again


def test_values_read_back_as_their_hash_was_taken(tmp_path):
    """`put` hashes the value as JSON reads it back: tuples as lists, integer keys as
    strings, non-finite floats as they are; so what is stored is always a hit."""
    cache = Cache(tmp_path)
    key = Cache.key("values")
    value = {"t": (1, (2.5, None)), 3: "int key", 10: "sorts after 3 as a number, before as text", "inf": float("inf")}
    cache.put("blocks", key, value)
    assert cache.get("blocks", key) == {"t": [1, [2.5, None]], "3": "int key", "10": value[10], "inf": float("inf")}


def test_only_regular_files_of_this_user_that_others_cannot_write_are_read(tmp_path):
    cache = Cache(tmp_path)
    key = Cache.key("own")
    path = _entry_file(cache, "chains", key)
    assert path.stat().st_mode & 0o777 == 0o600
    path.chmod(0o620)  # group-writable: someone else could have written it
    assert cache.get("chains", key) is None
    path.chmod(0o600)
    assert cache.get("chains", key) is not None
    target = path.with_suffix(".target")
    path.rename(target)
    path.symlink_to(target)  # a link in an entry's place
    assert cache.get("chains", key) is None
    path.unlink()
    os.mkfifo(path)  # would block a reader that opens it plainly
    assert cache.get("chains", key) is None
    path.unlink()
    target.rename(path)
    if os.getuid() == 0:  # only root can give a file away
        os.chown(path, 65534, 65534)
        assert cache.get("chains", key) is None


def test_the_cache_makes_owner_only_directories_and_files_whatever_the_umask(tmp_path):
    root = tmp_path / "a" / "cache"
    old = os.umask(0)
    try:
        Cache(root).put("profiles", Cache.key("x"), 1)
    finally:
        os.umask(old)
    made = [root, *(p for p in root.rglob("*") if p.is_dir())]
    assert len(made) == 3 and all(p.stat().st_mode & 0o777 == 0o700 for p in made)
    (entry,) = root.rglob("*.json")
    assert entry.stat().st_mode & 0o777 == 0o600
    assert Cache(root).get("profiles", Cache.key("x")) == 1


def test_a_cache_others_can_write_is_neither_read_nor_written(tmp_path, capsys):
    from remat_dsl.plan import cache as cache_module

    root = tmp_path / "shared"
    Cache(root).put("profiles", Cache.key("x"), 1)
    root.chmod(0o770)
    cache_module._warned.discard(str(root))
    shared = Cache(root)
    assert not shared.enabled and shared.get("profiles", Cache.key("x")) is None
    shared.put("profiles", Cache.key("y"), 2)
    assert len(list(root.rglob("*.json"))) == 1
    Cache(root)  # a second look says nothing more
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(f"warning: not using the cache {root}: group or others can write it")
    assert f"chmod go-w {root}" in err and "REMAT_CACHE_DIR" in err
    root.chmod(0o700)
    assert Cache(root).get("profiles", Cache.key("x")) == 1


def test_default_place(monkeypatch, tmp_path):
    monkeypatch.setenv("REMAT_CACHE_DIR", "off")
    assert not default_cache().enabled
    monkeypatch.setenv("REMAT_CACHE_DIR", str(tmp_path))
    assert default_cache().root == tmp_path
    monkeypatch.delenv("REMAT_CACHE_DIR")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert default_cache().root == tmp_path / "xdg" / "remat-dsl"


def plan(tmp_path: Path, budget: str, name: str, *extra: str) -> str:
    """`remat plan` through a shell as a user types it; returns its stderr."""
    command = f"{REMAT} plan {ROOT}/tests/models/hf_llama.py --budget {budget} {' '.join(extra)} > {name}"
    result = subprocess.run(command, shell=True, cwd=tmp_path, env=dict(os.environ), capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    return result.stderr


def test_a_second_budget_reuses_times_and_block_solutions(tmp_path):
    first = plan(tmp_path, "700000B", "a.plan")
    assert "from the cache" not in first and "solving block class" in first
    again = plan(tmp_path, "700000B", "b.plan")
    assert "op costs from the cache" in again and "(from the cache)" in again
    assert (tmp_path / "a.plan").read_bytes() == (tmp_path / "b.plan").read_bytes()
    other = plan(tmp_path, "760000B", "c.plan")
    assert "op costs from the cache" in other and "(from the cache)" in other
    fresh = plan(tmp_path, "700000B", "d.plan", "--no-cache")
    assert "from the cache" not in fresh


TOKENS = '''"""An embedding and a classifier, weights not seeded; the token ids come from $IDS_SEED."""
import os

import torch
from torch import nn


def build_model():
    return nn.Sequential(nn.Embedding(16, 8), nn.Linear(8, 16))


def sample_inputs():
    return (torch.randint(0, 16, (2, 8), generator=torch.Generator().manual_seed(int(os.environ["IDS_SEED"]))),)
'''


def test_the_profile_key_holds_the_token_ids_not_the_weights(tmp_path):
    """NOTE: [Profile key] in capture/pipeline.py: a warm run takes the whole step profile
    from the cache without running an op, whatever the (unseeded) weights; other token ids
    of the same shape are another profile."""
    (tmp_path / "tokens.py").write_text(TOKENS)

    def run(seed: str, name: str) -> str:
        command = f"{REMAT} plan tokens.py --budget 100% > {name}"
        env = {**os.environ, "IDS_SEED": seed}
        result = subprocess.run(command, shell=True, cwd=tmp_path, env=env, capture_output=True, text=True)
        assert result.returncode == 0, result.stderr
        return result.stderr

    assert "op costs from the cache" not in run("1", "a.plan")
    assert "op costs from the cache" in run("1", "b.plan")
    assert (tmp_path / "a.plan").read_bytes() == (tmp_path / "b.plan").read_bytes()
    assert "op costs from the cache" not in run("2", "c.plan")


def test_a_forward_that_updates_buffers_still_runs_when_captured():
    """NOTE: [Capture without running] in capture/fx.py: BatchNorm's running statistics
    are updated in the captured copy, whose buffers are then profiled, as before."""
    from remat_dsl.capture.fx import capture
    from remat_dsl.capture.model_file import load_model_file

    model_file = load_model_file(str(ROOT / "tests" / "models" / "tiny_cnn.py"))
    model = model_file.build_model()
    captured = capture(model, model_file.sample_inputs())
    named = dict(zip(captured.primal_names, captured.example_primals))
    mean = named["buffer", "1.running_mean"]
    assert mean.abs().sum() > 0 and model.get_buffer("1.running_mean").abs().sum() == 0
    assert named["buffer", "1.num_batches_tracked"].item() == 1


def test_a_warm_capture_recalls_the_profiled_graph_before_aot_autograd(tmp_path):
    """NOTE: [Capture key] in capture/fx.py: the second capture of a model finds its whole
    profiled FB-graph by dynamo's graph, so AOTAutograd never traces it; the graph equals
    the first one and one captured without the cache."""
    import torch._dynamo.backends.common as common  # where the backend calls AOTAutograd

    from remat_dsl.capture.model_file import load_model_file
    from remat_dsl.capture.pipeline import capture_graph

    model_file = load_model_file(str(ROOT / "tests" / "models" / "hf_llama.py"))
    cache = Cache(tmp_path)
    traced = []
    original = common.aot_module_simplified
    common.aot_module_simplified = lambda *a, **k: traced.append(1) or original(*a, **k)
    try:
        first = capture_graph(model_file, cache=cache)
        assert not first.cached and traced == [1] and list((tmp_path / "graphs").rglob("*.json"))
        again = capture_graph(model_file, cache=cache)
    finally:
        common.aot_module_simplified = original
    assert again.cached and traced == [1] and again.graph == first.graph and again.noisy == first.noisy
    fresh = capture_graph(model_file, cache=NO_CACHE)
    assert [op.name for op in fresh.graph.ops] == [op.name for op in again.graph.ops]
    assert fresh.graph.outputs == again.graph.outputs and fresh.graph.tensors == again.graph.tensors


OUTPUTS = '''"""One linear layer; its output returned as STRUCTURE."""
import torch
from torch import nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 8)

    def forward(self, x):
        y = self.fc(x)
        return STRUCTURE


def build_model():
    torch.manual_seed(0)
    return Model()


def sample_inputs():
    return (torch.randn(4, 8),)
'''


def test_the_same_graph_returned_in_another_structure_is_not_recalled(tmp_path):
    """Dynamo builds the output object outside its graph, so two models with one graph but
    another output structure share the key of NOTE: [Capture key]: the structure stored
    with the entry is compared, and the second model is captured again."""

    def run(structure: str, name: str, *extra: str) -> str:
        (tmp_path / "model.py").write_text(OUTPUTS.replace("STRUCTURE", structure))
        command = f"{REMAT} plan model.py --budget 100% {' '.join(extra)} > {name}"
        result = subprocess.run(command, shell=True, cwd=tmp_path, env=dict(os.environ), capture_output=True, text=True)
        assert result.returncode == 0, result.stderr
        return (tmp_path / name).read_text()

    def outputs(text: str) -> str:
        return text[text.index("\noutputs\n") : text.index("\ngradients\n")]

    as_tuple = run("(y,)", "a.plan")
    as_dict = run('{"out": y}', "b.plan")
    assert "dict(out=" in outputs(as_dict) and "dict(out=" not in outputs(as_tuple)
    assert outputs(as_dict) == outputs(run('{"out": y}', "c.plan", "--no-cache"))


def test_ir_values_round_trip_through_json(tmp_path):
    """encode_ir / decode_ir (NOTE: [Capture key]): dataclasses, tuples, infinities; spans
    are not kept; what is not an ir value is refused."""
    import json

    import pytest

    from remat_dsl.plan import ir
    from remat_dsl.plan.cache import decode_ir, encode_ir

    op = ir.Op(
        "fwd.masked_fill", "forward", "aten.masked_fill.Scalar",
        (ir.Ref("x", span=ir.Span(3, 4)), ir.Ref("mask"), float("-inf")),
        (("value", ir.ListArg((1, 2.5, None, True, "s", ir.Sym("torch.float32")))),),
        ("t",), 12, 4, False, ("a comment",),
    )  # fmt: skip
    back = decode_ir(json.loads(json.dumps(encode_ir(op))))
    assert back == op and back.args[0].span is None and isinstance(back.kwargs[0][1].items, tuple)
    with pytest.raises(TypeError):
        encode_ir({"a": 1})
    with pytest.raises(ValueError):
        decode_ir({"$": "Path", "x": 1})


def test_refs_kept_on_an_op_change_neither_its_key_nor_its_json():
    """`ir.op_refs` keeps an op's references on it (the simulation asks for them hundreds of
    thousands of times a plan): the same Refs in the same order as its arguments hold,
    and the op's repr (so every cache key made from it), equality and JSON are as before."""
    import json

    from remat_dsl.plan import ir
    from remat_dsl.plan.cache import encode_ir

    op = ir.Op(
        "bwd.mul", "backward", "aten.mul.Tensor",
        (ir.Ref("a"), ir.Call("aten.view.default", (ir.Ref("b"), ir.ListArg((2, 3))))),
        (("other", ir.TupleArg((ir.Ref("c"), 1))),), ("t",), 5,
    )  # fmt: skip
    before = (repr(op), Cache.key(op), json.dumps(encode_ir(op)))
    refs = ir.op_refs(op)
    assert [r.name for r in refs] == ["a", "b", "c"] and ir.op_refs(op) is refs
    assert (repr(op), Cache.key(op), json.dumps(encode_ir(op))) == before
    twin = ir.Op(op.name, op.phase, op.target, op.args, op.kwargs, op.outputs, op.time_us)
    assert twin == op and hash(twin) == hash(op)


def test_a_refused_budget_is_refused_again_from_the_chain_memo(tmp_path, monkeypatch):
    """NOTE: [Chain memo] in remat_dsl/solve/solvers/ilp/rockmate.py: a refused budget runs RK-Rotor's
    table at the budget and at every target at and near the floor; warm, the same
    refusal runs none, another refused budget only its own, and both say what a run without
    the cache says.  A plan from the memo is byte-identical; an entry whose sequence does not
    replay to the time it records is recomputed, not used."""
    import json

    import pytest

    from remat_dsl.capture.model_file import load_model_file
    from remat_dsl.capture.pipeline import capture_graph
    from remat_dsl.plan.printer import print_plan, without_solve_time
    from remat_dsl.solve.api import BudgetError
    from remat_dsl.solve.solvers.chain import rk_rotor
    from remat_dsl.solve.driver import Planner

    graph = capture_graph(load_model_file(str(ROOT / "tests" / "models" / "hf_llama.py"))).graph
    tables = []
    real = rk_rotor._tables
    monkeypatch.setattr(
        rk_rotor, "_tables", lambda chain, budget, slots: tables.append(budget) or real(chain, budget, slots)
    )

    def refusal(cache, budget: int) -> BudgetError:
        tables.clear()
        with pytest.raises(BudgetError) as caught:
            Planner(graph, cache=cache).plan(budget, "rockmate")
        return caught.value

    fresh = Planner(graph, cache=NO_CACHE)
    smallest = refusal(NO_CACHE, fresh.gradient_bytes + 1).smallest
    low, lower = (fresh.gradient_bytes + smallest) // 2, (3 * fresh.gradient_bytes + smallest) // 4
    expected = {lower: str(refusal(NO_CACHE, lower)), low: str(refusal(NO_CACHE, low))}
    cold_tables = len(tables)  # of the refusal of `low` without the cache
    assert cold_tables > 10  # the targets at and near each candidate's floor

    cache = Cache(tmp_path)
    assert str(refusal(cache, low)) == expected[low] and len(tables) > 10  # a target met twice runs once
    assert list((tmp_path / "chains").rglob("*.json"))
    assert str(refusal(cache, low)) == expected[low] and tables == []
    assert str(refusal(cache, lower)) == expected[lower] and 0 < len(tables) < cold_tables // 4

    def plan_text(cache) -> str:
        return without_solve_time(print_plan(Planner(graph, cache=cache).plan(smallest, "rockmate")))

    expected_plan = plan_text(NO_CACHE)
    assert plan_text(cache) == expected_plan
    tables.clear()
    assert plan_text(cache) == expected_plan and tables == []

    tampered = 0
    for path in (tmp_path / "chains").rglob("*.json"):
        entry = json.loads(path.read_text())
        if isinstance(entry["value"], dict) and entry["value"]["schedule"] is not None:
            entry["value"]["schedule"]["us"] -= 1  # a faster plan than the sequence gives
            entry["sha256"] = entry_digest(
                "chains", entry["key"], entry["value"]
            )  # resealed: the replay must refuse it
            path.write_text(json.dumps(entry))
            tampered += 1
    assert tampered
    tables.clear()
    assert plan_text(cache) == expected_plan and tables


def test_a_capture_tokenizes_no_source_file_for_the_logs_it_silences():
    """NOTE: [Unlogged function names] in remat_dsl/capture/fx.py: under the pinned torch,
    dynamo names the function of each source line for a log line our capture silences; the
    capture answers None instead of tokenizing every file it traces, and puts dynamo's own
    lookup back after."""
    import torch._dynamo.funcname_cache as funcname_cache
    import torch._dynamo.symbolic_convert as symbolic_convert

    from remat_dsl.capture import fx
    from remat_dsl.capture.model_file import load_model_file
    from remat_dsl.capture.pipeline import capture_graph

    assert symbolic_convert.get_funcname is funcname_cache.get_funcname  # what the capture replaces
    with fx._torch_logs_silenced():
        assert symbolic_convert.get_funcname(fx.__file__, 1) is None
    assert symbolic_convert.get_funcname is funcname_cache.get_funcname
    funcname_cache.clearcache()
    capture_graph(load_model_file(str(ROOT / "tests" / "models" / "hf_llama.py")), measure_time=False)
    assert funcname_cache.cache == {}
    assert symbolic_convert.get_funcname is funcname_cache.get_funcname
