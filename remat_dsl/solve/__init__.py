"""Stage solve: a budget-fitting order of operations from one solver interface, and its lowering.

The infrastructure sits here (api: the solver contract; registry; driver: budgets, fallbacks
and repair; lowering: an order to plan instructions; polish); the solvers sit in solvers/.
"""
