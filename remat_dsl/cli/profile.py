"""`remat profile MODEL -o FILE [--repeats N]`: measure every operation once, write the costs."""

from __future__ import annotations

from remat_dsl.cli.console import Progress, check_writable, positive_int, report_noisy_timing, status, write_atomically


def register(subparsers) -> None:
    profile = subparsers.add_parser(
        "profile", help="measure every operation of a model and write the costs as a text file"
    )
    profile.add_argument("model", help="model file, optionally path.py:factory")
    profile.add_argument("-o", "--output", required=True, help="the profile file to write (e.g. model.profile)")
    profile.add_argument(
        "--force",
        action="store_true",
        help="replace the output even when it is the model file or a file that is not a profile remat wrote",
    )
    profile.add_argument(
        "--repeats",
        type=positive_int,
        default=5,
        help="timed runs per operation, split over two timing passes; the least counts (default 5)",
    )
    profile.set_defaults(run=run)


def run(args) -> int:
    from remat_dsl.capture.model_file import load_model_file
    from remat_dsl.capture.pipeline import capture_graph
    from remat_dsl.capture.profile_file import write_profile
    from remat_dsl.plan.units import format_duration

    from remat_dsl.capture.model_file import split_spec

    inputs = ((split_spec(args.model)[0], "model file"),)
    output = check_writable(args.output, "profile", inputs=inputs, force=args.force)
    model_file = load_model_file(args.model)
    with Progress(f"profiling {model_file.spec}") as progress:
        captured = capture_graph(model_file, args.repeats, progress)
    report_noisy_timing(captured)
    write_atomically(output, write_profile(captured.graph, model=model_file.spec, device=captured.device))
    total = sum(op.time_us for op in captured.graph.ops)
    status(f"wrote {args.output}: {len(captured.graph.ops)} ops, {format_duration(total)} in all")
    return 0
