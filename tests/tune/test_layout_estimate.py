"""Layouts and the partition phase's closed-form bound."""

from __future__ import annotations

import pytest

from octodsl.plan import PlanError
from octodsl.tune.pipeline.estimate import FillModel
from octodsl.tune.pipeline.layout import StageLayout, even_cuts, looped, v_shape

from .helpers import HELD, problem


def test_layout_round_trips_through_a_plan():
    pr = problem([1.0] * 8, 2, 2)
    lay = StageLayout((0, 1, 4, 6, 8), (0, 1, 1, 0))
    plan = pr.skeleton(lay)
    assert StageLayout.of(plan) == lay
    assert [(s.first, s.last) for s in plan.stages] == [(0, 0), (1, 3), (4, 5), (6, 7)]
    assert [p.stages for p in plan.placement] == [(0, 3), (1, 2)]


def test_layout_rejects_bad_cuts_and_abstract_plans():
    with pytest.raises(ValueError):
        StageLayout((0, 2, 2, 4), (0, 1, 0))
    with pytest.raises(ValueError):
        StageLayout((1, 4), (0,))
    from octodsl.plan import Header, Plan, Stage, placement_loop

    abstract = Plan(
        Header(name="a", devices=1, microbatches=1), [Stage()], placement_loop(1, 1), [[]]
    )
    with pytest.raises(PlanError):
        StageLayout.of(abstract)


def test_families_and_even_cuts():
    assert looped(3, 2) == (0, 1, 2, 0, 1, 2)
    assert v_shape(3) == (0, 1, 2, 2, 1, 0)
    assert even_cuts(10, 4) == (0, 2, 5, 8, 10)


def test_bound_on_uniform_one_stage_per_device_is_the_optimum():
    # Two devices, F = B = W = 1 per stage, two micro-batches: 3M + P - 1 = 7 (device 0 waits
    # one unit for its first backward); the score adds a thousandth of the devices' mean.
    pr = problem([3.0, 3.0], 2, 2)
    assert FillModel(pr, (0, 1))((0, 1, 2)) == pytest.approx(7 + 1e-3 * (7 + 7) / 2)


def test_bound_prefers_less_work_on_late_devices():
    # Moving work off the device that starts last lowers the bound.
    pr = problem([1.0] * 12, 2, 4)
    model = FillModel(pr, (0, 1))
    assert model((0, 7, 12)) < model((0, 5, 12))


def test_bound_ranks_layouts_that_do_not_fit_by_their_overflow():
    # Six layers holding 4 static bytes, 1 byte of activations each per micro-batch.
    fits = FillModel(problem([1.0] * 6, 2, 2, memory=15, static=4.0 / HELD), (0, 1))
    assert fits((0, 3, 6)) < 1e6
    tight = FillModel(problem([1.0] * 6, 2, 2, memory=14, static=4.0 / HELD), (0, 1))
    assert 1e6 < tight((0, 3, 6)) < tight((0, 4, 6))  # overflow 1 + 1 against 6 + 0
