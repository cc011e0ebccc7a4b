"""The memory levers in the tuner: ZeRO sharding over dp copies, recompute (a move of the memory
phase, and every baseline's choice), and --keep."""

from __future__ import annotations

import contextlib
from unittest import mock

import numpy as np
import pytest

from octodsl.plan import Recompute
from octodsl.tune.bounds import dp_seconds, recompute_lower_bound
from octodsl.tune.pipeline.estimate import FillModel
from octodsl.tune.pipeline.evaluate import Evaluator
from octodsl.tune.pipeline.layout import StageLayout, v_shape
from octodsl.tune.pipeline.loop import tune
from octodsl.tune.pipeline.moves import placement, recompute
from octodsl.tune.pipeline.moves.schedule import rebuild
from octodsl.tune.problem import AUTO, Keep, Problem
from octodsl.tune.reference.baselines import classic_baselines

from .helpers import problem


@contextlib.contextmanager
def scores():
    """Every Score the evaluator returns inside the block, in order."""
    seen: list = []
    evaluate = Evaluator.__call__

    def recording(self, plan):
        seen.append(evaluate(self, plan))
        return seen[-1]

    with mock.patch.object(Evaluator, "__call__", recording):
        yield seen


N, S, F = Recompute.NONE, Recompute.SELECTIVE, Recompute.FULL
SHARE_Z1_DP8 = (2 + 2 + 12 / 8) / 16
"""ZeRO-1 over 8 copies of a bf16 model, of a table counting 16 bytes per parameter, as DeepSpeed
holds it (the headers' runtime): the weights and gradients stay, the optimizer state is divided
by 8."""

# Four layers on two devices in a V (each device: one layer down, one up), one parameter and 16
# bytes of nominal static memory per layer, 10 of activations per micro-batch of which
# selective recompute drops 6. Unsharded, the static bytes alone (DeepSpeed's BF16 optimizer at
# zero 0, dp 1: 18 per parameter, 36 per device) overflow 26; with ZeRO-1 over 8 copies they
# are 11 per device, and while the up stage's B runs a device holds the down stage's kept
# bytes and the up stage's whole activations: 11 + 10 + 10 = 31 without recompute, 11 + 4 + 10
# = 25 with selective.
TIGHT = dict(
    work=[3.0] * 4, devices=2, microbatches=4, memory=26, act=10.0, sel_act=6.0, static=16.0
)


def test_static_bytes_are_sharded_once():
    pr = problem(**TIGHT, dp=8, zero=1)
    assert pr.layer_static() == pytest.approx([16 * SHARE_Z1_DP8] * 4)
    # The simulator gets the sharding from the plan's header (CostTable.stage_costs): the
    # tuner must not shard the table too. 16 x 2 layers x share = 11 bytes per device.
    plan = rebuild(pr.skeleton(StageLayout((0, 1, 2, 3, 4), v_shape(2), (S,) * 4)), pr, False)
    assert plan.header.zero == 1 and plan.header.dp == 8
    assert Evaluator(pr)(plan).result.memory.static == pytest.approx([11.0, 11.0])


def test_the_bubble_aware_estimate_counts_sharded_static_bytes_and_recompute():
    cuts = (0, 1, 2, 3, 4)
    for zero, dp, mode, fits in (
        (0, 1, S, False),
        (1, 8, N, False),
        (1, 8, S, True),
        (2, 8, N, False),
    ):
        pr = problem(**TIGHT, dp=dp, zero=zero, recompute=AUTO)
        model = FillModel(pr, v_shape(2), (mode,) * 4)
        assert model.fits(model(cuts)) is fits, (zero, dp, mode)
    # ZeRO-2 over 8 copies is Megatron's, whose fp32 gradient buffer stays whole: 2 + 4 + 12/8
    # = 7.5 per layer, 15 per device, 15 + 10 + 10 = 35 over 26 without recompute, as the
    # estimate says above.
    assert problem(**TIGHT, dp=8, zero=2).layer_static() == pytest.approx([7.5] * 4)


def test_no_plan_fits_says_what_static_remains_and_which_levers_help():
    reason = problem(**TIGHT, recompute=N).why_no_plan_fits()
    assert reason is not None
    assert "take 36 B per device (zero 0, dp 1)" in reason
    # Without recompute a micro-batch keeps 40 bytes: ZeRO-1 (DeepSpeed's 2 + 2 + 12/dp) leaves
    # more than 4 x 4 = 16 static bytes whatever dp, 56 > 52 over both devices, and ZeRO-2
    # (Megatron's 2 + 4 + 12/dp) more than 24: no ZeRO helps.
    assert "--zero" not in reason and "recompute (`--recompute auto`)" in reason
    # At 30 bytes per device ZeRO-1 over 16 copies does: 4 x (4 + 12/16) = 19 <= 60 - 40.
    reason = problem(**{**TIGHT, "memory": 30}, recompute=N).why_no_plan_fits()
    assert reason is not None
    assert "ZeRO (`--zero 1 --dp 16` leaves 9.5 B static per device" in reason
    # With ZeRO-1 over 8 copies the static bytes are 11 per device.
    reason = problem(**TIGHT, dp=8, zero=1, recompute=N).why_no_plan_fits()
    assert reason is not None and "take 11 B per device (zero 1, dp 8)" in reason
    assert "--zero 1" not in reason and "recompute (`--recompute auto`)" in reason
    assert problem(**TIGHT, dp=8, zero=1, recompute=AUTO).why_no_plan_fits() is None


def test_a_case_that_fits_only_with_zero_and_recompute():
    assert problem(**TIGHT, recompute=AUTO).why_no_plan_fits() is not None
    out = tune(problem(**TIGHT, dp=8, zero=1, recompute=AUTO), budget=60, max_evaluations=150)
    best = out.best
    assert best.fits and (best.peak <= 26).all()
    assert best.plan.header.zero == 1 and best.plan.header.dp == 8
    assert S in best.plan.recompute() or F in best.plan.recompute()
    # Without recompute nothing fits: the best plan the search finds is over the limit.
    none = tune(problem(**TIGHT, dp=8, zero=1, recompute=N), budget=60, max_evaluations=60)
    assert not none.best.fits


def test_recompute_moves_lower_an_over_full_devices_peak():
    pr = problem(**TIGHT, dp=8, zero=1, recompute=AUTO)
    lay = StageLayout((0, 1, 2, 3, 4), v_shape(2))
    evaluate = Evaluator(pr)
    over = evaluate(rebuild(pr.skeleton(lay), pr, False))
    assert not over.fits
    what, new = next(recompute.moves(lay, over.result, 26, pr.modes, over=True))
    assert what.startswith("recompute stage ") and what.endswith("none -> selective")
    after = evaluate(rebuild(pr.skeleton(new), pr, False))
    assert after.peak.max() < over.peak.max()


def test_held_byte_seconds_rank_the_stage_that_waits_longest_first():
    pr = problem(**(TIGHT | {"memory": None}), dp=8, zero=1, recompute=AUTO)
    lay = StageLayout((0, 1, 2, 3, 4), v_shape(2))
    result = Evaluator(pr)(rebuild(pr.skeleton(lay), pr, False)).result
    held = recompute.held(result)
    # Stage 0 holds each micro-batch's activations from its first forward to its last
    # backward, the longest round trip of the four.
    assert int(np.argmax(held)) == 0 and (held > 0).all()


def test_recompute_is_kept_only_where_it_helps():
    # Plenty of memory: recompute only adds B time, so the tuner removes it from a plan that
    # recomputes everything (its cuts and placement kept, so only the order and recompute move).
    pr = problem(**(TIGHT | {"memory": 1000}), dp=8, zero=1, recompute=AUTO)
    lay = StageLayout((0, 1, 2, 3, 4), v_shape(2), (F,) * 4)
    start = rebuild(pr.skeleton(lay), pr, False)
    pr.keep = Keep.of(start, placement=True)
    out = tune(pr, budget=60, max_evaluations=150, starts=[start])
    assert out.best.plan.recompute() == [N] * 4
    assert out.best.time < Evaluator(pr)(start).time
    assert any(r.phase == "memory" and "full -> " in r.move for r in out.rounds)


def test_keep_partition_keeps_the_cuts_of_every_plan_tried():
    pr = problem([1.0, 2.0, 3.0, 1.0, 2.0, 4.0, 1.0, 1.0], 2, 4, recompute=AUTO, memory=100)
    lay = StageLayout((0, 3, 5, 6, 8), (0, 1, 1, 0))
    start = rebuild(pr.skeleton(lay), pr, False)
    seen = []
    evaluate = Evaluator.__call__

    def recording(self, plan):
        seen.append(StageLayout.of(plan))
        return evaluate(self, plan)

    for devices in (None, lay.devices):
        pr.keep = Keep(lay.cuts, devices)
        seen.clear()
        with mock.patch.object(Evaluator, "__call__", recording):
            out = tune(pr, budget=60, max_evaluations=80, starts=[start])
        assert seen and {s.cuts for s in seen} == {lay.cuts}
        if devices is not None:
            assert {s.devices for s in seen} == {lay.devices}
        else:
            assert len({s.devices for s in seen}) > 1  # the placement was searched
        assert StageLayout.of(out.best.plan).cuts == lay.cuts


def test_a_tuning_run_with_recompute_is_deterministic_for_a_seed():
    pr = problem(**TIGHT, dp=8, zero=1, recompute=AUTO)
    a, b = (tune(pr, budget=60, max_evaluations=120, seed=3) for _ in range(2))
    assert a.finished == b.finished and a.best.plan.same_as(b.best.plan)
    assert [r.move for r in a.rounds] == [r.move for r in b.rounds]


def test_the_tight_bound_holds_for_every_plan_with_recompute():
    pr = problem(**TIGHT, dp=8, zero=1, recompute=AUTO)
    with scores() as seen:
        tune(pr, budget=60, max_evaluations=120)
    bound = pr.tight_lower_bound()
    fitting = [s for s in seen if s.fits]
    assert fitting and all(s.time >= bound * (1 - 1e-9) for s in fitting)
    assert any(S in s.plan.recompute() for s in fitting)


def test_the_joint_bound_weighs_recompute_time_against_memory():
    # Full recompute is the only way to fit many micro-batches, and costs an F per B: the
    # bound with the modes' time and bytes together is above both terms alone.
    pr = problem([3.0] * 4, 2, 16, memory=40, act=10.0, static=1.0, recompute=F)
    assert recompute_lower_bound(pr) >= pr.lower_bound()
    # + an F per layer, and the second device's wait for the first forward (1 s) shared
    assert recompute_lower_bound(pr) == pytest.approx(16 * (12 + 4) / 2 + 0.5)
    auto = problem([3.0] * 4, 2, 16, memory=40, act=10.0, static=1.0, recompute=AUTO)
    assert auto.lower_bound() <= recompute_lower_bound(auto) <= recompute_lower_bound(pr)


def test_partition_and_placement_moves_carry_each_stages_mode():
    lay = StageLayout((0, 2, 4, 6), (0, 1, 0), (S, N, F))
    assert lay.with_cuts((0, 1, 4, 6)).recompute == (S, N, F)
    assert placement.disperse(lay, 0, 1) == StageLayout((0, 1, 2, 4, 6), (0, 1, 1, 0), (S, S, N, F))
    merged = placement.merge(StageLayout((0, 1, 3, 4, 6), (0, 0, 1, 1), (N, S, F, N)))
    assert merged == StageLayout((0, 3, 6), (0, 1), (S, F))
    assert placement.swap(lay, 0, 1) == StageLayout(lay.cuts, (1, 0, 0), (S, N, F))
    assert StageLayout((0, 1), (0,)) == StageLayout((0, 1), (0,), (N,))


@pytest.mark.parametrize("mode", [N, S, F])
def test_baselines_get_a_fixed_mode_on_every_stage(mode):
    pr = Problem.create("nemotron-h-tiny", 4, 8, memory=2**30, dp=4, zero=1, recompute=mode)
    for b in classic_baselines(pr):
        if b.score is not None:
            assert b.recompute is mode
            assert b.score.plan.recompute() == [mode] * b.score.plan.num_stages
            assert (b.score.plan.header.zero, b.score.plan.header.dp) == (1, 4)


def test_with_auto_each_baseline_counts_with_its_best_mode():
    # nemotron-h-tiny on 4 devices of 100 MiB: 60 MiB of static bytes per device, and 1F1B's
    # first device holds 4 micro-batches: only recompute fits some baselines.
    pr = Problem.create("nemotron-h-tiny", 4, 8, memory=100 * 2**20, recompute=AUTO)
    evaluate = Evaluator(pr)
    baselines = classic_baselines(pr, evaluate)
    assert {b.recompute for b in baselines if b.score is not None} > {N}
    for b in baselines[:3]:
        assert b.score is not None
        scores = [
            evaluate(Problem(pr.table, pr.header, pr.link, m).adopt(b.score.plan))
            for m in (N, S, F)
        ]
        best = min((s for s in scores if s.fits), key=lambda s: s.time, default=None)
        assert b.score.fits == (best is not None)
        if best is not None:
            assert b.score.time == best.time


@pytest.mark.parametrize("zero", [0, 1, 2])
def test_the_tight_bound_counts_the_data_parallel_collectives_and_holds(zero):
    pr = Problem.create("nemotron-h-tiny", 4, 8, memory=2**30, dp=8, zero=zero)
    one = Problem.create("nemotron-h-tiny", 4, 8, memory=2**30)
    before, after = dp_seconds(pr)
    assert (before > 0) == (zero < 2) and (after > 0) == (zero > 0)
    assert pr.tight_lower_bound() > one.tight_lower_bound()
    with scores() as seen:
        classic_baselines(pr)
        tune(pr, budget=60, max_evaluations=60)
    bound = pr.tight_lower_bound()
    assert [s.time for s in seen if s.fits and s.time < bound * (1 - 1e-9)] == []
