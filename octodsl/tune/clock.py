"""The clock `--budget` runs on: it starts when the process started, so that start-up (Python,
the imports, loading the model) counts, and it holds back what writing and checking the plans
will take, so that `--budget` bounds the whole command (docs/cluster.md, "The budget")."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

CHECK_SECONDS_PER_OP = 1e-4
"""Rendering, parsing and linting a written plan, per op, with room for a loaded machine: a tuned
plan compacts little, and benchmarks/write_check.md measures 32 us per op for a tuned
nemotron-h-8b plan of 8 devices x 512 micro-batches (36,864 ops, 274 KB written) on the 2 shared
cores of the development machine. (0.8 ms per op before lint's fast parser and array deadlock
walk of issue 27, which left the cluster search no budget for plans of 10^5 ops.)"""


def process_start() -> float:
    """When this process started, on time.perf_counter()'s clock (Linux's /proc; elsewhere, the
    first call)."""
    global _START
    if _START is None:
        _START = time.perf_counter()
        try:
            with open("/proc/self/stat") as f:
                ticks = int(f.read().rsplit(")", 1)[1].split()[19])
            with open("/proc/uptime") as f:
                uptime = float(f.read().split()[0])
            age = uptime - ticks / os.sysconf("SC_CLK_TCK")
            if 0 <= age < 3600:  # a clock the kernel reports oddly is not trusted
                _START -= age
        except (OSError, ValueError, IndexError):
            pass
    return _START


_START: float | None = None


def command_start() -> float:
    """When the command began, on time.perf_counter()'s clock (called as it begins): the
    process's start when the process is octodsl's command line; now when something else
    calls `octodsl.cli.main` (a test, a program), whose start-up is not the command's."""
    main = getattr(sys.modules.get("__main__"), "__spec__", None)
    ours = Path(sys.argv[0]).name == "octodsl" or (
        main is not None and main.name.startswith("octodsl")
    )
    return process_start() if ours else time.perf_counter()


def left(budget: float, since: float, reserve: float = 0.0) -> float:
    """Seconds of `budget` left since `since`, after `reserve` (at least a millisecond: the
    search always simulates one plan)."""
    return max(since + budget - reserve - time.perf_counter(), 1e-3)


def check_reserve(ops: int, plans: int = 1) -> float:
    """What writing and checking `plans` plans of `ops` ops each will take."""
    return CHECK_SECONDS_PER_OP * ops * plans
