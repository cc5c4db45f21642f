"""Suite-wide settings: the longest test files run first; every test has its own empty cache.

`make test` runs two xdist workers with `--dist loadfile`, which hands out whole files in
collection order.  A long file collected last leaves one worker alone at the end, so the
files measured longest (about 5-12 minutes each, `pytest --durations`) are collected
first; the rest keep their alphabetical order.

`remat plan` keeps measured op times and block solutions in a cache directory (NOTE:
[Solution cache] in remat_dsl/plan/cache.py).  Each test gets an empty one of its own
(REMAT_CACHE_DIR, inherited by the commands it runs), and fixtures shared by several
tests run without one (REMAT_CACHE_DIR=off), so that no test depends on what another
measured, and nothing is written to the user's ~/.cache.
"""

from __future__ import annotations

import os

import pytest

os.environ["REMAT_CACHE_DIR"] = "off"  # module and session fixtures: no cache

LONGEST_FIRST = (
    "test_milp_solvers.py",
    "test_milp_solvers_cnn.py",
    "test_end_to_end.py",
    "test_readme.py",
    "test_shell_pipeline.py",
    "test_bad_invocations.py",
    "test_stock_models.py",
    "test_fake_capture.py",
)


def pytest_collection_modifyitems(session, config, items):
    def rank(item) -> int:
        name = item.path.name
        return LONGEST_FIRST.index(name) if name in LONGEST_FIRST else len(LONGEST_FIRST)

    items.sort(key=rank)  # stable: the order inside a file is kept


@pytest.fixture(autouse=True)
def own_cache(tmp_path_factory, monkeypatch):
    monkeypatch.setenv("REMAT_CACHE_DIR", str(tmp_path_factory.mktemp("remat-cache")))
