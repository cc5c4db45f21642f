"""test_milp_solvers.py's end-to-end tests on the CNN examples (ResNet, U-Net with skips).

A file of its own so that `make test`'s two workers (`--dist loadfile`) share the MILP
solvers' end-to-end runs, the longest of the suite.
"""

from __future__ import annotations

import pytest

from test_milp_solvers import (  # noqa: F401  (collected here, with this file's `example`)
    planned_example,
    test_auto_picks_by_structure,
    test_plan_trains_identically_within_budget,
)

EXAMPLES = ["examples/resnet.py", "examples/unet.py"]


@pytest.fixture(scope="module", params=EXAMPLES)
def example(request):
    return planned_example(request.param)
