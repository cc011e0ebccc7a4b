"""Each move on small plans whose effect (or optimum) is known."""

from __future__ import annotations

import ast
import os
import subprocess
import sys

import pytest

from octodsl.lint import lint_plan
from octodsl.partition import balance_time
from octodsl.tune.pipeline.evaluate import Evaluator
from octodsl.tune.pipeline.layout import StageLayout, even_cuts, looped, v_shape
from octodsl.tune.pipeline.moves import memory, partition, placement, schedule

from ..conftest import REPO
from .helpers import HELD, problem
from .plans import with_orders

TWO = StageLayout((0, 1, 2), (0, 1))


# -- partition ---------------------------------------------------------------------------------


def test_shift_moves_a_cut_and_keeps_stages_non_empty():
    lay = StageLayout((0, 2, 4, 6), (0, 1, 2))
    assert partition.shift(lay, 1, 1).cuts == (0, 3, 4, 6)
    assert partition.shift(lay, 2, -1).cuts == (0, 2, 3, 6)
    assert partition.shift(lay, 1, 2) is None  # stage 1 would be empty
    assert partition.shift(lay, 0, 1) is None  # the model's start is not a cut


def test_rebalance_reaches_the_time_balanced_optimum_when_fill_is_negligible():
    work = [5.0, 1.0, 2.0, 7.0, 3.0, 3.0, 2.0, 4.0, 1.0, 6.0]
    pr = problem(work, 3, 500)
    best = partition.rebalance(StageLayout((0, 1, 2, 10), looped(3, 1)), pr)
    # strict=False: consecutive pairs, cuts[1:] is one shorter
    loads = [sum(work[a:b]) for a, b in zip(best.cuts, best.cuts[1:], strict=False)]
    optimum = max(sum(work[a : b + 1]) for a, b in balance_time(work, 3))
    assert max(loads) == optimum


def rebalanced() -> dict[int, tuple[int, ...]]:
    """Cuts that the random kicks find differently for different seeds."""
    work = [
        1.5,
        6.0,
        5.2,
        1.2,
        2.3,
        4.5,
        4.4,
        5.7,
        2.8,
        5.1,
        4.2,
        2.2,
        3.7,
        5.4,
        5.2,
        3.3,
        3.7,
        0.7,
        1.8,
        4.9,
    ]
    start = StageLayout(even_cuts(len(work), 8), v_shape(4))
    return {
        seed: partition.rebalance(start, problem(work, 4, 4), seed=seed).cuts for seed in range(4)
    }


def test_rebalance_is_deterministic_for_a_seed():
    # Fresh processes with other hash seeds (other set and dict orders, another global random
    # state) must find what this one finds; on a problem where the seed makes a difference, so
    # that a search depending on anything else would show.
    here = rebalanced()
    assert len(set(here.values())) > 1, "the seed makes no difference on this problem"
    code = "from tests.tune.test_moves import rebalanced; print(repr(rebalanced()))"
    for hash_seed in ("1", "2"):
        out = subprocess.run(
            [sys.executable, "-c", code],
            capture_output=True,
            text=True,
            check=True,
            cwd=REPO,
            env={**os.environ, "PYTHONHASHSEED": hash_seed},
        ).stdout
        assert ast.literal_eval(out) == here


def test_relieve_moves_a_layer_off_the_busiest_device():
    lay = StageLayout((0, 3, 5, 6), (0, 1, 2))
    out = partition.relieve(lay, busy=[9.0, 2.0, 1.0])
    assert [x.cuts for x in out] == [(0, 2, 5, 6)]
    out = partition.relieve(lay, busy=[1.0, 9.0, 2.0])
    # Device 1 gives its first layer to device 0 (the least busy), else its last to device 2.
    assert [x.cuts for x in out] == [(0, 4, 5, 6), (0, 3, 4, 6)]


def test_carry_passes_a_layer_along_the_stages_to_a_light_device():
    # Looped on 4 devices: device 0 (stages 0 and 4) is the busiest, device 2 the lightest;
    # devices 1 and 3 as loaded as each other.
    lay = StageLayout((0, 2, 4, 6, 8, 10, 12, 14, 16), (0, 1, 2, 3, 0, 1, 2, 3))
    out = partition.carry(lay, [9.0, 5.0, 1.0, 5.0], source=0)
    # Stage 0 gives its last layer, stage 1 passes one on, stage 2 (device 2) gains one; from
    # stage 4, forward to stage 6 and back to stage 2 (chains of 2 stages each): the lower
    # giving stage first on a tie.
    assert [(s, t) for s, t, _ in out] == [(0, 2), (4, 2), (4, 6)]
    assert out[0][2].cuts == (0, 1, 3, 6, 8, 10, 12, 14, 16)
    assert out[1][2].cuts == (0, 2, 4, 7, 9, 10, 12, 14, 16)
    assert out[2][2].cuts == (0, 2, 4, 6, 8, 9, 11, 14, 16)
    # Per device, the layers counted: only the source and the receiver change.
    for _, _, new in out:
        counts = [
            sum(new.cuts[s + 1] - new.cuts[s] for s in stages) for stages in new.device_stages(4)
        ]
        assert counts == [3, 4, 5, 4]
    # No receiver lighter than the source beyond the neighbours: nothing to carry.
    assert partition.carry(lay, [1.0, 5.0, 5.0, 5.0], source=0) == []
    # A chain never passes through the source's own stages, nor empties a stage.
    thin = StageLayout((0, 1, 2, 3, 4), (0, 1, 2, 0))
    assert partition.carry(thin, [9.0, 5.0, 1.0], source=0) == []


def test_memory_bound_where_fewer_whole_micro_batches_fit_than_devices():
    # 4 devices of 10 bytes, 4 layers of 1 byte of activations each: 40 bytes free hold 10
    # micro-batches' activations (4 bytes each), more than the 4 devices.
    assert not partition.memory_bound(problem([3.0] * 4, devices=4, microbatches=8, memory=10))
    # 8 bytes of static per layer (its device's, as held): 8 free bytes hold 2.
    held = problem([3.0] * 4, devices=4, microbatches=8, memory=10, static=8 / HELD)
    assert partition.memory_bound(held)
    assert not partition.memory_bound(problem([3.0] * 4, devices=4, microbatches=8))


# -- placement ---------------------------------------------------------------------------------

# Three 50-byte layers (MoE-like) and three of 10 on 3 devices of 100 bytes, one byte of
# activations per layer: two 50s on one device (102 bytes with one micro-batch) never fit, so
# equal work per device (cuts 0, 2, 4, 6) does not, and the only cuts that do are 0, 1, 2, 6.
HEAVY = dict(work=[3.0] * 6, devices=3, microbatches=4, static=[50.0, 50.0, 50.0, 10.0, 10.0, 10.0])


def test_fitting_finds_the_only_cuts_that_fit():
    pr = problem(**HEAVY, memory=100)
    even = StageLayout((0, 2, 4, 6), (0, 1, 2))
    assert partition.fitting(even, pr).cuts == (0, 1, 2, 6)


def test_fitting_says_none_when_no_cuts_fit_or_there_is_no_limit():
    assert (
        partition.fitting(
            StageLayout((0, 3, 6), (0, 1)), problem(**(HEAVY | {"devices": 2}), memory=100)
        )
        is None
    )
    assert partition.fitting(StageLayout((0, 2, 4, 6), (0, 1, 2)), problem(**HEAVY)) is None


def test_fitting_gets_jamba_into_80_gib_where_shifts_do_not():
    # jamba-v0.1's MoE layers hold 45 GiB each: one per device of 80 GiB. From equal layer
    # counts, one-layer shifts end with two on some device; the fitting cuts, then shifts, fit.
    from octodsl.tune.pipeline.estimate import FillModel
    from octodsl.tune.problem import Problem

    pr = Problem.create("jamba-v0.1", 16, 32, memory=80 * 2**30)
    devices = looped(16, 1)
    model = FillModel(pr, devices)
    shifted = partition.rebalance(StageLayout(even_cuts(pr.num_layers, 16), devices), pr)
    assert not model.fits(model(shifted.cuts))
    fit = partition.fitting(shifted, pr)
    assert model.fits(model(fit.cuts))
    assert model.fits(model(partition.rebalance(fit, pr).cuts))


def test_disperse_splits_a_stage_onto_another_device():
    lay = StageLayout((0, 4, 6), (0, 1))
    assert placement.disperse(lay, 0, 1) == StageLayout((0, 2, 4, 6), (0, 1, 1))
    assert placement.disperse(StageLayout((0, 1, 6), (0, 1)), 0, 1) is None  # one layer
    assert placement.disperse(lay, 0, 0) is None  # already there


def test_exchange_on_a_v_trades_layers_between_two_devices():
    lay = StageLayout((0, 2, 4, 6, 8), v_shape(2))  # device 0: stages 0, 3; device 1: 1, 2
    out = placement.exchange(lay, 0, earlier=True)
    assert out.cuts == (0, 3, 4, 7, 8)  # device 0: layers 0..2 and 7; device 1 keeps 4
    assert placement.exchange(StageLayout((0, 1, 2), (0, 1)), 0, True) is None


def test_merge_joins_neighbouring_stages_of_one_device():
    merged = placement.merge(StageLayout((0, 1, 3, 4, 6), (0, 0, 1, 0)))
    assert merged == StageLayout((0, 3, 4, 6), (0, 1, 0))


def test_families_need_enough_layers():
    names = [n for n, _ in placement.families(4, 10)]
    assert names == ["v", "loop1", "loop2"]


# -- schedule ----------------------------------------------------------------------------------


def _time(pr, plan):
    return Evaluator(pr)(plan).time


def test_fill_gaps_advances_a_ready_forward_into_a_gap():
    # Device 0 runs F0:1 only after its first backward: a 2-unit gap after F0:0. Advancing it
    # fills the gap; 10 -> 8.
    pr = problem([3.0, 3.0], 2, 2)
    plan = with_orders(pr, TWO, "F0:0 B0:0 W0:0 F0:1 B0:1 W0:1", "F1:0 B1:0 W1:0 F1:1 B1:1 W1:1")
    s = Evaluator(pr)(plan)
    assert s.time == 10
    from octodsl.plan import OpKind

    out = schedule.fill_gaps(plan, s.result, (OpKind.F, OpKind.B))
    assert min(_time(pr, p) for p in out) == 8
    assert all(not [d for d in lint_plan(p) if d.is_error] for p in out)


def test_delay_w_twice_reaches_the_optimum():
    # 1F1B with W right after each B: 8; the optimum for P = 2, M = 2 is 3M + P - 1 = 7.
    pr = problem([3.0, 3.0], 2, 2)
    plan = with_orders(pr, TWO, "F0:0 F0:1 B0:0 W0:0 B0:1 W0:1", "F1:0 B1:0 W1:0 F1:1 B1:1 W1:1")
    ev = Evaluator(pr)
    s = ev(plan)
    assert s.time == 8
    for _ in range(2):
        s = min((ev(p) for p in schedule.delay_w(s.plan, s.result)), key=lambda x: x.time)
    assert s.time == 7


def test_rebuild_orders_by_list_scheduling():
    pr = problem([3.0, 3.0], 2, 4)
    plan = schedule.rebuild(pr.skeleton(TWO), pr, w_gap=False)
    assert _time(pr, plan) == pytest.approx(3 * 4 + 1)


# -- memory ------------------------------------------------------------------------------------


def test_advance_w_lowers_the_peak():
    # One device: F allocates 1, B frees half, W the rest. Peak 1.5 at F0:1; with W0:0 before
    # it, 1.
    pr = problem([3.0], 1, 2, memory=1)
    plan = with_orders(pr, StageLayout((0, 1), (0,)), "F0:0 B0:0 F0:1 B0:1 W0:0 W0:1")
    s = Evaluator(pr)(plan)
    assert s.peak[0] == 1.5 and not s.fits
    assert memory.over_limit(s.result, 1) == [0]
    fixed = Evaluator(pr)(memory.advance_w(plan, s.result, 0))
    assert fixed.peak[0] == 1.0 and fixed.fits
    assert memory.advance_w(fixed.plan, fixed.result, 0) is None


def test_a_deadlocking_order_scores_infinity_and_is_never_better():
    pr = problem([3.0, 3.0], 2, 1)
    ok = Evaluator(pr)(with_orders(pr, TWO, "F0:0 B0:0 W0:0", "F1:0 B1:0 W1:0"))
    stuck = Evaluator(pr)(with_orders(pr, TWO, "B0:0 F0:0 W0:0", "F1:0 B1:0 W1:0"))
    assert stuck.time == float("inf") and stuck.result is None
    assert not stuck.better_than(ok) and ok.better_than(stuck)
