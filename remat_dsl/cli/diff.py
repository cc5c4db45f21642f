"""`remat diff OLD NEW`: a plan change's semantic summary, then its line diff."""

from __future__ import annotations

import os


def register(subparsers) -> None:
    diff = subparsers.add_parser("diff", help="semantic summary and line diff of two plans")
    diff.add_argument("old", help="the plan before (/dev/null: none)")
    diff.add_argument("new", help="the plan after (/dev/null: none)")
    diff.add_argument(
        "--exit-code", action="store_true", help="exit 1 when the canonical texts differ (the solve time aside)"
    )
    diff.set_defaults(run=run)


def run(args) -> int:
    """0 (or 1 with --exit-code when they differ, solve time aside); invalid plans raise."""
    from remat_dsl.plan.files import check_input
    from remat_dsl.review.diff import compared_text, load_side, render

    for path in (args.old, args.new):  # both refused before either is parsed (NOTE: [Bounded inputs])
        if path != os.devnull:
            check_input(path, "plan")
    old, new = load_side(args.old), load_side(args.new)
    args.out.write(render(old, new))
    return 1 if args.exit_code and compared_text(old) != compared_text(new) else 0
