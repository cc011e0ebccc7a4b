"""The tuner's compiled kernels, compiled before its budget starts.

numba compiles each kernel the first time a process calls it, and caches the machine code on
disk (octodsl.sim.jit), so only a machine's first run pays: 30-45 s on two cores for the
tuner's kernels. Paid inside `--budget`, it left the first runs a fraction of their search and
overran short budgets (benchmarks/tuner_cold.md: nemotron-h-56b, 8 x 16 at 80 GiB, `--budget
5s` wrote the 1F1B baseline, 53% slower than a later run's plan, and the next run, still
compiling, took 26.7 s). So the tuner first runs every kernel once on a tiny problem, and the
compile it causes is left out of the budget and reported; with the disk cache filled this
takes a fraction of a second, which counts as start-up does.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from ..sim import warm_up
from ..sim.jit import seconds_compiling
from .pipeline.layout import StageLayout, even_cuts, looped
from .pipeline.loop import tune
from .pipeline.moves.schedule import pilot_seconds, rebuild
from .pipeline.zb_auto import zb_starts
from .problem import Problem
from .reference.baselines import classic_baselines

EVALUATIONS = 40
"""Plans the tiny search simulates: every move runs in them."""

UNHURRIED = 3600.0
"""Seconds the tiny search and its polish may take: the plan count ends them long before. The
budget counts the compile, so a shorter one (60 s) let a loaded machine's compile use it up and
the search skip moves, whose kernels then compiled in the real search."""

_warm = False
"""Whether this process has run the warm-up."""


def warm_up_tuner(on_compile: Callable[[], None] | None = None) -> float:
    """Run each kernel the tuner and its baselines call once (once per process); return the
    seconds spent compiling (0 where the disk cache held them all, and after the first call).
    `on_compile`: called when a compile starts. Ctrl-C during it raises KeyboardInterrupt, as
    before the first plan of a search."""
    global _warm
    if _warm:
        return 0.0
    _warm = True  # before the tiny search: its tune() warms up too
    try:
        return seconds_compiling(_tiny_search, on_compile)
    except BaseException:
        _warm = False
        raise


def _tiny_search() -> None:
    warm_up()
    # A memory limit that holds the static bytes and about half of one micro-batch's
    # activations per device, over two data-parallel copies under ZeRO 1: every lever (the
    # recompute modes, the memory-aware walk, the data-parallel collectives) runs.
    free = Problem.create("nemotron-h-tiny", 2, 4, dp=2, zero=1)
    limit = float(free.layer_static().sum() + free.column("act").sum()) / 2
    problem = Problem.create("nemotron-h-tiny", 2, 4, memory=int(limit), dp=2, zero=1)
    classic_baselines(problem)
    out = tune(problem, budget=UNHURRIED, max_evaluations=EVALUATIONS, restarts=1)
    if out.interrupted:  # tune() keeps its best plan on Ctrl-C; this search has none to keep
        raise KeyboardInterrupt
    # the final polish, which the cap on plans skips (to its end, the search takes seconds)
    skeleton = problem.skeleton(StageLayout.of(out.best.plan))
    pilot_seconds(skeleton, problem, True)
    rebuild(skeleton, problem, True, True, time.perf_counter() + UNHURRIED)
    # ZeroBubble's greedy starts the search only from one stage per device, which a tiny
    # search may not pick
    zb_starts(problem, StageLayout(even_cuts(problem.num_layers, 2), looped(2, 1)))


COMPILING = "compiling (once per machine)"
"""The progress line's phase while the warm-up compiles (`tune`, `tune --gpus`)."""


def compiled_note(seconds: float) -> str:
    """What the last line of `tune` says of a compile before the search ('' when none)."""
    if seconds < 0.05:
        return ""
    return (
        f"compiled the tuner's kernels first, in {seconds:.1f} s (once per machine: numba caches "
        "them on disk; not counted in --budget)"
    )
