"""remat-dsl: readable rematerialization and offload plans for PyTorch training.

Capture a model's forward and backward graph, solve for a memory budget, print the plan as
text people can read, edit and review, check it, and generate a standalone module that
runs it with the same gradients as eager PyTorch.
"""

__version__ = "0.1.0"
