"""The tuner's loop, baselines and the other searches on small problems."""

from __future__ import annotations

import pytest

from octodsl.lint import lint_plan
from octodsl.plan import Recompute
from octodsl.tune.pipeline.evaluate import Evaluator
from octodsl.tune.pipeline.layout import StageLayout
from octodsl.tune.pipeline.loop import SPLITS, tune
from octodsl.tune.pipeline.moves.placement import families
from octodsl.tune.problem import Problem
from octodsl.tune.reference.baselines import (
    PARTITIONS,
    SCHEDULES,
    best_baseline,
    classic_baselines,
)
from octodsl.tune.reference.random_search import random_search

GIB = 2**30


@pytest.fixture(scope="module")
def tiny():
    return Problem.create("nemotron-h-tiny", 4, 8, memory=80 * GIB)


@pytest.fixture(scope="module")
def tuned(tiny):
    return tune(tiny, budget=60, max_evaluations=400)


def _errors(plan):
    return [d for d in lint_plan(plan) if d.is_error]


def test_tuned_plan_lints_clean_and_fits(tiny, tuned):
    assert tuned.best.fits and not _errors(tuned.best.plan)
    assert (tuned.best.peak <= tiny.memory).all()
    assert tuned.best.time >= tiny.lower_bound()


def test_tuned_plan_beats_every_classic_baseline(tiny, tuned):
    baselines = classic_baselines(tiny)
    assert len(baselines) == len(SCHEDULES) * len(PARTITIONS)
    best = best_baseline(baselines)
    assert tuned.best.time <= best.score.time
    one_f_one_b = next(b for b in baselines if b.name == "1f1b-equal")
    assert one_f_one_b.usable and tuned.best.time < one_f_one_b.score.time


def test_rounds_explain_each_improvement(tuned):
    assert tuned.rounds[0].phase == "start"
    for r in tuned.rounds:
        assert r.phase in (
            "start",
            "kick",
            "memory",
            "partition",
            "placement",
            "schedule",
            "restart",
            "polish",
        )
        if r.phase in ("memory", "partition", "placement", "schedule"):
            # Score.better_than takes times within 1e-9 of each other as equal (then the lower
            # peak wins): a move may keep the time up to float noise.
            assert r.after <= r.before * (1 + 1e-9)


def test_same_seed_same_plan(tiny):
    a = tune(tiny, budget=60, seed=5, max_evaluations=120)
    b = tune(tiny, budget=60, seed=5, max_evaluations=120)
    assert a.best.plan.same_as(b.best.plan)
    assert [r.move for r in a.rounds] == [r.move for r in b.rounds]


def test_restarts_keep_the_best_of_the_searches(tiny):
    one = tune(tiny, budget=60, seed=3, restarts=1)
    three = tune(tiny, budget=60, seed=3, restarts=3)
    assert one.finished and three.finished
    assert three.best.time <= one.best.time
    searched = [r.move for r in one.rounds if r.phase != "polish"]
    assert [r.move for r in three.rounds[: len(searched)]] == searched
    marks = [r for r in three.rounds if r.phase == "restart"]
    assert [r.move for r in marks] == ["search again, seed 4", "search again, seed 5"]
    assert [r.number for r in three.rounds] == list(range(len(three.rounds)))
    assert three.evaluations > one.evaluations


def test_a_later_search_finds_what_it_finds_alone():
    # The searches share an evaluator, whose programs compiled for the search before time
    # this one's plans as fresh compiles do (the walk's ties go by the plan's order).
    p = Problem.create("llama3-8b", 16, 16, memory=80 * GIB, dp=8, zero=1)
    two = tune(p, budget=600, seed=3, restarts=2)
    alone = tune(
        Problem.create("llama3-8b", 16, 16, memory=80 * GIB, dp=8, zero=1),
        budget=600,
        seed=4,
        restarts=1,
    )
    assert two.finished and alone.finished
    k = next(i for i, r in enumerate(two.rounds) if r.phase == "restart")
    # the same moves with the same times: the same simulations of the same plans
    assert [(r.move, r.after) for r in two.rounds[k + 1 :] if r.phase != "polish"] == [
        (r.move, r.after) for r in alone.rounds if r.phase != "polish"
    ]


def test_the_polish_orders_the_searches_best_layouts_by_the_pilot_method(tiny):
    out = tune(tiny, budget=60, seed=3, restarts=2)
    assert out.finished and len(out.finalists) == 2
    polished = [r for r in out.rounds if r.phase == "polish"]
    assert 1 <= len(polished) <= 2 and out.rounds[-len(polished) :] == polished
    assert out.best.time <= min(s.time for s, _ in out.finalists)
    for r in polished:
        assert r.move == "the pilot method's order for the layout of a search's best plan"
    again = tune(tiny, budget=60, seed=3, restarts=2)
    assert again.best.plan.same_as(out.best.plan)


def test_refines_a_given_plan_and_never_returns_worse(tiny):
    start = best_baseline(classic_baselines(tiny)).score.plan
    out = tune(tiny, budget=60, starts=[start], max_evaluations=60)
    assert any(name.startswith("given plan") for name, _ in out.starts)
    assert out.best.time <= Evaluator(tiny)(start).time


def test_a_tight_memory_limit_is_respected():
    free = tune(Problem.create("nemotron-h-tiny", 4, 16), budget=60, max_evaluations=80)
    limit = int(0.6 * free.best.peak.max())  # binds: the free plan peaks above it
    pr = Problem.create("nemotron-h-tiny", 4, 16, memory=limit)
    out = tune(pr, budget=60, max_evaluations=150)
    assert out.best.fits and (out.best.peak <= limit).all() and not _errors(out.best.plan)


def test_baselines_that_cannot_be_built_say_why():
    pr = Problem.create("jamba-tiny", 8, 8)  # 18 layers: no room for 4 chunks per device
    out = {b.name: b for b in classic_baselines(pr)}
    assert out["interleaved-v4-time"].score is None and "stages" in out["interleaved-v4-time"].error
    assert out["1f1b-equal"].usable


def test_random_search_is_deterministic_for_a_seed(tiny):
    a, n = random_search(tiny, budget=60, seed=1, max_evaluations=15)
    b, _ = random_search(tiny, budget=60, seed=1, max_evaluations=15)
    assert n == 15 and a.plan.same_as(b.plan) and not _errors(a.plan)


def _interrupt_after(calls: int):
    """A progress display whose user presses Ctrl-C at its `calls`-th update."""
    seen = []

    def progress(phase, best, left):
        seen.append(phase)
        if len(seen) == calls:
            raise KeyboardInterrupt

    return progress


def test_ctrl_c_keeps_the_best_plan_so_far(tiny):
    # Ctrl-C in the rounds: ten simulations after the search's starts (one each)
    starts = len(tune(tiny, budget=60, seed=3, restarts=1).starts)
    out = tune(tiny, budget=60, seed=3, restarts=1, progress=_interrupt_after(starts + 10))
    assert out.interrupted and not out.finished
    assert out.best.fits and not _errors(out.best.plan)
    assert out.evaluations == starts + 9  # the last simulation was not run
    assert out.best.time == min(r.after for r in out.rounds)


def test_ctrl_c_in_a_restart_keeps_the_earlier_searches(tiny):
    first = tune(tiny, budget=60, seed=3, restarts=1)
    searched = [r for r in first.rounds if r.phase != "polish"]
    polished = len(first.rounds) - len(searched)  # one simulation each, after the search
    out = tune(
        tiny,
        budget=60,
        seed=3,
        restarts=3,
        progress=_interrupt_after(first.evaluations - polished + 1),
    )
    # interrupted: no polish, the first search's best
    assert out.interrupted and out.best.time == first.finalists[0][0].time
    assert [r.phase for r in out.rounds[len(searched) :]] == ["restart"]


def test_ctrl_c_before_any_plan_is_passed_on(tiny):
    with pytest.raises(KeyboardInterrupt):
        tune(tiny, budget=60, progress=_interrupt_after(1))


def test_no_searches_is_refused_in_one_line(tiny):
    with pytest.raises(ValueError, match="restarts must be at least 1, not 0"):
        tune(tiny, budget=60, seed=3, restarts=0)


def test_later_seeds_also_start_from_full_recompute_early_and_selective_late(tiny):
    def splits(out):
        found = []
        for name, score in out.starts:
            if "full recompute before layer" in name:
                layer = int(name.split("before layer ")[1].split(",")[0])
                found.append((layer, StageLayout.of(score.plan)))
        return found

    for seed in (0, 1, 2, 6):
        assert splits(tune(tiny, budget=60, seed=seed, restarts=1, max_evaluations=60)) == []
    found = splits(tune(tiny, budget=60, seed=3, restarts=1, max_evaluations=60))
    # seed 3 takes the first share: a third of the layers, on each family placement twice
    # (the list scheduler with and without W held for gaps)
    assert {layer for layer, _ in found} == {round(SPLITS[0] * tiny.num_layers)}
    assert len(found) == 2 * len(families(tiny.devices, tiny.num_layers))
    for layer, lay in found:
        # the modes follow the cuts: full on the stages that start before the layer
        assert lay.recompute == tuple(
            Recompute.FULL if a < layer else Recompute.SELECTIVE for a in lay.cuts[:-1]
        )
        assert Recompute.FULL in lay.recompute and Recompute.SELECTIVE in lay.recompute


def test_no_split_starts_without_a_memory_limit_or_with_recompute_fixed():
    for p in (
        Problem.create("nemotron-h-tiny", 4, 8),
        Problem.create("nemotron-h-tiny", 4, 8, memory=80 * GIB, recompute=Recompute.FULL),
    ):
        out = tune(p, budget=60, seed=3, restarts=1, max_evaluations=60)
        assert not any("full recompute before layer" in name for name, _ in out.starts)
