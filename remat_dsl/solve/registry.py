"""Every solver `remat plan --solver NAME` knows: one line each.

Adding a solver: write a module with a subclass of remat_dsl.solve.api.Solver (`name`,
`__init__(problem)`, `solve`, `floor`, `info`; the other members have defaults there:
`auto_rank`, `describe`, `fits`, `fallbacks`, `floor_targets`, `optimizes`,
`cheap_targets`), and add one line here (docs/solvers.md, "Adding a
solver").  Entries are `module:Class` strings, imported when a solver is asked for, so
listing the solvers imports none of them (no pulp, no numpy).
"""

from __future__ import annotations

import importlib

SOLVERS = {
    "autograd": "remat_dsl.solve.autograd:Autograd",
    "checkpoint-sqrt": "remat_dsl.solve.chain.sqrt:CheckpointSqrt",
    "rotor": "remat_dsl.solve.chain.rotor:Rotor",
    "rockmate": "remat_dsl.solve.ilp.rockmate:Rockmate",
    "hiremate": "remat_dsl.solve.ilp.hiremate:Hiremate",
    "checkmate": "remat_dsl.solve.ilp.checkmate:Checkmate",
    "twremat": "remat_dsl.solve.twremat:TWRemat",
    "moccasin": "remat_dsl.solve.moccasin:Moccasin",
    "offmate": "remat_dsl.solve.ilp.offmate:Offmate",
}
NAMES = ("auto", *SOLVERS)  # `auto` picks one of the others (remat_dsl.solve.auto)


def solver_class(name: str):
    """The class registered as `name`, a subclass of remat_dsl.solve.api.Solver.  Raises
    KeyError for an unknown name, TypeError for a class that does not subclass Solver."""
    from remat_dsl.solve.api import Solver

    module, _, attribute = SOLVERS[name].partition(":")
    cls = getattr(importlib.import_module(module), attribute)
    if not (isinstance(cls, type) and issubclass(cls, Solver)):
        raise TypeError(f"solver '{name}' ({SOLVERS[name]}) does not subclass remat_dsl.solve.api.Solver")
    return cls
