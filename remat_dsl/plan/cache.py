"""A cache directory for what `remat plan` measures and solves, reused across budgets and runs.

NOTE: [Solution cache]
Without a cache a budget sweep redoes the same work at every budget: each `remat plan` times
every op again (seconds to a minute) and solves every block class's RK-Checkmate grid again
(most of a plan's solve time), although neither depends on the budget.  Both are kept here:

* `profiles`: the step profile measured for a captured graph (every op's output sizes,
  aliasing, temporary bytes and time), keyed by everything it depends on (the graph's ops,
  arguments and shapes, the integer inputs' values, the torch version, this machine's
  processor, core count and torch threads, `--repeats`) and found without running any op
  (NOTE: [Profile key] in remat_dsl.capture.pipeline), kept even when some ops' timings did not
  settle (NOTE: [Robust timing] in remat_dsl.capture.profile: the run that measured them
  said so): on a 2-core machine a few of a Llama decoder's 1,834 ops often disagree
  between passes even idle, so a cache of settled profiles alone would keep none;
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
  [Chain memo] in remat_dsl.solve.solvers.ilp.rockmate): a refused budget's search for the
  smallest feasible one runs the same tables whatever the budget asked for;
* `smallest`: a solver's smallest feasible budget for a graph, as a refusal found it, so
  that a later budget below the proven bound can name it without a solve (NOTE: [Budgets
  below the bound] in remat_dsl.solve.driver).

The parser tables are not kept here: they ship with the package (NOTE: [Parser tables] in
remat_dsl.plan.parser), and no command that only reads plans (`check`, `diff`, `fmt`,
`textconv`, `show`) reads this directory.

Keys are SHA-256 digests of a canonical text of those inputs, so a changed model, cost,
setting or version is a miss, never a stale hit.  Entries are JSON files written atomically
(a temporary file renamed), `{"key", "value", "sha256"}`: each holds its own key and a
SHA-256 of its kind, key and value in canonical JSON (sorted keys, no spaces), checked on
every read.  An unreadable, truncated, foreign or edited entry (one whose hash is missing or
is not its content's) is a miss and is recomputed, never an error and never a wrong plan;
nothing read from here is unpickled or run.  The hash is no signature: it catches damage and
edits that do not recompute it; what keeps other people's entries out is the directory's
owner (below).  The same inputs give the same entry, so a plan made from the cache is
byte-identical to the plan of the run that filled it.

Where: $REMAT_CACHE_DIR, else $XDG_CACHE_HOME/remat-dsl, else ~/.cache/remat-dsl.  The
directories the cache makes are owner-only (0o700, whatever the umask) and its files 0o600.
A cache directory owned by another user, or writable by group or others, is neither read nor
written (one warning on stderr says why and how to fix it), and neither is an entry file
owned by another user or writable by group or others.  `remat plan --no-cache` (or
REMAT_CACHE_DIR=off) neither reads nor writes it; deleting the directory is always safe.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import os
import re
import stat
import sys
import tempfile
from pathlib import Path

VERSION = 3  # bump when what an entry means changes (3: the entry's own sha256)
KINDS = ("profiles", "graphs", "blocks", "chains", "smallest")
KEY = re.compile(r"[0-9a-f]{64}[0-9a-z_-]*")  # a digest, and for `chains` the target budget
_warned: set[str] = set()  # roots this process has warned about (once each)


class Cache:
    """Entries under `root` (None: a cache that holds nothing).  A root that is not safe to
    use (NOTE: [Solution cache]: another owner, or writable by group or others) is dropped
    with a warning on stderr, and the cache holds nothing."""

    def __init__(self, root: Path | None):
        self.root = root if root is None or _safe_root(root) else None

    @property
    def enabled(self) -> bool:
        return self.root is not None

    @staticmethod
    def key(*parts) -> str:
        """The SHA-256 hex digest of `parts`' repr (tuples, strings, numbers and frozen
        dataclasses have a canonical repr)."""
        return hashlib.sha256(repr((VERSION, parts)).encode()).hexdigest()

    def _path(self, kind: str, key: str) -> Path:
        if kind not in KINDS or not KEY.fullmatch(key):  # a file name, never a path
            raise ValueError(f"not a cache entry: {kind!r} {key!r}")
        assert self.root is not None  # get and put return early without a cache
        return self.root / kind / key[:2] / f"{key}.json"

    def get(self, kind: str, key: str):
        """The value stored under (kind, key), or None: missing, unreadable, not ours, or not
        what its own hash says (NOTE: [Solution cache])."""
        if self.root is None:
            return None
        try:
            entry = json.loads(_read_own(self._path(kind, key)))
            if not isinstance(entry, dict) or set(entry) != {"key", "value", "sha256"} or entry["key"] != key:
                return None
            if entry["sha256"] != entry_digest(kind, key, entry["value"]):
                return None
        except (OSError, ValueError, RecursionError):
            return None
        return entry["value"]

    def put(self, kind: str, key: str, value) -> None:
        """Store a JSON-able `value` with its hash; a cache that cannot be written is skipped
        silently (it only saves time)."""
        if self.root is None:
            return
        path = self._path(kind, key)
        stored = json.loads(json.dumps(value))  # what `get` reads back: tuples as lists, keys as strings
        self._write(path, json.dumps({"key": key, "value": stored, "sha256": entry_digest(kind, key, stored)}).encode())

    def _write(self, path: Path, data: bytes) -> None:
        """Write `data` to `path` atomically (a temporary file, 0o600, renamed), making the
        directories owner-only; a cache that cannot be written is skipped silently, and leaves
        no temporary."""
        assert self.root is not None  # put returns early without a cache
        temporary = None
        try:
            _owner_only_dirs(self.root, path.parent)
            with tempfile.NamedTemporaryFile("wb", dir=path.parent, suffix=".tmp", delete=False) as handle:
                temporary = Path(handle.name)
                os.fchmod(handle.fileno(), 0o600)
                handle.write(data)
            os.replace(temporary, path)
        except OSError:
            if temporary is not None:
                temporary.unlink(missing_ok=True)


def entry_digest(kind: str, key: str, value) -> str:
    """SHA-256 of an entry's kind, key and JSON value in canonical JSON (sorted keys, no
    spaces).  Raises ValueError or RecursionError for a value JSON cannot write."""
    canonical = json.dumps({"kind": kind, "key": key, "value": value}, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()


def _read_own(path: Path) -> str:
    """The text of the entry file `path`.  Raises OSError when it is not a regular file of
    this user that only this user can write (so another user cannot have put it there)."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    with os.fdopen(fd, "rb") as handle:
        info = os.fstat(handle.fileno())
        if not stat.S_ISREG(info.st_mode) or info.st_uid != os.getuid() or info.st_mode & 0o022:
            raise OSError(f"{path}: not a file of this user's cache")
        return handle.read().decode("utf-8")


def _owner_only_dirs(root: Path, directory: Path) -> None:
    """Make `directory` (under `root`) and the directories above it up to `root`, each 0o700
    whatever the umask; the directories above `root` are made as the umask says."""
    missing = [d for d in (directory, *directory.parents) if d == root or root in d.parents]
    for made in reversed(missing):
        try:
            os.makedirs(made, mode=0o700)
        except FileExistsError:
            continue
        os.chmod(made, 0o700)


def _safe_root(root: Path) -> bool:
    """Whether the cache may use `root`: it does not exist yet, or it is a directory of this
    user that group and others cannot write.  Warns once per root on stderr when it is not."""
    try:
        info = root.stat()
    except FileNotFoundError:
        return True
    except OSError as error:
        return _unsafe(
            root, f"it cannot be read ({error.strerror or error})", "set REMAT_CACHE_DIR to a directory of your own"
        )
    if not stat.S_ISDIR(info.st_mode):
        return _unsafe(root, "it is not a directory", "remove it or set REMAT_CACHE_DIR to a directory of your own")
    if info.st_uid != os.getuid():
        return _unsafe(
            root, f"it belongs to user id {info.st_uid}, not to you", "set REMAT_CACHE_DIR to a directory of your own"
        )
    if info.st_mode & 0o022:
        mode = oct(info.st_mode & 0o777)
        return _unsafe(
            root, f"group or others can write it (mode {mode})", f"run `chmod go-w {root}` or set REMAT_CACHE_DIR"
        )
    return True


def _unsafe(root: Path, why: str, fix: str) -> bool:
    if str(root) not in _warned:
        _warned.add(str(root))
        print(f"warning: not using the cache {root}: {why}; {fix} (it only saves time)", file=sys.stderr)
    return False


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
    try:
        return _decode_ir(value)
    except (TypeError, RecursionError) as error:  # a field of the wrong type, nesting past Python's stack
        raise ValueError(f"not an encoded ir value: {type(error).__name__}") from None


def _decode_ir(value):
    from remat_dsl.plan import ir

    if isinstance(value, list):
        return tuple(_decode_ir(item) for item in value)
    if isinstance(value, dict):
        if set(value) == {"float"}:
            return float(value["float"])
        cls = getattr(ir, str(value.get("$")), None)
        if not (dataclasses.is_dataclass(cls) and isinstance(cls, type)):
            raise ValueError(f"not a class of remat_dsl.plan.ir: {value.get('$')!r}")
        return cls(**{name: _decode_ir(item) for name, item in value.items() if name != "$"})
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
