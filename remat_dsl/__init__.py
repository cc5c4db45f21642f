"""remat-dsl: readable rematerialization and offload plans for PyTorch training.

Capture a model's forward and backward graph, solve for a memory budget, print the plan as
text people can read, edit and review, check it, and generate a standalone module that
runs it with the same gradients as eager PyTorch.

The Python API (remat_dsl.workflow): `plan_model`, `capture_model`, `solve_captured`,
`plan_text`, `read_plan`, `check_plan`, `generate_module`, `load_module`, `fast_model`, `model_of`;
errors `RematError`, `PlanError`, `BudgetError`.  They are imported on first use, so that
`import remat_dsl` (and the `remat` command's start) does not import torch.
"""

__version__ = "0.1.0"

_API = {
    "plan_model": "remat_dsl.workflow",
    "capture_model": "remat_dsl.workflow",
    "solve_captured": "remat_dsl.workflow",
    "plan_text": "remat_dsl.workflow",
    "read_plan": "remat_dsl.workflow",
    "check_plan": "remat_dsl.workflow",
    "generate_module": "remat_dsl.workflow",
    "load_module": "remat_dsl.workflow",
    "fast_model": "remat_dsl.workflow",
    "model_of": "remat_dsl.workflow",
    "RematError": "remat_dsl.plan.errors",
    "PlanError": "remat_dsl.plan.errors",
    "BudgetError": "remat_dsl.solve.api",
}
__all__ = sorted(_API)


def __getattr__(name: str):
    if name not in _API:
        raise AttributeError(f"module 'remat_dsl' has no attribute '{name}'")
    import importlib

    return getattr(importlib.import_module(_API[name]), name)


def __dir__():
    return sorted([*globals(), *_API])
