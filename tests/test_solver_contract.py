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
