"""git's diff drivers for plan files: `remat git-diff` (diff.remat.command) and
`remat textconv` (diff.remat.textconv); see docs/reviewing.md, "In git".

In these two modes a file that does not parse is shown as its raw text with a note
instead of failing, since git stops on a failing driver.
"""

from __future__ import annotations

import os


def register(subparsers) -> None:
    git = subparsers.add_parser(
        "git-diff", help="git's external diff driver (diff.remat.command); GIT_EXTERNAL_DIFF arguments"
    )
    git.add_argument("path", help="the path in the repository")
    git.add_argument(
        "rest", nargs="*", help="old-file old-hex old-mode new-file new-hex new-mode [new-path rename-info]"
    )
    git.set_defaults(run=run_git_diff)
    conv = subparsers.add_parser("textconv", help="a plan's summary header and canonical text (diff.remat.textconv)")
    conv.add_argument("file")
    conv.set_defaults(run=run_textconv)


def run_git_diff(args) -> int:
    """GIT_EXTERNAL_DIFF: `PATH OLD-FILE OLD-HEX OLD-MODE NEW-FILE NEW-HEX NEW-MODE [NEW-PATH INFO]`."""
    from remat_dsl.review.diff import load_side, render

    if len(args.rest) < 6:  # git passes the path alone for an unmerged file
        args.out.write(f"* Unmerged path {args.path}\n")
        return 0
    old_file, old_hex, _, new_file, new_hex, _ = args.rest[:6]
    new_path = args.rest[6] if len(args.rest) > 6 else args.path
    old = load_side(old_file, "/dev/null" if old_file == os.devnull else f"a/{args.path}", lenient=True)
    new = load_side(new_file, "/dev/null" if new_file == os.devnull else f"b/{new_path}", lenient=True)
    args.out.write(f"diff --remat a/{args.path} b/{new_path}\n")
    args.out.write(f"index {old_hex[:7]}..{new_hex[:7]}\n")
    args.out.write(render(old, new))
    return 0


def run_textconv(args) -> int:
    """The summary header and canonical text on stdout (the raw text if invalid)."""
    from remat_dsl.review.diff import load_side, textconv

    args.out.write(textconv(load_side(args.file, lenient=True)))
    return 0
