"""NOTE: the solver contract (remat_dsl.solve.api.Solver): every registered solver subclasses
it, the driver and `auto` read its members directly (no probing), and a class that does not
subclass it is refused by name."""

from __future__ import annotations

import pytest

from remat_dsl.solve import registry
from remat_dsl.solve.api import FLOOR_SWEEP, Solver, floor_targets


@pytest.mark.parametrize("name", sorted(registry.SOLVERS))
def test_every_registered_solver_subclasses_the_contract(name):
    cls = registry.solver_class(name)
    assert issubclass(cls, Solver) and cls.name == name
    for member in (
        "auto_rank",
        "optimizes",
        "cheap_targets",
        "fits",
        "fallbacks",
        "floor_targets",
        "describe",
        "solve",
        "floor",
    ):
        assert hasattr(cls, member), member


def test_a_class_outside_the_contract_is_refused(monkeypatch):
    monkeypatch.setitem(registry.SOLVERS, "plain", "collections:OrderedDict")
    with pytest.raises(
        TypeError, match=r"solver 'plain' \(collections:OrderedDict\) does not subclass remat_dsl.solve.api.Solver"
    ):
        registry.solver_class("plain")


def test_the_defaults():
    class Fixed(Solver):
        name = "fixed"

        def floor(self) -> int:
            return 1000

    solver = Fixed()
    assert Fixed.auto_rank is None and not Fixed.optimizes and not Fixed.cheap_targets
    assert Fixed.fits(None) and list(solver.fallbacks()) == [] and solver.describe() == ""
    assert floor_targets(solver) == [int(-(-1000 * f // 1)) for f in FLOOR_SWEEP]
    with pytest.raises(NotImplementedError):
        solver.solve(1000)


@pytest.mark.parametrize("name", sorted(registry.SOLVERS))
def test_every_solver_config_is_frozen_documented_and_listed_in_the_docs(name):
    """Each solver's tuning constants: a frozen dataclass whose fields all have a default
    and a one-line meaning, printed by `remat plan --help-solver` and listed in
    docs/solvers.md."""
    import dataclasses
    from pathlib import Path

    from remat_dsl.solve.api import config_help

    cls = registry.solver_class(name)
    config = cls.Config()
    assert dataclasses.is_dataclass(config) and cls.Config.__dataclass_params__.frozen
    assert cls.Config.__doc__ and not cls.Config.__doc__.startswith(cls.Config.__name__ + "(")
    docs = (Path(__file__).resolve().parent.parent / "docs" / "solvers.md").read_text()
    text = config_help(cls)
    for field in dataclasses.fields(config):
        assert field.metadata.get("help"), field.name
        assert f"{field.name} = {field.default!r}" in text
        assert f"`{field.name}`" in docs, f"docs/solvers.md does not list {name}'s {field.name}"


def test_the_helpers_defaults_are_the_configs():
    """The block partition and H-Partition sit below the solvers that hold their settings,
    so their keyword defaults are written twice: they must agree with the Configs'."""
    import inspect

    from remat_dsl.solve.solvers.chain.partition import partition
    from remat_dsl.solve.solvers.chain.rotor import ChainConfig
    from remat_dsl.solve.solvers.ilp.hiremate import HiremateConfig
    from remat_dsl.solve.solvers.ilp.hpartition import h_partition
    from remat_dsl.solve.solvers.ilp.rockmate import RockmateConfig

    part = inspect.signature(partition).parameters
    assert part["max_blocks"].default == ChainConfig.max_blocks == RockmateConfig.max_blocks
    assert part["min_block_ops"].default == RockmateConfig.min_block_ops
    h = inspect.signature(h_partition).parameters
    assert h["max_size"].default == HiremateConfig.max_children
    assert (h["alpha"].default, h["stuck_ratio"].default) == (HiremateConfig.alpha, HiremateConfig.stuck_ratio)


def test_unknown_and_outside_names():
    from remat_dsl.plan.errors import RematError

    assert not registry.is_outside_spec("rotor") and registry.is_outside_spec("my.py:Mine")
    with pytest.raises(RematError, match="is not a subclass of remat_dsl.solve.api.Solver"):
        registry.outside_solver("collections:OrderedDict")
    with pytest.raises(RematError, match="its `name` is 'rotor'"):
        registry.outside_solver("remat_dsl.solve.solvers.chain.rotor:Rotor")  # a registered name: the header would lie
