"""The cache of measured op times and block solutions (NOTE: [Solution cache] in
remat_dsl/plan/cache.py; issue 13 part 6): reused across budgets and runs, byte-identical
plans from it, never a stale or foreign entry, off with --no-cache."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from remat_dsl.plan.cache import NO_CACHE, Cache, default_cache

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
    path.write_text('{"key": "%s", "value": 1}' % other)  # another key's entry under this name
    assert cache.get("profiles", key) is None
    assert list(tmp_path.rglob("*.tmp")) == []  # written by rename: no leftovers
    NO_CACHE.put("profiles", key, 1)
    assert NO_CACHE.get("profiles", key) is None


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
    first = plan(tmp_path, "700000", "a.plan")
    assert "from the cache" not in first and "solving block class" in first
    again = plan(tmp_path, "700000", "b.plan")
    assert "op times from the cache" in again and "(from the cache)" in again
    assert (tmp_path / "a.plan").read_bytes() == (tmp_path / "b.plan").read_bytes()
    other = plan(tmp_path, "760000", "c.plan")
    assert "op times from the cache" in other and "(from the cache)" in other
    fresh = plan(tmp_path, "700000", "d.plan", "--no-cache")
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

    assert "op times from the cache" not in run("1", "a.plan")
    assert "op times from the cache" in run("1", "b.plan")
    assert (tmp_path / "a.plan").read_bytes() == (tmp_path / "b.plan").read_bytes()
    assert "op times from the cache" not in run("2", "c.plan")


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
