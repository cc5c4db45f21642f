"""User-facing errors of remat-dsl, printed xDSL-style with the culprit underlined.

`PlanError.format()` renders::

    model.plan:12:5: error: unknown tensor 'fc3'
      compute      fc3   on compute
                   ^^^
      hint: did you mean 'fc2'?

The first line is `PATH:LINE:COL: error: MESSAGE` (`<plan>` when the path is unknown;
without a span `PATH: error: MESSAGE`, or `error: MESSAGE` without a path either).  The source
line and the carets are shown when both the span and the source text are known; `length` carets go under the culprit.
Where the culprit is a word later on the line than the span (an instruction's target,
say), `word` names it: once the source is known the column and carets move onto it.

NOTE: [Bounded messages]
A plan is hostile text (NOTE: [Bounded inputs] in remat_dsl/plan/files.py), and an error
quotes it: one 20 MB name, quoted whole in the message, the hint and the source line,
would make 60 MB of error text.  So what an error prints is bounded: the source line is quoted up to
QUOTE_CHARS characters (a window around the culprit when it lies further right, the cut
marked with an ellipsis), the carets only under what is shown, and every line of the
formatted message (message, hint) is cut: a word longer than WORD_CHARS to its first
WORD_CHARS characters and an ellipsis, a line to LINE_CHARS.  `clipped` does the same for
text a message interpolates before it is built.
"""

from __future__ import annotations

import re

from remat_dsl.plan.ir import Span

UNKNOWN_PATH = "<plan>"
QUOTE_CHARS = 200  # characters of a source line quoted (NOTE: [Bounded messages])
WORD_CHARS = 200  # characters of one word of a message (a name, a path)
LINE_CHARS = 2000  # characters of one line of a message
ELLIPSIS = "…"
_LONG_WORD = re.compile(r"\S{%d,}" % (WORD_CHARS + 1))


def clipped(text: str, limit: int = WORD_CHARS) -> str:
    """`text`, or its first `limit` characters and an ellipsis when it is longer."""
    return text if len(text) <= limit else text[:limit] + ELLIPSIS


def bounded(text: str) -> str:
    """`text` with every word cut to WORD_CHARS characters and every line to LINE_CHARS
    (NOTE: [Bounded messages])."""
    lines = []
    for line in text.split("\n"):
        if len(line) > WORD_CHARS:
            line = _LONG_WORD.sub(lambda found: clipped(found.group(0)), line)
        lines.append(clipped(line, LINE_CHARS))
    return "\n".join(lines)


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
        message = bounded(self.message)
        text = message if re.match(r"^(\S+: )?error: ", message) else f"error: {message}"
        return text + (f"\n  hint: {bounded(self.hint)}" if self.hint else "")

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
        lines = [bounded(f"{location}: error: {self.message}" if location else f"error: {self.message}")]
        lines.extend(self._quote())
        if self.hint:
            lines.append(bounded(f"  hint: {self.hint}"))
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
            found = _whole_word(line, self.word, self.span.col - 1)
            if found is not None:
                return found + 1, len(self.word)
        return self.span.col, self.length

    def _quote(self) -> list[str]:
        """The source line (at most QUOTE_CHARS of it, NOTE: [Bounded messages]) and the carets."""
        line = self._line()
        if line is None:
            return []
        col, length = self._culprit()
        start = 0 if col - 1 < QUOTE_CHARS else col - 1 - QUOTE_CHARS // 4
        shown = line[start : start + QUOTE_CHARS]
        col -= start
        length = max(1, min(length, QUOTE_CHARS + 1 - col))
        # Keep tabs in the caret prefix so the carets line up under tab-indented text.
        prefix = "".join(c if c == "\t" else " " for c in shown[: col - 1])
        prefix += " " * max(0, col - 1 - len(shown))
        before = ELLIPSIS if start else ""
        after = ELLIPSIS if start + QUOTE_CHARS < len(line) else ""
        return [before + shown + after, " " * len(before) + prefix + "^" * length]


def _whole_word(line: str, word: str, start: int) -> int | None:
    """The index of the first `word` in `line` at or after `start` with white space or the
    line's ends on both sides, or None."""
    at = line.find(word, start)
    while at >= 0:
        end = at + len(word)
        if (at == 0 or line[at - 1].isspace()) and (end == len(line) or line[end].isspace()):
            return at
        at = line.find(word, at + 1)
    return None
