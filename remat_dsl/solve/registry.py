"""Every solver `remat plan --solver NAME` knows: one line each, and outside solvers.

Adding a solver: write a module with a subclass of remat_dsl.solve.api.Solver (`name`,
`__init__(problem)`, `solve`, `floor`, `info`; the other members have defaults there:
`auto_rank`, `describe`, `fits`, `fallbacks`, `floor_targets`, `optimizes`,
`cheap_targets`, `Config`), and add one line here (docs/solvers.md, "Adding a
solver").  Entries are `module:Class` strings, imported when a solver is asked for, so
listing the solvers imports none of them (no pulp, no numpy).

NOTE: [Outside solvers]
`remat plan --solver path/to/file.py:Class` or `--solver package.module:Class` plans with
a class that is not registered here (`outside_solver`): the user's code, run because the
user typed its name on the command line.  A plan's header records the solver by its
`name` only, as text: nothing that reads a plan (check, codegen, diff, show, `--from`,
remat_dsl.workflow's read_plan and check_plan) resolves that text to a solver, so a plan
file never makes remat import anything.  The Python API takes the class itself.
"""

from __future__ import annotations

import importlib
import importlib.util
import re
import sys
from pathlib import Path

from remat_dsl.plan.errors import RematError

SOLVERS = {
    "autograd": "remat_dsl.solve.solvers.autograd:Autograd",
    "checkpoint-sqrt": "remat_dsl.solve.solvers.chain.sqrt:CheckpointSqrt",
    "rotor": "remat_dsl.solve.solvers.chain.rotor:Rotor",
    "rockmate": "remat_dsl.solve.solvers.ilp.rockmate:Rockmate",
    "hiremate": "remat_dsl.solve.solvers.ilp.hiremate:Hiremate",
    "checkmate": "remat_dsl.solve.solvers.ilp.checkmate:Checkmate",
    "twremat": "remat_dsl.solve.solvers.twremat:TWRemat",
    "moccasin": "remat_dsl.solve.solvers.moccasin:Moccasin",
    "offmate": "remat_dsl.solve.solvers.ilp.offmate:Offmate",
}
NAMES = ("auto", *SOLVERS)  # `auto` picks one of the others (remat_dsl.solve.solvers.auto)
OUTSIDE_NAME = re.compile(r"[A-Za-z][A-Za-z0-9_.+-]*")  # an outside solver's `name`, as the header shows it


def solver_class(name: str):
    """The class registered as `name`, a subclass of remat_dsl.solve.api.Solver.  Raises
    KeyError for an unknown name, TypeError for a class that does not subclass Solver."""
    from remat_dsl.solve.api import Solver

    module, _, attribute = SOLVERS[name].partition(":")
    cls = getattr(importlib.import_module(module), attribute)
    if not (isinstance(cls, type) and issubclass(cls, Solver)):
        raise TypeError(f"solver '{name}' ({SOLVERS[name]}) does not subclass remat_dsl.solve.api.Solver")
    return cls


def is_outside_spec(text: str) -> bool:
    """Whether `--solver text` names an outside solver (`FILE.py:Class`, `package.module:Class`)."""
    return text not in NAMES and ":" in text


def unknown_solver(text: str) -> RematError:
    """The error for a `--solver` that is neither registered nor an outside solver's spec."""
    return RematError(
        f"error: unknown solver '{text}'",
        hint=f"choose one of: {', '.join(NAMES)}; or an outside solver: path/to/file.py:Class or package.module:Class",
    )


def outside_solver(spec: str):
    """NOTE: [Outside solvers]: the class `spec` names (`path/to/file.py:Class` or
    `package.module:Class`), imported, a subclass of remat_dsl.solve.api.Solver whose
    `name` is a plain word no registered solver has.  Raises RematError (exit status 2)
    when the file or module is missing or fails to import, the class is missing, or it
    breaks those rules."""
    from remat_dsl.solve.api import Solver

    where, _, attribute = spec.rpartition(":")
    if not where or not attribute.isidentifier():
        raise unknown_solver(spec)
    module = _file_module(where, spec) if where.endswith(".py") or "/" in where else _named_module(where, spec)
    cls = getattr(module, attribute, None)
    if cls is None:
        raise RematError(
            f"error: solver {spec}: {where} defines no '{attribute}'", hint="name the solver class after the colon"
        )
    if not (isinstance(cls, type) and issubclass(cls, Solver)):
        raise RematError(
            f"error: solver {spec}: {attribute} is not a subclass of remat_dsl.solve.api.Solver",
            hint="write `class MySolver(Solver)` with `from remat_dsl.solve.api import Solver` (docs/solvers.md)",
        )
    name = getattr(cls, "name", None)  # Solver only annotates it
    if not isinstance(name, str) or not OUTSIDE_NAME.fullmatch(name) or name in NAMES:
        raise RematError(
            f"error: solver {spec}: its `name` is {name!r}",
            hint="set `name` to a word of letters, digits, _ . + - that no registered solver has "
            f"({', '.join(NAMES)}): the plan header records it",
        )
    return cls


def _file_module(path: str, spec: str):
    """The module of the Python file `path`, run once (kept in sys.modules under a name
    of its own, so that its dataclasses and pickles find it)."""
    file = Path(path)
    if not file.is_file():
        raise RematError(f"error: solver {spec}: file {path} not found", hint="pass path/to/file.py:Class")
    name = f"remat_outside_solver_{re.sub(r'[^A-Za-z0-9_]', '_', str(file.resolve()))}"
    if name in sys.modules:
        return sys.modules[name]
    spec_of_file = importlib.util.spec_from_file_location(name, file)
    if spec_of_file is None or spec_of_file.loader is None:
        raise RematError(f"error: solver {spec}: {path} is not a Python file", hint="pass path/to/file.py:Class")
    module = importlib.util.module_from_spec(spec_of_file)
    sys.modules[name] = module
    try:
        spec_of_file.loader.exec_module(module)
    except Exception as error:
        del sys.modules[name]
        raise RematError(f"error: solver {spec}: importing {path} failed: {type(error).__name__}: {error}") from None
    return module


def _named_module(name: str, spec: str):
    """The module `name` (dotted), imported from sys.path (PYTHONPATH)."""
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as error:
        if error.name and name.startswith(error.name):
            raise RematError(
                f"error: solver {spec}: no module named '{name}'",
                hint="put its folder on PYTHONPATH, or pass path/to/file.py:Class",
            ) from None
        raise RematError(f"error: solver {spec}: importing {name} failed: {error}") from None
    except Exception as error:
        raise RematError(f"error: solver {spec}: importing {name} failed: {type(error).__name__}: {error}") from None
