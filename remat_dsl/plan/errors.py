"""User-facing errors of remat-dsl, printed xDSL-style with the culprit underlined.

`PlanError.format()` renders::

    model.plan:12:5: error: unknown tensor 'fc3'
      compute      fc3   on compute
                   ^^^
      hint: did you mean 'fc2'?

The first line is `PATH:LINE:COL: error: MESSAGE` (`<plan>` when the path is unknown;
without a span `PATH: error: MESSAGE`, or `error: MESSAGE` without a path either).  The source line and the carets are shown
when both the span and the source text are known; `length` carets go under the culprit.
Where the culprit is a word later on the line than the span (an instruction's target,
say), `word` names it: once the source is known the column and carets move onto it.
"""

from __future__ import annotations

import re

from remat_dsl.plan.ir import Span

UNKNOWN_PATH = "<plan>"


class RematError(Exception):
    """Base of the errors remat-dsl reports to its users; `format()` is what they see.

    message: `error: ...` or `PATH[:LINE:COL]: error: ...` (the prefix is added when
    missing); hint: how to fix it, printed on its own line.
    """

    def __init__(self, message: str = "", *, hint: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint

    def format(self) -> str:
        text = self.message if re.match(r"^(\S+: )?error: ", self.message) else f"error: {self.message}"
        return text + (f"\n  hint: {self.hint}" if self.hint else "")

    def __str__(self) -> str:
        return self.format()


class PlanError(RematError):
    """An error located in a plan's text: message, where (path, span) and how to fix it (hint).

    source: the whole text of the plan file, used to quote the offending line.
    length: how many characters of the line to underline (at least 1).
    word: the culprit's text, if it is a word at or after `span` on that line; the
    location and the carets then point at it (the first whole-word match).
    """

    def __init__(
        self,
        message: str,
        *,
        span: Span | None = None,
        hint: str | None = None,
        path: str | None = None,
        source: str | None = None,
        length: int = 1,
        word: str | None = None,
    ) -> None:
        super().__init__(message, hint=hint)
        self.span = span
        self.path = path
        self.source = source
        self.length = max(1, length)
        self.word = word

    def with_source(self, path: str | None, source: str | None) -> PlanError:
        """Fill in the path and source text where they are still unknown; returns self."""
        if self.path is None:
            self.path = path
        if self.source is None:
            self.source = source
        return self

    def format(self) -> str:
        location = self._location()
        lines = [f"{location}: error: {self.message}" if location else f"error: {self.message}"]
        lines.extend(self._quote())
        if self.hint:
            lines.append(f"  hint: {self.hint}")
        return "\n".join(lines)

    def _location(self) -> str | None:
        if self.span is None:
            return self.path
        col, _ = self._culprit()
        return f"{self.path or UNKNOWN_PATH}:{self.span.line}:{col}"

    def _line(self) -> str | None:
        if self.span is None or self.source is None:
            return None
        lines = self.source.split("\n")
        if not 1 <= self.span.line <= len(lines):
            return None
        return lines[self.span.line - 1].rstrip("\r")

    def _culprit(self) -> tuple[int, int]:
        """Column and caret count of the culprit: `word` on the span's line, else span and length."""
        assert self.span is not None
        line = self._line()
        if self.word and line is not None:
            found = re.compile(rf"(?<![^\s]){re.escape(self.word)}(?![^\s])").search(line, self.span.col - 1)
            if found:
                return found.start() + 1, len(self.word)
        return self.span.col, self.length

    def _quote(self) -> list[str]:
        line = self._line()
        if line is None:
            return []
        col, length = self._culprit()
        # Keep tabs in the caret prefix so the carets line up under tab-indented text.
        prefix = "".join(c if c == "\t" else " " for c in line[: col - 1])
        prefix += " " * max(0, col - 1 - len(line))
        return [line, prefix + "^" * length]
