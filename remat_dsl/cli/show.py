"""`remat show PLAN [--png FILE]`: a plan's memory timeline."""

from __future__ import annotations

from remat_dsl.cli.console import check_writable, status, write_atomically


def register(subparsers) -> None:
    show = subparsers.add_parser("show", help="draw a plan's memory timeline (terminal chart, or a PNG with --png)")
    show.add_argument("plan")
    show.add_argument("--png", metavar="FILE", help="write the timeline as a PNG image instead of printing a chart")
    show.add_argument(
        "--force",
        action="store_true",
        help="with --png: replace the file even when it is the plan or not a picture remat drew",
    )
    show.add_argument("--buckets", type=int, default=60, help="columns of the terminal chart (default 60)")
    show.set_defaults(run=run)


def run(args) -> int:
    from remat_dsl.check.verify import load_checked
    from remat_dsl.review.show import draw_png, terminal_view

    if args.png:
        check_writable(args.png, "picture", inputs=((args.plan, "plan"),), force=args.force)
    verified = load_checked(args.plan, within_budget=False)
    if args.png:
        write_atomically(args.png, draw_png(verified))
        status(f"wrote {args.png}")
    else:
        args.out.write(terminal_view(verified, buckets=max(1, args.buckets)) + "\n")
    return 0
