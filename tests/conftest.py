"""Suite-wide settings: the longest test files run first; two long cases whose checks other
models' cases make too are left to `pytest -m slow` (SLOW_CASES); every test has its own
empty cache.

`make test` runs two xdist workers with `--dist loadfile`, which hands out whole files in
collection order.  A long file collected last leaves one worker alone at the end, so the
files measured longest (about 5-12 minutes each, `pytest --durations`) are collected
first; the rest keep their alphabetical order.

`remat plan` keeps measured op times and block solutions in a cache directory (NOTE:
[Solution cache] in remat_dsl/plan/cache.py).  Each test gets an empty one of its own
(REMAT_CACHE_DIR, inherited by the commands it runs), and fixtures shared by several
tests run without one (REMAT_CACHE_DIR=off), so that no test depends on what another
measured, and nothing is written to the user's ~/.cache.  The plan parser's tables, which
depend on the grammar alone, are shared by every test (`parser_tables`).
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


# Cases left to `pytest -m slow`: long, and what they check is checked in `make test` on
# another model.  Both pay `smallest_budget("rockmate")` on examples/transformer.py (96-180 s
# on this 2-core machine, almost all HiGHS on the 72 block ILPs of the fallback over rotor's
# blocks, NOTE: [Two partitions]), whichever of them runs first in the module's Planner.
# GPT-2's case of the bound, and GPT-2's, the ResNet's and the U-Net's smallest-budget
# Rockmate plans (test_milp_solvers_cnn.py) stay.
SLOW_CASES = {
    "test_milp_solvers.py::test_plan_trains_identically_within_budget[examples/transformer.py-min-rockmate]",
    "test_milp_solvers.py::test_peak_lower_bound_is_below_the_smallest_plans[examples/transformer.py]",
}


@pytest.hookimpl(tryfirst=True)  # before `-m` deselects: the marker must be there by then
def pytest_collection_modifyitems(session, config, items):
    for item in items:
        if f"{item.path.name}::{item.name}" in SLOW_CASES:
            item.add_marker(pytest.mark.slow)

    def rank(item) -> int:
        name = item.path.name
        return LONGEST_FIRST.index(name) if name in LONGEST_FIRST else len(LONGEST_FIRST)

    items.sort(key=rank)  # stable: the order inside a file is kept


@pytest.fixture(scope="session")
def parser_tables(tmp_path_factory):
    """One `parsers` directory for the whole session (NOTE: [Parser tables] in
    remat_dsl/plan/parser.py): the plan grammar's LALR tables depend on the grammar alone,
    and building them costs each command that reads a plan 1.6 s."""
    return tmp_path_factory.mktemp("parser-tables")


@pytest.fixture(autouse=True)
def own_cache(tmp_path_factory, monkeypatch, parser_tables):
    cache = tmp_path_factory.mktemp("remat-cache")
    (cache / "parsers").symlink_to(parser_tables, target_is_directory=True)
    monkeypatch.setenv("REMAT_CACHE_DIR", str(cache))
