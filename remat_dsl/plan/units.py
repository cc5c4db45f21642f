"""Units, in one place: sizes (bytes), durations (microseconds), bandwidth (bytes per
second), percentages, MIP gaps and solve times, read and written the same way by the
command line, the grammars' transformers, the printer, messages and code generation.

NOTE: [Units]
Quantities are integers: bytes, microseconds, bytes per second.  Text is read exactly
(`1.5 MiB` is 1572864 bytes; a value that is not a whole number of bytes, say `0.3 B`, is
refused) with or without a space before the unit, in binary (KiB, MiB, GiB, TiB) or decimal
(KB, MB, GB, TB) units; a bare number is bytes, but the command line refuses one for a
budget, a host budget or a bandwidth (`refuse_bare_number`: `--budget 50` is meant as 50%
or 50 MiB, not 50 bytes).  Two ways to write a size:

* `format_size`, exact and compact, for tables that must read back exactly: the largest
  binary unit up to GiB in which the value is a whole number of thousandths (`4 KiB`,
  `1.5 MiB`, `256.125 KiB`), else bytes (`12345 B`).  The plan's tables take only these
  units (EXACT_SIZE_UNITS), so that a `KB` written for `KiB` is an error, not 2.3% less;
  budgets, typed by people, take every unit;
* `format_bytes`, for people, everywhere a single figure is shown (headers, messages,
  reports, generated code): `21.89 MiB (22955008 B)`, two decimals of the largest binary
  unit and the exact bytes; below 1 KiB just `512 B`.  `human_bytes` is its first half,
  for lists of many sizes.

Durations are written in milliseconds with three decimals (`0.120 ms`, exact to the
microsecond); bandwidth in decimal GB/s when a whole number of MB/s (`12 GB/s`), else
`N B/s`; gaps in percent with 2 to 4 decimals (`1.23%`); solve times with one decimal
(`2.4 s`).
"""

from __future__ import annotations

import math
import re
from decimal import Decimal, InvalidOperation

SIZE_UNITS = {
    "B": 1,
    "KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30, "TiB": 1 << 40,
    "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12,
}  # fmt: skip
BINARY = ("TiB", "GiB", "MiB", "KiB")
EXACT_SIZE_UNITS = {unit: SIZE_UNITS[unit] for unit in ("B", "KiB", "MiB", "GiB")}  # what format_size writes
DURATION_UNITS = {"us": 1, "ms": 1000, "s": 1_000_000}
BANDWIDTH_UNITS = {"B/s": 1, "KB/s": 10**3, "MB/s": 10**6, "GB/s": 10**9, "TB/s": 10**12}
GAP_DECIMALS = 6  # of the fraction: 4 decimals of the percentage
GAP_PERCENT_DECIMALS = GAP_DECIMALS - 2
SECONDS_DECIMALS = 1

_QUANTITY = re.compile(r"\s*([0-9]+(?:\.[0-9]+)?|\.[0-9]+)\s*([A-Za-z/]*)\s*")
_PERCENT = re.compile(r"\s*([0-9]*\.?[0-9]+)\s*%\s*")
BARE_BYTES = 10**6  # a number without a unit from this on is most likely bytes (refuse_bare_number)
_BARE = re.compile(r"\s*([0-9]+(?:\.[0-9]+)?|\.[0-9]+)\s*")  # a number without a unit


class UnitError(ValueError):
    """A quantity that cannot be read: `message` says why, `hint` how to write it."""

    def __init__(self, message: str, hint: str):
        super().__init__(message)
        self.message, self.hint = message, hint


# ---------------------------------------------------------------------------
# Reading
# ---------------------------------------------------------------------------


def scaled(number: str, factor: int) -> int | None:
    """`number * factor` when it is a whole number (exact decimal arithmetic), else None."""
    try:
        value = Decimal(number) * factor
    except InvalidOperation:
        return None
    return int(value) if value == value.to_integral_value() else None


def _quantity(
    text: str, units: dict[str, int], default: str | None, what: str, example: str, exact: bool = True
) -> int:
    """An integer quantity from NUMBER[ ]UNIT (units matched without regard to case).

    exact: refuse a value that is not a whole number of the smallest unit; else round down
    (a budget of `0.1GiB` on the command line is 107374182 bytes)."""
    match = _QUANTITY.fullmatch(text)
    folded = {unit.lower(): unit for unit in units}
    unit = folded.get(match.group(2).lower(), match.group(2)) if match else ""
    if not match or (unit not in units and not (unit == "" and default)):
        expected = ", ".join(units)
        raise UnitError(f"cannot read {what} '{text}'", f"write a number and a unit ({expected}), e.g. {example}")
    key = unit or default
    assert key is not None  # a number without a unit was refused above unless there is a default
    factor = units[key]
    value = scaled(match.group(1), factor)
    if value is None and not exact:
        return math.floor(Decimal(match.group(1)) * factor)
    if value is None:
        smallest = min(units, key=units.__getitem__)
        raise UnitError(
            f"{what} '{text}' is not a whole number of {smallest}", f"{what}s are whole {smallest}; round it"
        )
    return value


def parse_size(text: str, what: str = "size", *, exact: bool = True, units: dict[str, int] = SIZE_UNITS) -> int:
    """Bytes from `64 KiB`, `1.5MiB`, `2 GB`, `65536 B` or `65536`.

    exact: refuse fractions of a byte (plan files); False rounds down (the command line).
    units: the units accepted; with EXACT_SIZE_UNITS (the plan's tables) a unit is
    required.  Raises UnitError."""
    bare = None if units is EXACT_SIZE_UNITS else "B"
    return _quantity(
        text, units, bare, what, "4 KiB, 1.5 MiB or 4096 B" if bare is None else "2GiB, 800 MB or 65536", exact
    )


def parse_bandwidth(text: str, what: str = "bandwidth", *, exact: bool = True) -> int:
    """Bytes per second from `12 GB/s`, or `12GB` with the `/s` implied.  Raises UnitError."""
    stripped = text.strip()
    if stripped.endswith("/s"):
        return _quantity(stripped, BANDWIDTH_UNITS, None, what, "12 GB/s", exact)
    return _quantity(stripped, SIZE_UNITS, "B", what, "12GB (per second) or 12 GB/s", exact)


def parse_duration(text: str, what: str = "duration") -> int:
    """Microseconds from `0.120 ms`, `15 us` or `2 s`.  Raises UnitError."""
    return _quantity(text, DURATION_UNITS, None, what, "0.120 ms")


def refuse_bare_number(text: str, what: str, *, percent: bool = True, per_second: bool = False) -> None:
    """Raise UnitError when `text` is a number without a unit (other than 0), which the
    readers above take as bytes (bytes per second, `per_second`): on the command line
    `--budget 50` means 50% or 50 MiB far more often than 50 bytes.  The hint says what it
    may mean: `50` -> `50% or 50MiB` (`50GiB or 50MiB` where a percentage is no choice,
    `percent` False), `0.5` -> `50%`, `1000000` -> `1000000B`, `12` (per second) -> `12GB/s`."""
    match = _BARE.fullmatch(text)
    if match is None or Decimal(match.group(1)) == 0:
        return
    number = Decimal(match.group(1))
    n = _plain(number)
    unit = "bytes per second" if per_second else "bytes"
    if per_second:
        guess, examples = f"{n}GB/s", f"{n}GB/s, {n} MB/s; {n}B/s for bytes per second"
    elif number >= BARE_BYTES:
        guess, examples = f"{n}B", f"{n}B, or a size such as 4GiB"
    elif number < 1:
        guess = f"{_plain(number * 100)}%" if percent else f"{n}GiB"
        examples = f"{guess}, or a size such as {n}GiB" if percent else f"{n}GiB, {n}GB"
    else:
        share = percent and number <= 100  # a percentage above 100 is rarely meant
        guess = f"{n}% or {n}MiB" if share else f"{n}MiB or {n}GiB"
        examples = (f"{n}%, " if share else "") + f"{n}MiB, {n}GB; {n}B for bytes"
    message = f"{what} '{text.strip()}' has no unit (alone, the number would be {n} {unit})"
    raise UnitError(message, f"did you mean {guess}? Write the unit ({examples})")


def _plain(number: Decimal) -> str:
    """A decimal without exponent or trailing zeros: Decimal('50.0') -> `50`."""
    text = format(number.normalize(), "f")
    return text.rstrip("0").rstrip(".") if "." in text else text


def parse_percent(text: str) -> float | None:
    """50.0 from `50%` (a share of something), None when `text` is not a percentage."""
    match = _PERCENT.fullmatch(text)
    return float(match.group(1)) if match else None


# ---------------------------------------------------------------------------
# Writing
# ---------------------------------------------------------------------------


def _thousandths(q: int) -> str:
    """`q / 1000` with up to three decimals, trailing zeros stripped: 1500 -> `1.5`."""
    whole, frac = divmod(q, 1000)
    return f"{whole}.{frac:03d}".rstrip("0").rstrip(".")


def size_parts(nbytes: int) -> tuple[str, str]:
    """The number and unit `format_size` writes, e.g. (`1.5`, `MiB`).  Raises ValueError
    for a negative size."""
    if nbytes < 0:
        raise ValueError(f"size must not be negative, got {nbytes}")
    for unit in ("GiB", "MiB", "KiB"):
        factor = SIZE_UNITS[unit]
        if nbytes >= factor and nbytes * 1000 % factor == 0:
            return _thousandths(nbytes * 1000 // factor), unit
    return str(nbytes), "B"


def format_size(nbytes: int) -> str:
    """Bytes, exactly and compactly (NOTE: [Units]): 4096 -> `4 KiB`."""
    return " ".join(size_parts(nbytes))


def human_bytes(nbytes: int) -> str:
    """Bytes for people, two decimals of the largest binary unit: `21.89 MiB`, `512 B`."""
    for unit in BINARY:
        if abs(nbytes) >= SIZE_UNITS[unit]:
            return f"{nbytes / SIZE_UNITS[unit]:.2f} {unit}"
    return f"{nbytes} B"


def format_bytes(nbytes: int) -> str:
    """The one way a size is shown to people: `21.89 MiB (22955008 B)`; `512 B` below 1 KiB."""
    human = human_bytes(nbytes)
    return human if human.endswith(" B") else f"{human} ({nbytes} B)"


def format_duration(us: int) -> str:
    """Microseconds in milliseconds with three decimals: 120 -> `0.120 ms`.  Raises
    ValueError for a negative duration."""
    if us < 0:
        raise ValueError(f"duration must not be negative, got {us}")
    return f"{us // 1000}.{us % 1000:03d} ms"


def format_bandwidth(bytes_per_s: int) -> str:
    """Bytes per second in decimal GB/s when exact: 12_500_000_000 -> `12.5 GB/s`."""
    if bytes_per_s < 0:
        raise ValueError(f"bandwidth must not be negative, got {bytes_per_s}")
    if bytes_per_s % 10**6 == 0:
        return f"{_thousandths(bytes_per_s // 10**6)} GB/s"
    return f"{bytes_per_s} B/s"


def format_percent(part: float, whole: float) -> str:
    """`50.0%`, one decimal; `-` when `whole` is 0."""
    return f"{100 * part / whole:.1f}%" if whole else "-"


def round_gap(gap: float) -> float:
    """A relative gap (fraction) as plans store it: rounded to GAP_DECIMALS, never -0.0."""
    return float(round(gap, GAP_DECIMALS)) + 0.0


def round_seconds(seconds: float) -> float:
    """A solve time (seconds) as plans store it: rounded to 0.1 s, never -0.0."""
    return float(round(seconds, SECONDS_DECIMALS)) + 0.0


def format_gap(gap: float) -> str:
    """A relative gap (fraction) in percent, exactly: 0.0123 -> `1.23%`.

    2 to 4 decimals; the digits are those of `repr(gap)` moved two places, so the text
    reads back as the same float.  Raises ValueError for a negative, infinite or NaN gap,
    or one with more than GAP_DECIMALS decimals (`round_gap` first).
    """
    if not isinstance(gap, float) or not math.isfinite(gap) or gap < 0:
        raise ValueError(f"cannot print gap {gap!r}: a finite fraction >= 0 (0.0123 is 1.23%)")
    whole, _, frac = format(Decimal(repr(gap)).scaleb(2), "f").partition(".")
    frac = frac.rstrip("0")
    if len(frac) > GAP_PERCENT_DECIMALS:
        raise ValueError(f"cannot print gap {gap!r}: more than {GAP_DECIMALS} decimals (see round_gap)")
    return f"{whole}.{frac.ljust(2, '0')}%"


def format_seconds(seconds: float) -> str:
    """A solve time with one decimal: 2.4 -> `2.4 s`.  Raises ValueError for a negative,
    infinite or NaN time, or one not rounded to 0.1 s (`round_seconds` first)."""
    if not isinstance(seconds, float) or not math.isfinite(seconds) or seconds < 0:
        raise ValueError(f"cannot print solve time {seconds!r}: a finite number of seconds >= 0")
    text = f"{seconds:.{SECONDS_DECIMALS}f}"
    if float(text) != seconds:
        raise ValueError(f"cannot print solve time {seconds!r}: not rounded to 0.1 s (see round_seconds)")
    return f"{text} s"
