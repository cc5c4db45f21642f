"""Every solver `remat plan --solver NAME` knows: one line each.

Adding a solver: write a module with a class that follows remat_dsl.solve.api (`name`,
`auto_rank`, `__init__(problem)`, `describe`, `solve`, `floor`, `info`; optionally
`fallbacks`, `fits` and `optimizes`), and add one line here (docs/solvers.md, "Adding a
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
    """The class registered as `name`.  Raises KeyError for an unknown name."""
    module, _, attribute = SOLVERS[name].partition(":")
    return getattr(importlib.import_module(module), attribute)
