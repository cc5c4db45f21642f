"""Worker processes that solve independent MILPs at once (NOTE: [Parallel grid]).

NOTE: [Parallel grid]
A block's RK-Checkmate grid (thesis section 2.6.0.0.1: `peak_steps` x `save_steps` pairs of
budgets) is a set of independent ILPs: each solve starts from a cleared model (NOTE:
[Model reuse] in milp.py) and stops at a node count, not a time (NOTE: [Effort bound]),
so the schedule it finds does not depend on which process solves it, nor in what order.
Most grids are cheap (a Llama layer's two blocks: 24 ILPs, 0.8 s in all), but a stock
Gemma-2's eager soft-capped attention makes blocks of 110-114 ops whose ILPs have about
4,500 columns: the grid of each of its two attention classes took 89-91 s on one core,
four of its twelve ILPs 14-28 s each.  So `rockmate_chain` solves a block's grid points
itself, in order, until they look slow (`slow`: the first took PARALLEL_AFTER_S, or those
solved took PARALLEL_AFTER_TOTAL_S together), and then hands the rest to `jobs` worker
processes (`remat plan --jobs`, default: the cores it may use).  The first ILP alone does
not tell: a stock T5's largest block (3,724 columns) took 0.29 s at its first point and
17-21 s at two later ones, its second largest (1,785 columns) 0.18 s and then 3.4 s.  A
cheap grid never pays for starting a process, and the plan is the same whatever `jobs` is.

The workers are spawned, not forked (the parent holds torch's OpenMP threads, which a
forked child would not have), and import the solvers without torch (0.25 s); each
builds a block's H-ILP once (0.65 s for Gemma-2's) and keeps it for that block's next
points (`rockmate._grid_point`).  They ignore Ctrl-C, which the `remat` process handles;
`stop()` kills them, and the `remat plan` command calls it when it ends, however it ends.
A pool that breaks (a worker killed from outside) leaves the rest of the grid to the
calling process.

NOTE: [Workers end with their parent]
No worker outlives the process that started it.  The `remat` program turns SIGTERM and
SIGHUP into an exception, as Python turns SIGINT into KeyboardInterrupt (NOTE: [Signals]
in remat_dsl/cli/__init__.py), so `remat plan` unwinds and calls `stop()`, however it was
asked to end.  A parent that cannot unwind (SIGKILL, a crash) is covered in the worker
itself (`_start_worker`): on Linux the kernel sends it SIGKILL when its parent dies
(prctl PR_SET_PDEATHSIG; the kernel sends it when the thread that started the worker ends,
and the pool is started and fed by the thread that solves, the main one), and a daemon
thread checks every PARENT_POLL_S seconds that its parent is still the process that
started it (os.getppid), for systems without prctl and for a parent that died before the
prctl call.
"""

from __future__ import annotations

import concurrent.futures
import ctypes
import multiprocessing
import os
import signal
import threading
import time
from typing import Callable

PARALLEL_AFTER_S = 0.25  # a block's first grid ILP took this long (seconds): the rest go to workers
PARALLEL_AFTER_TOTAL_S = 1.0  # or its first ILPs took this long together
PARENT_POLL_S = 0.5  # how often a worker checks that its parent lives (NOTE: [Workers end with their parent])
PR_SET_PDEATHSIG = 1  # linux/prctl.h


def slow(seconds) -> bool:
    """Whether a block's grid ILPs solved so far, which took `seconds` (an iterable), say
    that the rest should go to workers (NOTE: [Parallel grid])."""
    seconds = list(seconds)
    return bool(seconds) and (seconds[0] >= PARALLEL_AFTER_S or sum(seconds) >= PARALLEL_AFTER_TOTAL_S)

_pool: tuple[int, concurrent.futures.ProcessPoolExecutor] | None = None  # (jobs, executor) of this process


def usable_cores() -> int:
    """The cores this process may run on (its CPU affinity), the default `--jobs`."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def run_all(fn: Callable, calls: list[tuple], jobs: int) -> list | None:
    """[fn(*args) for args in calls], computed in `jobs` worker processes; `fn` and its
    arguments and results must pickle.  None when the pool broke (a worker died): the
    caller computes them itself.  Any other exception (an error in `fn`, Ctrl-C) stops
    the workers and is raised."""
    executor = _executor(jobs)
    try:
        futures = [executor.submit(fn, *args) for args in calls]
        return [future.result() for future in futures]
    except concurrent.futures.process.BrokenProcessPool:
        stop()
        return None
    except BaseException:
        stop()
        raise


def stop() -> None:
    """Kill this process's workers (an ILP they are solving is dropped) and forget them."""
    global _pool
    if _pool is None:
        return
    executor, _pool = _pool[1], None
    for process in list(
        (getattr(executor, "_processes", None) or {}).values()
    ):  # no public way to stop them before 3.14
        process.kill()
    executor.shutdown(wait=True, cancel_futures=True)


def _executor(jobs: int) -> concurrent.futures.ProcessPoolExecutor:
    global _pool
    if _pool is not None and _pool[0] != jobs:
        stop()
    if _pool is None:
        context = multiprocessing.get_context("spawn")
        parent = (os.getpid(),)
        executor = concurrent.futures.ProcessPoolExecutor(jobs, context, initializer=_start_worker, initargs=parent)
        _pool = (jobs, executor)
    return _pool[1]


def _start_worker(parent: int) -> None:
    """In a worker: ignore Ctrl-C (the parent handles it) and end when the process
    `parent` (pid) ends (NOTE: [Workers end with their parent])."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    except (OSError, AttributeError):  # not Linux: the thread below
        pass
    if os.getppid() != parent:  # it died before prctl
        os._exit(1)
    threading.Thread(target=_exit_without, args=(parent,), name="remat-parent-watch", daemon=True).start()


def _exit_without(parent: int) -> None:
    """End this process as soon as its parent is no longer the process `parent`."""
    while os.getppid() == parent:
        time.sleep(PARENT_POLL_S)
    os._exit(1)
