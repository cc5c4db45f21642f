"""What the plan language assumes of aten operators.

A call written inside another operation's arguments (`aten.t.default(%w)`) allocates
nothing: it is a view of its arguments, inlined by code generation where it is used
(remat_dsl.plan.ir, `Call`).  An operator is a view when its schema says every output
aliases an input without writing it, or when it is one of VIEW_EXTRA, whose schemas do
not say so though they return their input's storage.
"""

from __future__ import annotations

VIEW_EXTRA = frozenset({"aten._unsafe_view.default", "aten.alias.default", "aten.detach.default"})


def is_view(overload) -> bool:
    """Whether the torch OpOverload `overload` returns views of its inputs only."""
    if str(overload) in VIEW_EXTRA:
        return True
    returns = overload._schema.returns
    return bool(returns) and all(r.alias_info is not None and not r.alias_info.is_write for r in returns)
