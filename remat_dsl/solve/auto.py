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
        rank = getattr(cls, "auto_rank", None)
        if rank is not None:
            ranked.append((rank, name, cls))
    for _, name, cls in sorted(ranked):
        fits = getattr(cls, "fits", None)
        if fits is None or fits(problem):  # no `fits`: any graph
            return name
    raise LookupError("no registered solver fits this graph (one should declare fits() -> True)")
