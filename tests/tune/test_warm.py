"""The tuner's kernels compile before its budget starts (octodsl/tune/warm.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest

from octodsl.sim.jit import JIT, seconds_compiling
from octodsl.tune import warm
from octodsl.tune.problem import Problem
from octodsl.tune.reference import compare
from octodsl.tune.warm import compiled_note

needs_numba = pytest.mark.skipif(not JIT, reason="numba is not installed")

# After the warm-up, tunes unlike the tiny one (a memory limit or none, dp 1 or 8, ZeRO 0-2,
# tp 2, 16 devices over two nodes, every search to its end with the polish, the whole-cluster
# search) must compile nothing: numba reports each compile as a "numba:compile" event.
_PROBE = """
import json, sys
from numba.core import event
from octodsl.tune.warm import warm_up_tuner
from octodsl.tune.problem import Problem
from octodsl.tune.reference.compare import tune_and_compare
from octodsl.tune.cluster.search import search
from octodsl.tune.cluster.space import Cluster

compiled = warm_up_tuner()
names = []


class Compiles(event.Listener):
    def on_start(self, e):
        pass

    def on_end(self, e):
        names.append(e.data["dispatcher"].py_func.__qualname__ + str(e.data["args"]))


event.register("numba:compile", Compiles())
GIB = 2**30
for model, p, m, kw in [
    ("nemotron-h-tiny", 4, 8, dict(memory=GIB, dp=8, zero=1)),
    ("nemotron-h-tiny", 16, 32, dict(tp=2, dp=2, zero=2, runtime="megatron")),
    ("llama3-8b", 3, 6, dict()),
]:
    tune_and_compare(Problem.create(model, p, m, **kw), budget=30.0)
search(Cluster("nemotron-h-tiny", 16, 64, memory=GIB), budget=20.0)
print(json.dumps({"compiled": compiled, "after": names}))
"""


@pytest.mark.slow
@needs_numba
def test_nothing_compiles_after_the_warm_up(tmp_path):
    # an empty cache: every kernel the warm-up misses would compile (and be seen) later
    env = {**os.environ, "NUMBA_CACHE_DIR": str(tmp_path)}
    run = subprocess.run(
        [sys.executable, "-c", _PROBE], env=env, capture_output=True, text=True, timeout=900
    )
    assert run.returncode == 0, run.stderr
    out = json.loads(run.stdout.strip().splitlines()[-1])
    assert out["compiled"] > 0  # the warm-up did compile, on the empty cache
    assert out["after"] == []


@needs_numba
def test_seconds_compiling_counts_a_compile_once():
    import numba

    @numba.njit(cache=False)  # no disk cache: this process compiles it, at its first call
    def twice(x):
        return 2 * x

    assert seconds_compiling(lambda: twice(1.5)) > 0.0
    assert seconds_compiling(lambda: twice(2.5)) == 0.0  # compiled for float64 already
    assert seconds_compiling(lambda: twice(2)) > 0.0  # and now for int64


@needs_numba
def test_on_compile_is_called_once_when_compiling_starts():
    import numba

    @numba.njit(cache=False)
    def plus(x):
        return x + 1

    calls: list[int] = []
    seconds_compiling(lambda: (plus(1), plus(1.5)), lambda: calls.append(1))  # two compiles
    assert calls == [1]
    seconds_compiling(lambda: plus(2), lambda: calls.append(1))  # none
    assert calls == [1]


def test_the_warm_up_runs_once_per_process(monkeypatch):
    monkeypatch.setattr(warm, "_warm", False)
    monkeypatch.setattr(warm, "seconds_compiling", lambda run, on_compile: 7.0)
    assert warm.warm_up_tuner() == 7.0
    assert warm.warm_up_tuner() == 0.0  # seconds_compiling not called again


def test_ctrl_c_during_the_warm_up_stops_the_command(monkeypatch):
    # the tiny search's tune() keeps its best plan on Ctrl-C and returns; the warm-up must not
    # go on to the real search as if nothing happened
    from octodsl.tune.pipeline import loop

    score, seen = loop._Search.score, []

    def interrupted(self, *args):
        seen.append(1)
        if len(seen) == 5:
            raise KeyboardInterrupt
        return score(self, *args)

    monkeypatch.setattr(loop._Search, "score", interrupted)
    monkeypatch.setattr(warm, "_warm", False)
    with pytest.raises(KeyboardInterrupt):
        warm.warm_up_tuner()
    assert len(seen) == 5
    assert not warm._warm  # not done: a later call (the next tune) warms up again


def test_the_compile_is_left_out_of_the_budget(monkeypatch):
    # A warm-up that takes (and reports) 3 s of a 3 s budget: counted, nothing would be left
    # for the baselines and the tuner (the first baseline alone, no plan tuned).
    def slow_warm_up(on_compile):
        time.sleep(3.0)
        return 3.0

    warm.warm_up_tuner()  # the real one first: on a cold cache the search would compile
    monkeypatch.setattr(compare, "warm_up_tuner", slow_warm_up)
    out = compare.tune_and_compare(Problem.create("nemotron-h-tiny", 2, 4), budget=3.0)
    assert out.compiled == 3.0
    assert out.tuned.evaluations > 0
    assert sum(b.score is not None for b in out.baselines) > 1
    assert out.seconds < 3.0 * 1.5  # the search's own time, the warm-up's left out


def test_a_search_called_directly_compiles_before_its_budget(monkeypatch):
    # Tests and benchmarks call the search without the front door; a fresh clone's first such
    # tune() compiled inside its budget and returned a worse plan (make test caught it). A
    # compile of 1.5 s before a 1 s budget: counted, the search would simulate no plan.
    from octodsl.tune.pipeline import loop

    warm.warm_up_tuner()  # the real one first: on a cold cache the search would compile
    monkeypatch.setattr(warm, "_warm", False)
    monkeypatch.setattr(warm, "seconds_compiling", lambda run, on_compile: time.sleep(1.5) or 1.5)
    out = loop.tune(Problem.create("nemotron-h-tiny", 2, 4), budget=1.0)
    assert out.evaluations > 0
    assert warm._warm


def test_the_note_says_what_the_compile_took():
    assert compiled_note(0.0) == ""
    assert compiled_note(0.01) == ""
    note = compiled_note(31.25)
    assert "31.2 s" in note and "not counted in --budget" in note


def test_the_tiny_search_runs_all_its_plans_however_long_the_compile(monkeypatch):
    # Its budget counts the compile: on a loaded machine a 60 s one was used up, the tiny search
    # skipped moves, and their kernels compiled inside the real search's budget. Here every
    # clock read takes half a second.
    clock = [0.0]

    def slow_clock():
        clock[0] += 0.5
        return clock[0]

    monkeypatch.setattr(time, "perf_counter", slow_clock)
    results = []

    def tune(*args, **kwargs):
        results.append(real_tune(*args, **kwargs))
        return results[-1]

    real_tune = warm.tune
    monkeypatch.setattr(warm, "tune", tune)
    warm._tiny_search()
    assert results[0].evaluations == warm.EVALUATIONS
