"""The budget is a limit: neither the baselines nor the tuner start work they would likely not
finish before the deadline. Timed on a fake clock that only the work moves (each simulation
and each start built takes a fixed number of fake seconds), so the tests time nothing real."""

from __future__ import annotations

import time

import pytest

from octodsl.tune import warm
from octodsl.tune.pipeline import loop
from octodsl.tune.pipeline.evaluate import Evaluator
from octodsl.tune.problem import Problem
from octodsl.tune.reference.baselines import NOT_RUN, classic_baselines
from octodsl.tune.reference.compare import tune_and_compare
from octodsl.tune.reference.report import comparison_table, to_json


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0
        self.late = []
        """Work started at or past these deadlines."""

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock(monkeypatch):
    c = Clock()
    monkeypatch.setattr(time, "perf_counter", c)
    # the warm-up's simulations would move the fake clock too (tests/tune/test_warm.py)
    monkeypatch.setattr(warm, "_warm", True)
    return c


def costs(monkeypatch, clock, simulate: float, build_start: float = 0.0) -> None:
    """Each simulation takes `simulate` fake seconds, building a tuner's start `build_start`."""
    evaluate = Evaluator.__call__

    def timed_evaluate(self, plan):
        clock.now += simulate
        return evaluate(self, plan)

    rebuild = loop.rebuild

    def timed_rebuild(*args, **kwargs):
        clock.now += build_start
        return rebuild(*args, **kwargs)

    monkeypatch.setattr(Evaluator, "__call__", timed_evaluate)
    monkeypatch.setattr(loop, "rebuild", timed_rebuild)


@pytest.fixture(scope="module")
def tiny():
    return Problem.create("nemotron-h-tiny", 4, 8)


def test_the_tuner_does_not_build_a_start_it_cannot_finish(monkeypatch, clock, tiny):
    # A start takes 5 s to build and 1 s to simulate: with 20 s, three fit (18 s); a fourth
    # would end at 24 s. Before, the budget was checked only before simulating, after building.
    costs(monkeypatch, clock, simulate=1.0, build_start=5.0)
    t0 = clock.now
    out = loop.tune(tiny, budget=20.0)
    assert not out.finished and out.evaluations == 3
    assert clock.now - t0 <= 20.0


def test_the_tuner_stops_within_the_budget_when_simulating_is_dear(monkeypatch, clock, tiny):
    costs(monkeypatch, clock, simulate=2.0)
    t0 = clock.now
    out = loop.tune(tiny, budget=15.0)
    assert not out.finished and clock.now - t0 <= 15.0 and out.evaluations >= 1


def test_baselines_past_the_deadline_are_not_run(monkeypatch, clock, tiny):
    costs(monkeypatch, clock, simulate=1.0)
    t0 = clock.now
    out = classic_baselines(tiny, deadline=t0 + 3.5)
    run = [b for b in out if b.error != NOT_RUN]
    assert [b.seconds for b in run] == [1.0, 1.0, 1.0] and clock.now - t0 == 3.0
    assert len(out) == 21 and [b.name for b in run] == [
        "1f1b-time",
        "1f1b-parameters",
        "1f1b-equal",
    ]


def test_tune_and_compare_keeps_to_the_budget(monkeypatch, clock, tiny):
    # Half of 10 s for the baselines (5 of 1 s each: a sixth would end past 5 s), the rest
    # for the tuner; the baselines left out are reported as not run.
    costs(monkeypatch, clock, simulate=1.0)
    t0 = clock.now
    out = tune_and_compare(tiny, budget=10.0)
    assert clock.now - t0 <= 10.0 and out.seconds <= 10.0
    assert sum(b.error != NOT_RUN for b in out.baselines) == 5
    data = to_json(tiny, out.tuned, out.baselines, "t.octo")
    assert len(data["not_run"]) == 16 and data["baselines"][data["not_run"][0]] is None
    from rich.console import Console

    console = Console(width=200, record=True)
    console.print(comparison_table(tiny, out.tuned, out.baselines))
    assert "not run (budget)" in console.export_text()


def test_no_time_for_the_tuner_keeps_the_best_baseline(monkeypatch, clock, tiny):
    costs(monkeypatch, clock, simulate=3.0)
    t0 = clock.now
    out = tune_and_compare(tiny, budget=4.0)
    assert clock.now - t0 == 3.0  # one baseline; the 1 s left would not simulate a plan
    assert out.tuned.evaluations == 0 and not out.tuned.finished
    assert out.tuned.best is out.baselines[0].score


def test_only_the_best_layout_is_polished_past_its_estimate(monkeypatch, clock, tiny):
    # The best plan's layout gets the pilot method with whatever time is left (it stops at the
    # deadline); another layout only when its estimate fits, else the tuner reports it stopped
    # short. Two searches' best plans on two layouts:
    from octodsl.tune.pipeline.layout import StageLayout, even_cuts
    from octodsl.tune.pipeline.moves.schedule import rebuild

    evaluate = Evaluator(tiny)
    scores = [
        evaluate(rebuild(tiny.skeleton(StageLayout(cuts, (0, 1, 2, 3))), tiny, True))
        for cuts in (even_cuts(tiny.num_layers, 4), (0, 1, 2, 3, tiny.num_layers))
    ]
    assert StageLayout.of(scores[0].plan) != StageLayout.of(scores[1].plan)
    for estimate, polished in ((1e6, 1), (1.0, 2)):
        monkeypatch.setattr(loop, "pilot_seconds", lambda *args, e=estimate: e)
        best = min(scores, key=lambda s: s.time)
        out = loop.TuneResult(best, [], 0, True, finalists=[(s, True) for s in scores])
        t0 = clock.now
        loop._polish(tiny, evaluate, out, clock.now + 60.0, None)
        assert len([r for r in out.rounds if r.phase == "polish"]) == polished
        assert out.finished == (polished == 2) and clock.now - t0 <= 60.0


def test_a_polish_longer_than_its_estimate_stops_at_the_deadline(monkeypatch, clock, tiny):
    # The estimate is rough: a pilot method that runs long (here each chunk of its steps takes
    # 5 fake seconds) stops trying alternatives at the deadline and the walk finishes its order.
    from octodsl.tune.pipeline import construct

    costs(monkeypatch, clock, simulate=0.001)
    monkeypatch.setattr(loop, "pilot_seconds", lambda *args: 1.0)
    steps = construct._pilot_steps

    def slow_steps(*args):
        clock.now += 5.0
        return steps(*args)

    monkeypatch.setattr(construct, "_pilot_steps", slow_steps)
    t0 = clock.now
    out = loop.tune(tiny, budget=60.0, restarts=1)
    assert [r for r in out.rounds if r.phase == "polish"]
    assert clock.now - t0 <= 60.0 + 5.0  # the chunk under way when the deadline came


def test_the_searches_leave_a_share_of_the_budget_to_a_long_polish(monkeypatch, clock, tiny):
    # A polish estimated to take longer than POLISH_SHARE of the budget still gets that share:
    # the searches end before it, and the pilot method runs until the deadline, keeping what
    # its steps found (before, the searches took the whole budget and left it nothing).
    # tiny's first search takes about 350 simulations: it ends well within the budget, the
    # later ones would not
    costs(monkeypatch, clock, simulate=0.01)
    monkeypatch.setattr(loop, "pilot_seconds", lambda *args: 1e6)
    polish = loop._polish
    started = []

    def timed_polish(*args):
        started.append(clock.now)
        return polish(*args)

    monkeypatch.setattr(loop, "_polish", timed_polish)
    t0, budget = clock.now, 10.0
    out = loop.tune(tiny, budget=budget)
    assert not out.finished and [r for r in out.rounds if r.phase == "polish"]
    assert t0 + 0.99 * budget - started[0] >= loop.POLISH_SHARE * budget
