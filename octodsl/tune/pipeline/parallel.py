"""The tuner's searches side by side, each in a worker process (`tune --jobs`).

Each search is its seed's alone (loop.py), so running them at once changes nothing a search
finds: where every search ends by itself, the result is the one the searches give one after
another, plan for plan; where the budget stops them, more of them ran. Workers are spawned,
not forked: the parent holds threads (the progress line's) that a fork would copy mid-lock.
Each loads the compiled kernels from numba's cache (about 2 s, inside the budget; the parent
compiled them first). The deadline is a `time.perf_counter()` value of the parent's: that
clock is the system's monotonic one (CLOCK_MONOTONIC on Linux), the same in every process.

Ctrl-C: the terminal signals the whole process group; the parent passes it on too (where it
came to the parent alone). A worker takes the first while it searches and ends that search as
loop.py ends one on Ctrl-C, with its best plan so far, and starts no other."""

from __future__ import annotations

import math
import multiprocessing
import os
import signal
import time
from collections.abc import Iterable, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from typing import Any

from ...errors import OctoError
from ...plan import Plan
from ..problem import Problem
from .loop import BudgetTooShort, Progress, TuneResult, one_search, then

_POLL = 0.25
"""Seconds between the parent's looks at the workers (its progress line)."""

_worker: dict[str, Any] = {}
"""A worker's problem, starts, deadline and the best time of all workers (shared); whether it
is searching and whether Ctrl-C came."""


def side_by_side(
    problem: Problem,
    starts: Sequence[Plan],
    seeds: Iterable[int],
    jobs: int,
    deadline: float,
    progress: Progress | None,
) -> tuple[TuneResult, float]:
    """The searches of `seeds`, `jobs` at a time, each until `deadline`: their results in the
    order of the seeds (loop.then) and the most seconds a step of theirs took. BudgetTooShort
    when none simulated a plan; KeyboardInterrupt when Ctrl-C came before any did."""
    seeds = list(seeds)
    context = multiprocessing.get_context("spawn")
    best = context.Value("d", math.inf)
    done: dict[int, tuple[TuneResult, float]] = {}
    interrupted = False
    before = set(multiprocessing.active_children())
    with ProcessPoolExecutor(
        min(jobs, len(seeds)),
        mp_context=context,
        initializer=_start_worker,
        initargs=(problem, list(starts), deadline, best),
    ) as pool:
        futures = {pool.submit(_search, s): s for s in seeds}
        pending: set[Future] = set(futures)
        while pending:
            try:
                finished, pending = wait(pending, timeout=_POLL, return_when=FIRST_COMPLETED)
                if progress:
                    progress("search", best.value, deadline - time.perf_counter())
            except KeyboardInterrupt:
                if interrupted:
                    raise  # a second Ctrl-C: do not wait for the workers' best plans
                interrupted = True
                for p in set(multiprocessing.active_children()) - before:
                    if p.pid is not None:
                        os.kill(p.pid, signal.SIGINT)
                continue
            for f in finished:
                try:
                    r = f.result()
                except BrokenProcessPool:
                    if interrupted:  # a worker Ctrl-C stopped while it started
                        continue
                    raise OctoError(
                        "the tuner's worker processes stopped before their searches ended "
                        "(out of memory?; a Python script that tunes with jobs > 1 must call "
                        "it under `if __name__ == '__main__':`, as multiprocessing's spawn "
                        "needs): try jobs 1"
                    ) from None
                if r is not None:
                    done[futures[f]] = r
    if not done:
        if interrupted:
            raise KeyboardInterrupt
        raise BudgetTooShort(
            "the budget ran out before the tuner could simulate one plan; give it more time"
        )
    out: TuneResult | None = None
    for s in sorted(done):
        out = then(out, done[s][0], s)
    assert out is not None
    out.finished = len(done) == len(seeds) and all(r.finished for r, _ in done.values())
    out.interrupted = interrupted
    return out, max(step for _, step in done.values())


def _start_worker(problem: Problem, starts: list[Plan], deadline: float, best: Any) -> None:
    _worker.update(
        problem=problem, starts=starts, deadline=deadline, best=best, searching=False, stop=False
    )
    signal.signal(signal.SIGINT, _on_ctrl_c)


def _on_ctrl_c(signum: int, frame: object) -> None:
    # The terminal's Ctrl-C and the parent's both come: the first ends the search under way
    # (between searches it ends none, which the pool's own loop would not survive), the rest
    # are let be.
    w = _worker
    if w["stop"]:
        return
    w["stop"] = True
    if w["searching"]:
        raise KeyboardInterrupt


def _search(seed: int) -> tuple[TuneResult, float] | None:
    """Search `seed` in this worker (loop.one_search); None after Ctrl-C, or when the deadline
    came before it simulated a plan."""
    w = _worker
    if w["stop"]:
        return None
    shared = w["best"]

    def progress(phase: str, best: float, left: float) -> None:
        if best < shared.value:
            with shared.get_lock():
                shared.value = min(shared.value, best)

    try:
        w["searching"] = True
        return one_search(w["problem"], w["starts"], seed, w["deadline"], progress)
    except KeyboardInterrupt:
        return None  # before its first plan: nothing to keep
    finally:
        w["searching"] = False
