"""The layout is a map of the pipeline: one folder per stage, arrows pointing down only.

Every import of a remat_dsl module by another (at module level or inside a function) is
an arrow.  Folders are stages on floors (docs/architecture.md): a module imports its own
folder or a lower floor, never a higher one, and no chain of imports comes back to where
it started.  Code generation stays light: importing it loads no solver, no MILP library
and no torch.
"""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

import networkx as nx
import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "remat_dsl"
FLOORS = {"plan": 0, "capture": 1, "check": 1, "solve": 2, "codegen": 2, "review": 2, "workflow": 3, "cli": 4}


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports(path: Path) -> set[str]:
    """Every remat_dsl module `path` imports, anywhere in it."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.startswith("remat_dsl")}
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("remat_dsl"):
            found.add(node.module)
            found |= {
                f"{node.module}.{a.name}"
                for a in node.names
                if (PACKAGE / Path(*node.module.split(".")[1:]) / f"{a.name}.py").exists()
            }
    return found


def graph() -> nx.DiGraph:
    modules = {module_name(p): p for p in PACKAGE.rglob("*.py")}
    g = nx.DiGraph()
    g.add_nodes_from(modules)
    for name, path in modules.items():
        for target in imports(path):
            if target in modules and target != name:
                g.add_edge(name, target)
    return g


def stage(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 and parts[1] in FLOORS else None


def test_every_module_is_in_a_stage_folder():
    loose = [m for m in graph() if stage(m) is None and m not in ("remat_dsl", "remat_dsl.__main__")]
    assert loose == [], "modules outside the stage folders"
    assert {p.name for p in PACKAGE.iterdir() if p.is_dir() and p.name != "__pycache__"} == set(FLOORS)


def test_no_arrow_points_up():
    up = []
    for a, b in graph().edges:
        sa, sb = stage(a), stage(b)
        if sa and sb and sa != sb and FLOORS[sb] >= FLOORS[sa]:
            up.append(f"{a} -> {b}")
    assert up == []


def test_no_import_circle():
    cycles = list(nx.simple_cycles(graph()))
    assert cycles == []


def test_code_generation_loads_no_solver_no_milp_and_no_torch():
    probe = (
        "import sys, remat_dsl.codegen.generate; print(sorted(m for m in sys.modules if m.split('.')[0] in ('torch',"
        " 'pulp', 'highspy', 'networkx', 'numpy') or m.startswith('remat_dsl.solve')))"
    )
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, cwd=ROOT)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"


@pytest.mark.parametrize("module", ["remat_dsl.cli", "remat_dsl.plan.parser", "remat_dsl.check.verify"])
def test_the_command_line_and_the_plan_language_load_no_solver(module):
    probe = (
        f"import sys, {module}; print(sorted(m for m in sys.modules if m.split('.')[0] in ('pulp', 'highspy') or"
        " m.startswith('remat_dsl.solve')))"
    )
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, cwd=ROOT)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"


# The arrows between stages docs/architecture.md draws, besides `cli` importing every stage
# and every stage importing `plan`.
DRAWN = {("solve", "check"), ("review", "check"), ("codegen", "capture")}
DRAWN |= {("workflow", s) for s in ("capture", "check", "solve", "codegen")}  # the Python API composes them


def test_the_stage_arrows_are_the_ones_drawn():
    arrows = {(stage(a), stage(b)) for a, b in graph().edges if stage(a) and stage(b) and stage(a) != stage(b)}
    expected = DRAWN | {("cli", s) for s in FLOORS if s != "cli"} | {(s, "plan") for s in FLOORS if s != "plan"}
    assert arrows == expected
    text = (ROOT / "docs" / "architecture.md").read_text()
    assert all(f"**{name}/**" in text for name in FLOORS), "a paragraph per stage"


def layout_modules() -> set[str]:
    """The modules the Layout section of docs/architecture.md lists, as paths under remat_dsl/."""
    text = (ROOT / "docs" / "architecture.md").read_text()
    section = text[text.index("## Layout\n") :]
    block = re.search(r"^```\n(.*?)^```$", section, re.M | re.S).group(1)
    found, stage_name, sub, folder = set(), None, None, None
    for line in block.splitlines():
        indent = len(line) - len(line.lstrip())
        head = re.match(r" *(\w+)/(?=\s|$)", line)
        if head and indent == 0:
            stage_name = folder = None  # remat_dsl/, grammar/, templates/
        elif head and indent == 2:
            stage_name = folder = head.group(1)
        elif head and indent == 4:
            sub = folder = f"{stage_name}/{head.group(1)}"
        elif head and indent == 6:
            folder = f"{sub}/{head.group(1)}"  # a folder inside a stage's folder
        elif indent == 4:
            folder = stage_name  # a module line of the stage
        elif indent == 6:
            folder = sub  # a module line of a stage's folder
        names = re.findall(r"(?<![\w/])(\w+)\.py(?![\w.])", line)
        found |= {f"{folder}/{name}.py" for name in names if folder}
    return found


def test_the_documented_layout_lists_every_module():
    modules = {str(p.relative_to(PACKAGE)) for p in PACKAGE.rglob("*.py") if p.parent != PACKAGE}
    expected = {m for m in modules if not m.endswith("__init__.py")} | {"cli/__init__.py", "workflow/__init__.py"}
    assert layout_modules() == expected


INFRASTRUCTURE = ("api", "registry", "driver", "lowering", "polish")


def test_the_solve_infrastructure_imports_no_solver_but_autos_choice():
    """solve/ holds the machinery every solver shares, solve/solvers/ the solvers: the
    machinery names a solver only through the registry's strings, the driver asks
    `auto` which one to run, and `plan_step` places parameters and states with the
    placement LP (no registry solver: it plans no activations)."""
    imported = {
        (a, b)
        for a, b in graph().edges
        if a in {f"remat_dsl.solve.{m}" for m in INFRASTRUCTURE} and b.startswith("remat_dsl.solve.solvers")
    }
    assert imported == {
        ("remat_dsl.solve.driver", "remat_dsl.solve.solvers.auto"),
        ("remat_dsl.solve.driver", "remat_dsl.solve.solvers.ilp.placement"),
    }
    assert {p.stem for p in (PACKAGE / "solve").glob("*.py")} == {"__init__", *INFRASTRUCTURE}
