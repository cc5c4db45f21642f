"""`remat fmt [--check] FILE...`: rewrite plan files in place in the canonical layout."""

from __future__ import annotations

from pathlib import Path

from remat_dsl.cli.console import status, write_atomically

EXIT_WOULD_CHANGE = 1


def register(subparsers) -> None:
    fmt = subparsers.add_parser(
        "fmt",
        help="rewrite plan files IN PLACE in the canonical layout (comments kept); --check changes nothing",
        description="Rewrite each plan file in place in the canonical layout of `remat plan` (comments kept). "
        "Every file is read and checked before any is written; with --check nothing is written.  A symbolic link's "
        "target is rewritten (keeping its permissions) and the link stays a link.",
    )
    fmt.add_argument("files", nargs="+", metavar="FILE", help="plan files to rewrite in place")
    fmt.add_argument(
        "--check", action="store_true", help="change nothing; list the files that would change and exit 1 if any"
    )
    fmt.set_defaults(run=run)


def run(args) -> int:
    """0 when done (or nothing to change), EXIT_WOULD_CHANGE for --check with changes."""
    from remat_dsl.review.fmt import formatted

    files = formatted(args.files)
    changed = [(path, new) for path, old, new in files if new != old]
    if args.check:
        for path, _ in changed:
            args.out.write(f"{path}\n")
        if changed:
            status(f"{len(changed)} of {len(files)} plan file(s) would be rewritten by `remat fmt`")
        return EXIT_WOULD_CHANGE if changed else 0
    for path, new in changed:
        write_atomically(Path(path), new)
        status(f"rewrote {path} in place")
    status(
        f"{len(changed)} of {len(files)} plan file(s) rewritten in place"
        + ("" if changed else ": all were canonical already")
    )
    return 0
