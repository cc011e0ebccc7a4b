"""`tune --jobs`: the searches side by side in worker processes (octodsl.tune.pipeline.parallel)
find what they find one after another, pass Ctrl-C on and keep what they found, and say in one
line why when their processes cannot start."""

from __future__ import annotations

import multiprocessing
import subprocess
import sys
import textwrap
import time

import pytest

from octodsl.tune.pipeline.loop import tune
from octodsl.tune.problem import Problem


@pytest.fixture(scope="module")
def tiny():
    return Problem.create("nemotron-h-tiny", 4, 8)


def _rounds(out):
    return [(r.phase, r.move, r.before, r.after) for r in out.rounds]


def test_side_by_side_the_searches_find_what_they_find_one_after_another(tiny):
    # Every search ends by itself well within the budget (tiny's six take about 2 s): the same
    # plan, rounds and count of simulations. The times are equal to the bit: the same
    # simulations of the same plans on the same machine, in another process.
    alone = tune(tiny, budget=120, seed=2)
    together = tune(tiny, budget=120, seed=2, jobs=2)
    assert alone.finished and together.finished and not together.interrupted
    assert together.best.plan == alone.best.plan and _rounds(together) == _rounds(alone)
    assert together.evaluations == alone.evaluations
    assert not multiprocessing.active_children()  # the workers are gone


def test_more_jobs_than_searches_and_jobs_refused_with_a_count(tiny):
    out = tune(tiny, budget=120, seed=2, restarts=2, jobs=8)
    assert out.finished and [r.move for r in out.rounds if r.phase == "restart"] == [
        "search again, seed 3"
    ]
    with pytest.raises(ValueError, match="jobs must be at least 1"):
        tune(tiny, budget=60, jobs=0)
    with pytest.raises(ValueError, match="1 with max_evaluations, not 2"):
        tune(tiny, budget=60, jobs=2, max_evaluations=10)


@pytest.mark.slow
def test_ctrl_c_ends_the_workers_searches_with_their_best_plans():
    # Ctrl-C in the parent once a worker has a plan (the parent's progress line sees it): the
    # parent passes it on, each worker ends its search with its best plan, and tune() keeps
    # the best of them, long before the budget. A 16-device problem, whose searches take
    # tens of seconds each.
    problem = Problem.create("nemotron-h-8b", 16, 32)
    pressed = []

    def progress(phase, best, left):
        if best < float("inf") and not pressed:
            pressed.append(time.perf_counter())
            raise KeyboardInterrupt

    t0 = time.perf_counter()
    out = tune(problem, budget=300, jobs=2, progress=progress)
    assert pressed and out.interrupted and not out.finished and out.best.fits
    assert time.perf_counter() - t0 < 120  # not the budget: the searches stopped
    assert not [r for r in out.rounds if r.phase == "polish"]  # Ctrl-C: no polish
    assert not multiprocessing.active_children()


def test_a_script_without_a_main_guard_is_told_why_the_workers_stopped(tmp_path):
    # multiprocessing's spawn imports the script again in each worker: without the guard, the
    # worker would tune too and stop. The parent says so in one line.
    script = tmp_path / "unguarded.py"
    script.write_text(
        textwrap.dedent(
            """
            from octodsl.errors import OctoError
            from octodsl.tune.pipeline.loop import tune
            from octodsl.tune.problem import Problem

            try:
                tune(Problem.create("nemotron-h-tiny", 4, 8), budget=60, jobs=2)
            except OctoError as e:
                print("refused:", e)
            """
        )
    )
    r = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=300, check=False
    )
    assert "refused: the tuner's worker processes stopped" in r.stdout
    assert "if __name__ == '__main__':" in r.stdout
