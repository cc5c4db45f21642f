"""`--solver auto`: the first solver of the registry that suits the graph.

Each registered solver may declare `auto_rank` (the order in which auto asks, smallest
first; None: never) and `fits(problem)` (without it: any graph).  Today: offmate when the
plan has a host link (`--bandwidth`, or a `--device` with one) and the graph is a chain of
small blocks (it keeps Rockmate's plan when that predicts less time); else checkmate for
graphs of at most 60 ops (one exact ILP), rockmate for a chain of small blocks (GPT-2,
ResNet), hiremate for the rest (skip tensors: encoder-decoders, U-Nets).  The plan header
says `auto: NAME ...`.
"""

from __future__ import annotations

from remat_dsl.solve.api import Problem
from remat_dsl.solve.registry import SOLVERS, solver_class


def choose(problem: Problem) -> str:
    """The name of the solver `auto` runs for `problem`."""
    ranked = []
    for name in SOLVERS:
        cls = solver_class(name)
        if cls.auto_rank is not None:
            ranked.append((cls.auto_rank, name, cls))
    for _, name, cls in sorted(ranked):
        if cls.fits(problem):  # Solver.fits: any graph unless the solver says otherwise
            return name
    raise LookupError("no registered solver fits this graph (one should declare fits() -> True)")
