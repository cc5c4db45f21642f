"""Stage solve: a budget-fitting order of operations from one solver interface, and its lowering."""
