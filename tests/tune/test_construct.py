"""The list scheduler: valid, deterministic orders; known optima on uniform stages; memory."""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import pytest

from octodsl.costs.table import Link
from octodsl.lint import lint_plan
from octodsl.plan import Recompute
from octodsl.tune.pipeline import construct
from octodsl.tune.pipeline.construct import build_schedule
from octodsl.tune.pipeline.estimate import FillModel
from octodsl.tune.pipeline.evaluate import Evaluator
from octodsl.tune.pipeline.layout import StageLayout, even_cuts, looped, v_shape
from octodsl.tune.problem import Problem

from ..conftest import check_golden
from .helpers import problem

GOLDEN = Path(__file__).parent / "data" / "golden_construct.json"


def _plan(pr, devices):
    layout = StageLayout(even_cuts(pr.num_layers, len(devices)), devices)
    skel = pr.skeleton(layout)
    return build_schedule(skel, pr.stage_costs(skel), pr.link, pr.memory)


@pytest.mark.parametrize("P,M", [(2, 2), (4, 8), (4, 13)])
def test_one_stage_per_device_meets_the_fill_bound(P, M):
    # F = B = W = 1 per stage: no schedule with one stage per device beats 3M + (P - 1)
    # (the last device waits P - 1 forwards); ZB-H2's order reaches it when memory allows.
    pr = problem([3.0] * P, P, M)
    plan = _plan(pr, looped(P, 1))
    assert not [d for d in lint_plan(plan) if d.is_error]
    assert Evaluator(pr)(plan).time == pytest.approx(3 * M + P - 1)


def test_v_shape_meets_zb_v():
    # Chunks of F = B = W = 1/2: ZB-V's 3M + (P - 1)/2.
    P, M = 4, 8
    pr = problem([1.5] * 2 * P, P, M)
    plan = _plan(pr, v_shape(P))
    assert not [d for d in lint_plan(plan) if d.is_error]
    assert Evaluator(pr)(plan).time == pytest.approx(3 * M + (P - 1) / 2)


def test_orders_are_deterministic_and_complete():
    pr = problem([1.0, 2.0, 0.5, 3.0, 1.0, 1.0, 2.0, 0.2], 3, 5)
    devices = (0, 1, 2, 2, 1, 0, 1, 2)
    a, b = _plan(pr, devices), _plan(pr, devices)
    assert a.schedule == b.schedule
    ops = sorted(op.key() for _, _, op in a.ops())
    assert len(ops) == len(set(ops)) == 3 * len(devices) * 5
    assert not [d for d in lint_plan(a) if d.is_error]


def test_memory_budget_bounds_the_peak():
    # Each stage holds 1 byte per micro-batch in flight; without a limit the first device
    # runs every forward before its first backward comes back.
    P, M = 4, 16
    free = Evaluator(problem([3.0] * P, P, M))(_plan(problem([3.0] * P, P, M), looped(P, 1)))
    assert free.peak.max() > 4
    tight = problem([3.0] * P, P, M, memory=4)
    s = Evaluator(tight)(_plan(tight, looped(P, 1)))
    assert s.fits and s.peak.max() <= 4
    assert s.time == pytest.approx(3 * M + P - 1)  # 1F1B's depth is enough on uniform stages


def test_a_device_that_cannot_hold_one_microbatch_still_gets_an_order():
    pr = problem([3.0, 3.0], 2, 3, memory=1, act=2.0)
    s = Evaluator(pr)(_plan(pr, looped(2, 1)))
    assert s.time < float("inf") and not s.fits


def test_orders_are_the_recorded_ones():
    # The constructor's decisions compare sums of the same costs in the same order on any
    # machine (scalar IEEE arithmetic, no library reductions), so its orders are exact:
    # uneven, non-dyadic costs make ties rare and any change of arithmetic visible.
    layers = [(0.11 + 0.07 * i, 0.13 + 0.05 * (i % 3), 0.05 + 0.031 * i) for i in range(8)]
    link = Link("odd", 0.013, 70.0)
    cases = {
        "looped 3 devices, memory 6": (
            problem(layers, 3, 5, memory=6, link=link),
            (0, 1, 2, 2, 1, 0, 1, 2),
            True,
        ),
        "looped 3 devices, no w gap": (
            problem(layers, 3, 5, link=link),
            (0, 1, 2, 2, 1, 0, 1, 2),
            False,
        ),
        "v shape 2 devices, memory 5": (
            problem(layers, 2, 6, memory=5, act=1.3, link=link),
            v_shape(2),
            True,
        ),
    }
    out = {}
    for name, (pr, devices, w_gap) in cases.items():
        skel = pr.skeleton(StageLayout(even_cuts(pr.num_layers, len(devices)), devices))
        plan = build_schedule(skel, pr.stage_costs(skel), pr.link, pr.memory, w_gap)
        out[name] = [" ".join(str(slot) for slot in order) for order in plan.schedule]
    check_golden(GOLDEN, json.dumps(out, indent=1) + "\n")


@pytest.mark.parametrize("mode", [Recompute.SELECTIVE, Recompute.FULL])
def test_orders_with_recompute_stay_within_the_limit(mode):
    # Under recompute a B leaves its micro-batch's part for W held, more than F kept (full
    # keeps only the stage input), and holds what it recomputes while it runs: the list
    # scheduler counts both, so its orders stay within the limit wherever one micro-batch fits
    # (as the bubble-aware estimate says). Counting neither, its orders went 2.4x (selective)
    # and 6.6x (full) over 120 MiB.
    checked = 0
    for memory in (120, 160, 200):
        pr = Problem.create("nemotron-h-tiny", 4, 16, memory=memory * 2**20, recompute=mode)
        for devices in (looped(4, 1), v_shape(4)):
            layout = StageLayout(even_cuts(pr.num_layers, len(devices)), devices)
            model = FillModel(pr, devices, pr.modes_of(layout))
            if not model.fits(model(layout.cuts)):
                continue
            skel = pr.skeleton(layout)
            for w_gap, pilot in itertools.product((False, True), (False, True)):
                score = Evaluator(pr)(
                    build_schedule(
                        skel, pr.stage_costs(skel), pr.link, pr.memory, w_gap=w_gap, pilot=pilot
                    )
                )
                assert score.plan.recompute() == [mode] * len(devices)
                assert score.fits, (memory, devices, w_gap, pilot, score.peak.max() / 2**20)
                checked += 1
    assert checked >= 8


def test_the_pilot_method_never_ends_later_than_the_walk():
    # Uneven stages on looped and V placements, with and without a memory limit: the pilot
    # method keeps the walk's choice unless another ends sooner, so its end (by the
    # scheduler's timing) is never later, and on some of these it is sooner.
    layers = [(0.11 + 0.07 * i, 0.13 + 0.05 * (i % 3), 0.05 + 0.031 * i) for i in range(8)]
    link = Link("odd", 0.013, 70.0)
    sooner = 0
    for memory, devices, w_gap in itertools.product(
        (None, 6), ((0, 1, 2, 2, 1, 0, 1, 2), (0, 1, 2, 0, 1, 2, 0, 1)), (False, True)
    ):
        pr = problem(layers, 3, 6, memory=memory, link=link)
        skel = pr.skeleton(StageLayout(even_cuts(pr.num_layers, len(devices)), devices))
        x = construct._arrays(skel, pr.stage_costs(skel), pr.link, pr.memory, w_gap)
        _, walk = construct._walk(x)
        _, pilot = construct._pilot(x)
        assert pilot <= walk
        sooner += pilot < walk - 1e-12
        plan = build_schedule(skel, pr.stage_costs(skel), pr.link, pr.memory, w_gap, pilot=True)
        assert (
            plan.schedule
            == build_schedule(
                skel, pr.stage_costs(skel), pr.link, pr.memory, w_gap, pilot=True
            ).schedule
        )
        assert not [d for d in lint_plan(plan) if d.is_error]
    assert sooner > 0


def test_a_pilot_cut_short_is_finished_by_the_walk_and_ends_no_later():
    # Stopped after each possible chunk, the order the walk finishes from the pilot's state
    # ends when the pilot's best rollout so far does, never later than the walk alone.
    layers = [(0.11 + 0.07 * i, 0.13 + 0.05 * (i % 3), 0.05 + 0.031 * i) for i in range(8)]
    pr = problem(layers, 3, 6, memory=6, link=Link("odd", 0.013, 70.0))
    devices = (0, 1, 2, 2, 1, 0, 1, 2)
    skel = pr.skeleton(StageLayout(even_cuts(pr.num_layers, len(devices)), devices))
    x = construct._arrays(skel, pr.stage_costs(skel), pr.link, pr.memory, True)
    _, walk = construct._walk(x)
    n = 3 * x.num_stages * x.microbatches
    for stop in (0, 1, n // 3, n - 1):
        p = construct._pilot_start(x)
        best = construct._pilot_steps(x, p, p.best, 0, stop)
        assert construct._run(x, p.st, p.c, p.out, stop)
        assert p.st.device_free.max() == best <= walk  # the same rollout: the same sums
    plan = build_schedule(
        skel, pr.stage_costs(skel), pr.link, pr.memory, True, pilot=True, deadline=0.0
    )
    assert not [d for d in lint_plan(plan) if d.is_error]
