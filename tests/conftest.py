"""Suite-wide settings: the longest test files run first.

`make test` runs two xdist workers with `--dist loadfile`, which hands out whole files in
collection order.  A long file collected last leaves one worker alone at the end, so the
files measured longest (about 5-12 minutes each, `pytest --durations`) are collected
first; the rest keep their alphabetical order.
"""

from __future__ import annotations

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
