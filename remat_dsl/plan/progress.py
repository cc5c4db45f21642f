"""The one reporter of progress: a stage's bar on a terminal, plain lines with elapsed
seconds otherwise, all on stderr.  `remat plan` (remat_dsl.cli) and `plan_model(...,
progress=True)` (remat_dsl.workflow) show their stages with it; the capture and the solvers
are given it (or any object with `start` and `advance`)."""

from __future__ import annotations

import sys
import threading
import time
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from rich.progress import Progress as RichProgress

PLAIN_PROGRESS_SECONDS = 10.0  # a plain progress line at most this often when stderr is not a terminal
PHASE_LINE_SECONDS = 1.0  # a new phase gets a plain line when the last line is at least this old (NOTE: [Progress])


def status(message: str) -> None:
    """One line for the person at the terminal (stderr)."""
    print(message, file=sys.stderr, flush=True)


class Progress:
    """Progress of one stage on stderr: a rich bar on a terminal, else plain lines.

    NOTE: [Progress]
    The one reporter of progress: every stage of `remat plan` that can take more than a
    second (loading the model file, the capture and its costs, the solve) runs inside one, and
    so does each stage of `plan_model(..., progress=True)` (remat_dsl.workflow), which is
    what a training script calls.  Plain lines (`profiling examples/gpt2.py: 120/579 ops,
    12 s`) come at the start, at most every PLAIN_PROGRESS_SECONDS (from a thread of its own
    while nothing advances: one block of a solve can take minutes), and at the end with the
    elapsed seconds, so a log or a CI job shows the tool is alive; on a terminal a rich bar
    counts and its clock ticks.  It is what the capture (`start(total)`, `advance(n)`) and the
    solvers (called with a line, `start` and `advance` per block class:
    remat_dsl.solve.solvers.ilp.rockmate) are given, so a solve shows its block classes done
    of the total.  Everything goes to stderr (NOTE: [Stdout is the data] in
    remat_dsl/cli/console.py); `quiet` (`remat plan --quiet`) shows nothing but warnings.  A
    stage with no count (`unit` None) ends with its elapsed time alone.

    `phase(what)` names the part of the stage under way (the capture's trace, its op costs,
    the eager comparison; the solve's partition, block ILPs, lowering and simulation): the
    bar's text and the next plain lines say it (`planning: lowering and simulating, 5/5 block
    classes, 52 s`), the stage's last line does not.  A plain line comes when the phase
    changes, unless one came less than PHASE_LINE_SECONDS before (a solve alternates solving
    and simulating several times a second).  The code that runs a stage calls `phase` only
    where its progress has one (`getattr(progress, "phase", None)`, solve.api.say_phase), so
    any object with `start` and `advance` still serves.
    """

    def __init__(self, description: str, unit: str | None = "ops", quiet: bool = False):
        self.description, self.unit, self.quiet = description, unit, quiet
        self.what: str | None = None  # the phase under way (`phase`)
        self.total: int | None = None
        self.done = 0
        self.bar: RichProgress | None = None
        self.began = self.last = time.monotonic()
        self.stop: threading.Event | None = None
        self.ticker: threading.Thread | None = None

    def __enter__(self) -> Progress:
        self.began = self.last = time.monotonic()
        if self.quiet:
            return self
        if sys.stderr.isatty():
            from rich.console import Console
            from rich.progress import BarColumn, MofNCompleteColumn, TextColumn, TimeElapsedColumn
            from rich.progress import Progress as RichProgress

            columns = (BarColumn(), MofNCompleteColumn()) if self.unit is not None else ()
            self.bar = RichProgress(
                TextColumn("{task.description}"), *columns, TimeElapsedColumn(), console=Console(stderr=True)
            )
            self.bar.start()
            self.task = self.bar.add_task(self.description, total=None)
        else:
            status(f"{self.description} ...")
            self.stop = threading.Event()
            self.ticker = threading.Thread(target=self._tick, args=(self.stop,), name="remat-progress", daemon=True)
            self.ticker.start()
        return self

    def _tick(self, stop: threading.Event) -> None:
        """A plain line every PLAIN_PROGRESS_SECONDS that passes without one, until `stop`."""
        while not stop.wait(PLAIN_PROGRESS_SECONDS):
            now = time.monotonic()
            if now - self.last >= PLAIN_PROGRESS_SECONDS:
                self.last = now
                status(self._line(now))

    def __call__(self, line: str) -> None:
        """A line saying what the stage does now (a solver's `report`): above the bar, or
        a plain line."""
        if self.quiet and not line.startswith("warning:"):
            return
        if self.bar is not None:
            self.bar.console.print(line, markup=False, highlight=False, soft_wrap=True)
        else:
            status(line)

    def start(self, total: int) -> None:
        """`total` things to do from now on, none of them done."""
        self.total, self.done = total, 0
        if self.bar is not None:
            self.bar.update(self.task, total=total, completed=0)

    def phase(self, what: str) -> None:
        """Name the part of the stage under way (NOTE: [Progress])."""
        if what == self.what:
            return
        self.what = what
        if self.bar is not None:
            self.bar.update(self.task, description=f"{self.description}: {what}")
            return
        now = time.monotonic()
        if not self.quiet and now - self.last >= PHASE_LINE_SECONDS:
            self.last = now
            status(self._line(now))

    def advance(self, n: int = 1) -> None:
        self.done += n
        if self.bar is not None:
            self.bar.advance(self.task, n)
            return
        now = time.monotonic()
        if not self.quiet and now - self.last >= PLAIN_PROGRESS_SECONDS:
            self.last = now
            status(self._line(now))

    def _line(self, now: float, finished: bool = False) -> str:
        """`description: [phase, ][done/total unit, ]N s`; the stage's last line names no phase."""
        parts = [self.what] if self.what is not None and not finished else []
        if self.unit is not None and (self.total is not None or self.done):  # something counted
            count = f"{self.done}/{self.total}" if self.total is not None else str(self.done)
            parts.append(f"{count} {self.unit}")
        parts.append(f"{now - self.began:.0f} s")
        return f"{self.description}: " + ", ".join(parts)

    def __exit__(self, *exc) -> None:
        if self.stop is not None and self.ticker is not None:
            self.stop.set()
            self.ticker.join()  # no thread outlives the stage (NOTE: [Exit] in cli/__init__.py)
        if self.bar is not None:
            self.bar.stop()
        elif exc[0] is None and not self.quiet:
            status(self._line(time.monotonic(), finished=True))
