"""What every bench script shares: its section of docs/measurements.md, the machine it ran
on, interleaved timing, the checkpointing baseline and loading a plan's module.

Each script prints its figures and writes them, as they were printed, between its own
markers in docs/measurements.md:

    ## Title
    <!-- begin bench/NAME.py -->
    `python bench/NAME.py ARGS` on 2 cores (CPU model), no GPU, torch 2.13.0, 2026-11-29, load average 0.40.
    ...
    <!-- end bench/NAME.py -->

Only that section changes (the file is written to a temporary file and renamed over the
old one); a section whose markers are missing is added at the end, under its title.
`--no-write` prints without writing.  `make measurements` runs every script in turn.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import io
import os
import platform
import shlex
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "measurements.md"


# ---------------------------------------------------------------------------
# The section of docs/measurements.md
# ---------------------------------------------------------------------------


def markers(script: str) -> tuple[str, str]:
    """The begin and end lines of `script`'s section (script: `bench/NAME.py`)."""
    return f"<!-- begin {script} -->", f"<!-- end {script} -->"


def replace_section(text: str, script: str, title: str, body: str) -> str:
    """`text` (the whole doc) with the lines between `script`'s markers replaced by `body`;
    every other byte as it was.  Without markers the section is added at the end, under
    `## title`.  Raises ValueError when only one marker is there, or either twice."""
    begin, end = markers(script)
    body = body.rstrip("\n") + "\n"
    counts = (text.count(begin + "\n"), text.count(end + "\n") + text.endswith(end))
    if counts == (0, 0):
        return text.rstrip("\n") + f"\n\n## {title}\n\n{begin}\n{body}{end}\n"
    if counts != (1, 1):
        raise ValueError(
            f"{script}: expected one '{begin}' line and one '{end}' line, found {counts[0]} and {counts[1]}"
        )
    start = text.index(begin + "\n") + len(begin) + 1
    stop = text.index(end, start)
    return text[:start] + body + text[stop:]


def write_section(script: str, title: str, body: str, doc: Path = DOC) -> None:
    """Replace `script`'s section of `doc` by `body` (replace_section), atomically, as
    `remat` writes its outputs (remat_dsl.cli.console.write_atomically): a reader never
    sees half a file."""
    from remat_dsl.cli.console import write_atomically

    write_atomically(doc, replace_section(doc.read_text(), script, title, body))


def machine() -> str:
    """This machine in words: cores, CPU model, GPU (or none), torch version."""
    import torch

    model = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "no GPU"
    return f"{os.cpu_count()} cores ({model}), {gpu}, torch {torch.__version__}"


def command() -> str:
    """The command that runs this script as it was run, paths relative to the repository."""
    script = Path(sys.argv[0]).resolve()
    shown = script.relative_to(ROOT).as_posix() if script.is_relative_to(ROOT) else str(script)
    args = [Path(a).resolve().relative_to(ROOT).as_posix() if _inside(a) else a for a in sys.argv[1:]]
    return shlex.join(["python", shown, *args])


def _inside(arg: str) -> bool:
    """Whether `arg` is an absolute path inside the repository (shown relative to it)."""
    return arg.startswith("/") and Path(arg).resolve().is_relative_to(ROOT)


class Report:
    """What a bench script prints, kept to become its section of docs/measurements.md.

    script: `bench/NAME.py`; title: the section's heading; about: a short paragraph that
    says what the figures are (printed under the first line).  `line` prints and keeps a
    line; `write` writes the section, unless the script was run with `--no-write`."""

    def __init__(self, script: str, title: str, about: str):
        self.script, self.title, self.about = script, title, about.strip()
        self.started = datetime.date.today().isoformat()
        self.first = f"`{command()}` on {machine()}, {self.started}, load average {os.getloadavg()[0]:.2f}."
        self.lines: list[str] = []

    def line(self, text: str = "") -> None:
        print(text, flush=True)
        self.lines.extend(text.splitlines() or [""])

    @contextlib.contextmanager
    def tee(self):
        """Within it, everything printed to stdout is also kept as the report's lines."""
        report, stdout = self, sys.stdout

        class Tee(io.TextIOBase):
            def write(self, text: str) -> int:
                stdout.write(text)
                stdout.flush()
                kept.append(text)
                return len(text)

        kept: list[str] = []
        sys.stdout = Tee()
        try:
            yield self
        finally:
            sys.stdout = stdout
            report.lines.extend("".join(kept).splitlines())

    def body(self, markdown: str | None = None) -> str:
        """The section: the first line, `about`, then `markdown` or else the lines printed
        (as a code block)."""
        shown = markdown if markdown is not None else "```\n" + "\n".join(self.lines).strip("\n") + "\n```"
        return f"{self.first}\n\n{self.about}\n\n{shown.strip()}\n"

    def write(self, args: argparse.Namespace, markdown: str | None = None, doc: Path = DOC) -> None:
        """Write the section (body) into `doc`, unless `args.no_write`."""
        if args.no_write:
            print(f"(--no-write: {doc.relative_to(ROOT)} left as it is)", file=sys.stderr)
            return
        write_section(self.script, self.title, self.body(markdown), doc)
        print(f"wrote its section of {doc.relative_to(ROOT)}", file=sys.stderr)


def relative(path: str) -> str:
    """`path` relative to the repository when it is inside it, as the doc shows it."""
    return Path(path).resolve().relative_to(ROOT).as_posix() if _inside(str(Path(path).resolve())) else path


def add_write_flag(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    parser.add_argument("--no-write", action="store_true", help="print only; leave docs/measurements.md as it is")
    return parser


# ---------------------------------------------------------------------------
# Timing and the baselines it compares with
# ---------------------------------------------------------------------------


def interleaved_samples(modules: dict, inputs, rounds: int) -> dict[object, list[float]]:
    """Each module's step times (s, forward and backward with unit output gradients), one
    per round, timed round-robin after one untimed round, so that the machine's load hits
    all alike: a round's times are comparable with each other."""
    from remat_dsl.capture.measure import training_step

    steps = {name: training_step(m, inputs) for name, m in modules.items()}
    samples: dict[object, list[float]] = {name: [] for name in modules}
    for round_index in range(rounds + 1):
        for name, step in steps.items():
            modules[name].zero_grad(set_to_none=True)
            start = time.perf_counter()
            step()
            if round_index:
                samples[name].append(time.perf_counter() - start)
    return samples


def interleaved_medians(modules: dict, inputs, rounds: int) -> dict[object, float]:
    """Median step time (s) of each module, timed as interleaved_samples times them."""
    return {name: statistics.median(values) for name, values in interleaved_samples(modules, inputs, rounds).items()}


def repeated_blocks(model) -> list:
    """The largest group of sibling modules of one class: GPT-2's `transformer.h.*`, the
    ResNet's `layer1..layer4`, a Llama's decoder layers."""
    groups: list[list] = []
    for parent in model.modules():
        by_class: dict[type, list] = {}
        for child in parent.children():
            by_class.setdefault(type(child), []).append(child)
        groups += by_class.values()
    return max(groups, key=len)


def checkpointed(forward):
    """`forward` run under torch.utils.checkpoint (non-reentrant)."""
    import torch.utils.checkpoint as ckpt

    def run(*args, **kwargs):
        return ckpt.checkpoint(forward, *args, use_reentrant=False, **kwargs)

    return run


def checkpoint_every_block(model):
    """`model` with torch.utils.checkpoint (non-reentrant) around each of its repeated
    blocks (repeated_blocks), changed in place and returned."""
    for block in repeated_blocks(model):
        block.forward = checkpointed(block.forward)
    return model


def fast_module(plan, path: Path, model):
    """The generated module of `plan` (checked first), written to `path`, loaded, and its
    FastModel around `model` (which it shares parameters with)."""
    import remat_dsl

    path.write_text(remat_dsl.generate_module(plan))
    return remat_dsl.load_module(path).FastModel(model)
