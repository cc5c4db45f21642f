"""A cache directory for what `remat plan` measures and solves, reused across budgets and runs.

NOTE: [Solution cache]
A budget sweep re-ran the same work at every budget: each `remat plan` timed every op again
(seconds to a minute) and solved every block class's RK-Checkmate grid again (most of a
plan's solve time), although neither depends on the budget.  Both are now kept here:

* `profiles`: the step profile measured for a captured graph (every op's output sizes,
  aliasing, temporary bytes and time), keyed by everything it depends on (the graph's ops,
  arguments and shapes, the integer inputs' values, the torch version, this machine's
  processor, core count and torch threads, `--repeats`) and found without running any op
  (NOTE: [Profile key] in remat_dsl.capture.pipeline), kept even when some ops' timings did not
  settle (NOTE: [Robust timing] in remat_dsl.capture.profile: the run that measured them
  said so): on this 2-core machine a few of a Llama decoder's 1,834 ops often disagree
  between passes even idle, and a cache that kept only settled profiles kept none;
* `graphs`: the whole profiled FB-graph (the plan's graph sections, op times included),
  keyed by dynamo's graph before AOTAutograd traces the backward, so that a warm run skips
  that trace as well as the profile (NOTE: [Capture key] in remat_dsl.capture.fx), stored
  as JSON by `encode_ir` only when it reads back equal;
* `blocks`: a block class's RK-Checkmate schedules and the MILP statuses that made them,
  keyed by the block's whole H-graph (ops, costs, sizes), the grid, the MILP settings and
  the versions of pulp and HiGHS.  A solve under a time limit depends on the machine's
  load and is not kept;
* `chains`: RK-Rotor's result on a chain of blocks with their options at one target
  budget, keyed by the chain's sizes and times, the slots and the DP's source (NOTE:
  [Chain memo] in remat_dsl.solve.ilp.rockmate): a refused budget's search for the
  smallest feasible one runs the same tables whatever the budget asked for;
* `parsers`: the plan parser's LALR tables (NOTE: [Parser tables] in remat_dsl.plan.parser),
  in Lark's own format (a pickle), named by a digest of the grammar; they depend on the
  grammar alone, so `--no-cache` leaves them in use (REMAT_CACHE_DIR=off does not).

Keys are SHA-256 digests of a canonical text of those inputs, so a changed model, cost,
setting or version is a miss, never a stale hit.  The other entries are JSON files written
atomically (a temporary file renamed), and each holds its own key: an unreadable,
truncated or foreign entry is ignored and recomputed.  The same inputs give the same
entry, so a plan made from the cache is byte-identical to the plan of the run that filled
it.

Where: $REMAT_CACHE_DIR, else $XDG_CACHE_HOME/remat-dsl, else ~/.cache/remat-dsl.
`remat plan --no-cache` (or REMAT_CACHE_DIR=off) neither reads nor writes it; deleting the
directory is always safe.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import os
import tempfile
from pathlib import Path

VERSION = 2  # bump when what an entry means changes (2: NOTE: [Frozen and unused parameters])


class Cache:
    """Entries under `root` (None: a cache that holds nothing)."""

    def __init__(self, root: Path | None):
        self.root = root

    @property
    def enabled(self) -> bool:
        return self.root is not None

    @staticmethod
    def key(*parts) -> str:
        """The SHA-256 hex digest of `parts`' repr (tuples, strings, numbers and frozen
        dataclasses have a canonical repr)."""
        return hashlib.sha256(repr((VERSION, parts)).encode()).hexdigest()

    def _path(self, kind: str, key: str) -> Path:
        return self.root / kind / key[:2] / f"{key}.json"

    def get(self, kind: str, key: str):
        """The value stored under (kind, key), or None (missing, unreadable, or not ours)."""
        if self.root is None:
            return None
        try:
            entry = json.loads(self._path(kind, key).read_text())
        except (OSError, ValueError):
            return None
        if not isinstance(entry, dict) or entry.get("key") != key or "value" not in entry:
            return None
        return entry["value"]

    def put(self, kind: str, key: str, value) -> None:
        """Store a JSON-able `value`; a cache that cannot be written is skipped silently
        (it only saves time)."""
        if self.root is not None:
            self.write(self._path(kind, key), json.dumps({"key": key, "value": value}).encode())

    @staticmethod
    def write(path: Path, data: bytes) -> None:
        """Write `data` to `path` atomically (a temporary file renamed); a cache that cannot
        be written is skipped silently (it only saves time), and leaves no temporary."""
        temporary = None
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            with tempfile.NamedTemporaryFile("wb", dir=path.parent, suffix=".tmp", delete=False) as handle:
                temporary = Path(handle.name)
                handle.write(data)
            os.replace(temporary, path)
        except OSError:
            if temporary is not None:
                temporary.unlink(missing_ok=True)


NO_CACHE = Cache(None)


def encode_ir(value):
    """A value of remat_dsl.plan.ir (a Graph, an Op, an argument) as JSON: a dataclass as
    an object with its class name under `$` and its compared fields (spans are left out),
    a tuple as a list, a float that is not finite as `{"float": "inf"}`.  For the
    `graphs` entries of NOTE: [Capture key] in remat_dsl.capture.fx."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        fields = {f.name: encode_ir(getattr(value, f.name)) for f in dataclasses.fields(value) if f.compare}
        return {"$": type(value).__name__, **fields}
    if isinstance(value, tuple):
        return [encode_ir(item) for item in value]
    if isinstance(value, float) and not math.isfinite(value):
        return {"float": repr(value)}
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    raise TypeError(f"not a value of remat_dsl.plan.ir: {type(value).__name__}")


def decode_ir(value):
    """The value `encode_ir` encoded.  Raises ValueError for what it does not make."""
    from remat_dsl.plan import ir

    if isinstance(value, list):
        return tuple(decode_ir(item) for item in value)
    if isinstance(value, dict):
        if set(value) == {"float"}:
            return float(value["float"])
        cls = getattr(ir, str(value.get("$")), None)
        if not (dataclasses.is_dataclass(cls) and isinstance(cls, type)):
            raise ValueError(f"not a class of remat_dsl.plan.ir: {value.get('$')!r}")
        try:
            return cls(**{name: decode_ir(item) for name, item in value.items() if name != "$"})
        except TypeError as error:
            raise ValueError(str(error)) from None
    return value


def default_cache() -> Cache:
    """The cache of NOTE: [Solution cache] at its default place (NO_CACHE when
    REMAT_CACHE_DIR is `off`)."""
    chosen = os.environ.get("REMAT_CACHE_DIR")
    if chosen == "off":
        return NO_CACHE
    if chosen:
        return Cache(Path(chosen))
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Cache(Path(base) / "remat-dsl")
