"""Files remat-dsl ships beside its code: the plan grammar and the code-generation template.

They live at the top level of the repository (grammar/, templates/) so that the layout
shows them; a wheel carries them inside the package (remat_dsl/grammar, remat_dsl/templates,
see `package-dir` in pyproject.toml), so `pip install .` works without the repository.
"""

from __future__ import annotations

from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent  # remat_dsl/


def data_path(*parts: str) -> Path:
    """The shipped file or folder `parts` (e.g. `grammar`, `plan.lark`): inside the installed
    package when it is there, else at the top of the repository checkout."""
    installed = PACKAGE.joinpath(*parts)
    return installed if installed.exists() else PACKAGE.parent.joinpath(*parts)
