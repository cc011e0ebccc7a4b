"""The overlap-group moves (moves/overlap.py): every pair and split they make lints clean on
generated and list-scheduled orders; pairing pays where the all-to-alls are long (Qwen3-Next at
ep 8), splitting where a group waits (Jamba at ep 8); the tuner reaches a faster plan with them."""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from octodsl.costs.table import CostTable
from octodsl.gen import phased_schedule
from octodsl.lint import lint_plan
from octodsl.plan import OpKind
from octodsl.tune.pipeline import loop
from octodsl.tune.pipeline.diagnose import diagnose
from octodsl.tune.pipeline.evaluate import Evaluator, Score
from octodsl.tune.pipeline.layout import StageLayout, even_cuts
from octodsl.tune.pipeline.moves import overlap, schedule
from octodsl.tune.pipeline.propose import Proposal, State, proposals
from octodsl.tune.problem import Problem

from .helpers import problem

GENERATED = (
    ("1f1b", None),
    ("interleaved", 2),
    ("zb-h1", None),
    ("zb-v", None),
    ("dualpipev", None),
)


def moe(work: list[float], devices: int, microbatches: int, share: float) -> Problem:
    """helpers.problem whose layers spend `share` of their F and B in expert all-to-alls."""
    pr = problem(work, devices, microbatches)
    layers = [replace(l, ep_f=share * l.f, ep_b=share * l.b) for l in pr.table.layers]
    return Problem(CostTable(layers, "test"), pr.header, pr.link, pr.recompute)


def generated(pr: Problem, name: str, chunks: int | None):
    """`gen NAME`'s order for the problem, stages of equal layer counts."""
    phased = phased_schedule(name, pr.devices, pr.microbatches, chunks)
    devices = [0] * phased.num_stages
    for p in phased.placement:
        for s in p.stages:
            devices[s] = p.device
    layout = StageLayout(even_cuts(pr.num_layers, phased.num_stages), tuple(devices))
    return pr.with_schedule(pr.skeleton(layout), phased.orders()[0])


def groups(plan) -> list[tuple[int, int]]:
    """(device, index in its order) of each overlap group."""
    return [
        (d, i) for d, o in enumerate(plan.schedule) for i, slot in enumerate(o) if len(slot.ops) > 1
    ]


def clean(plan) -> bool:
    """No lint error (a deadlock among them) and no group of one direction (W403)."""
    return not [d for d in lint_plan(plan) if d.is_error or d.code == "W403"]


# -- every move lints clean ---------------------------------------------------------------------


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    work=st.lists(st.floats(0.5, 4.0), min_size=8, max_size=8),
    devices=st.integers(2, 3),
    microbatches=st.integers(6, 8),
    share=st.floats(0.05, 0.6),
    which=st.integers(0, len(GENERATED)),
    rng=st.randoms(use_true_random=False),
)
def test_pairs_and_splits_lint_clean(work, devices, microbatches, share, which, rng):
    """Any disjoint subset of the candidates, on a generated order or the list scheduler's (the
    last `which`); then any groups split, in either order."""
    pr = moe(work, devices, microbatches, share)
    ev = Evaluator(pr)
    if which < len(GENERATED):
        plan = generated(pr, *GENERATED[which])
    else:
        plan = schedule.rebuild(pr.skeleton(StageLayout.of(generated(pr, "zb-v", None))), pr, True)
    s = ev(plan)
    cands = overlap.candidates(s.result)
    chosen = overlap.disjoint(rng.sample(cands, rng.randint(0, len(cands))))
    paired = overlap.pair(plan, chosen)
    assert clean(paired)
    assert len(groups(paired)) == len(groups(plan)) + len(chosen)
    for c in chosen:  # each group is an F and a backward that took the earlier one's place
        slot = paired.schedule[c.device][
            c.first - sum(x.device == c.device and x.second < c.first for x in chosen)
        ]
        assert [op.kind is OpKind.F for op in slot.ops] == [True, False]
    grouped = groups(paired)
    split = overlap.unpair(
        paired, rng.sample(grouped, rng.randint(0, len(grouped))), rng.random() < 0.5
    )
    assert clean(split)
    assert ev(paired).result is not None and ev(split).result is not None


def test_only_all_to_alls_make_candidates():
    pr = problem([1.0] * 8, 2, 8)
    s = Evaluator(pr)(generated(pr, "zb-v", None))
    assert overlap.candidates(s.result) == []


def test_the_hidden_seconds_are_the_simulators():
    pr = moe([1.0, 2.0, 3.0, 1.5, 2.5, 1.0, 2.0, 3.0], 2, 8, 0.4)
    ev = Evaluator(pr)
    s = ev(generated(pr, "zb-v", None))
    c = overlap.candidates(s.result)[0]
    g = ev(overlap.pair(s.plan, [c])).result
    p = g.program
    node = p.order_nodes[p.order_ptr[c.device] + c.first]
    assert p.op_ptr[node + 1] - p.op_ptr[node] == 2
    seconds, _ = overlap.op_seconds(g)
    ops = seconds[p.op_ptr[node] : p.op_ptr[node + 1]].sum()
    # the same rule summed in another order: equal to rounding
    assert ops - (g.end[node] - g.start[node]) == pytest.approx(c.hidden, rel=1e-12)


# -- pairing and splitting on the MoE models ----------------------------------------------------


@pytest.fixture(scope="module")
def qwen():
    """Qwen3-Next-80B at ep 8: its all-to-alls are a third of its MoE layers' time."""
    return Problem.create("qwen3-next-80b", 4, 16, dp=16, ep=8, zero=1)


@pytest.fixture(scope="module")
def jamba():
    """Jamba-v0.1 at ep 8: short all-to-alls, so a group that waits costs more than it hides."""
    return Problem.create("jamba-v0.1", 4, 8, dp=64, ep=8, zero=1)


def test_splitting_then_pairing_dualpipev_gives_back_its_groups(qwen):
    ev = Evaluator(qwen)
    dual = ev(generated(qwen, "dualpipev", None))
    before = {(d, tuple(dual.plan.schedule[d][i].ops)) for d, i in groups(dual.plan)}
    assert before
    split = ev(overlap.unpair(dual.plan, groups(dual.plan), forward_first=True))
    assert not groups(split.plan) and split.time > dual.time
    again = overlap.pair(split.plan, overlap.disjoint(overlap.candidates(split.result)))
    after = {(d, tuple(again.schedule[d][i].ops)) for d, i in groups(again)}
    assert after & before
    assert ev(again).time < split.time


def test_pairing_an_order_in_turn_pays_where_all_to_alls_are_long(qwen):
    ev = Evaluator(qwen)
    zbv = ev(generated(qwen, "zb-v", None))
    paired = ev(overlap.pair(zbv.plan, overlap.disjoint(overlap.candidates(zbv.result))))
    assert paired.time < 0.9 * zbv.time


def test_splitting_the_groups_pays_where_all_to_alls_are_short(jamba):
    ev = Evaluator(jamba)
    dual = ev(generated(jamba, "dualpipev", None))
    assert dual.result.all_to_all_hidden.sum() > 0
    split = [ev(overlap.unpair(dual.plan, groups(dual.plan), f)) for f in (True, False)]
    assert min(s.time for s in split) < dual.time


def without_overlap_moves(monkeypatch):
    monkeypatch.setattr(overlap, "candidates", lambda result: [])
    monkeypatch.setattr(overlap, "waits", lambda result: [])


def test_the_tuner_reaches_a_faster_plan_with_the_moves(qwen, monkeypatch):
    """The same search (seed, evaluations) with and without them: simulated seconds."""
    kw = dict(budget=1e9, seed=0, max_evaluations=400, restarts=1)
    on = loop.tune(qwen, **kw)
    assert groups(on.best.plan) and clean(on.best.plan)
    assert any(r.move.startswith("overlap group: pair") for r in on.rounds)
    without_overlap_moves(monkeypatch)
    off = loop.tune(qwen, **kw)
    assert on.best.time < 0.95 * off.best.time


def schedule_moves(pr: Problem, plan) -> tuple[Evaluator, Score, list[Proposal]]:
    """The schedule phase's proposals for the plan."""
    ev = Evaluator(pr)
    s = ev(plan)
    st = State(pr, s, StageLayout.of(plan), True, diagnose(s.result), 0)
    return ev, s, list(proposals("schedule", st))


def test_the_schedule_phase_splits_the_groups_where_they_wait_longer_than_they_hide(jamba):
    ev, dual, props = schedule_moves(jamba, generated(jamba, "dualpipev", None))
    split = [p for p in props if p.move.startswith("run every overlap group's ops in turn")]
    assert len(split) == 2
    assert min(ev(p.build()).time for p in split) < dual.time
    assert all(clean(p.build()) for p in props)


def test_the_schedule_phase_keeps_groups_that_hide_more_than_they_wait(qwen):
    ev, dual, props = schedule_moves(qwen, generated(qwen, "dualpipev", None))
    assert not [p for p in props if p.move.startswith("run every overlap group")]
    # and the split it leaves out would be slower
    grouped = groups(dual.plan)
    assert ev(overlap.unpair(dual.plan, grouped, forward_first=True)).time > dual.time


def test_the_moves_are_deterministic(qwen):
    a = loop.tune(qwen, budget=1e9, seed=3, max_evaluations=150, restarts=1)
    b = loop.tune(qwen, budget=1e9, seed=3, max_evaluations=150, restarts=1)
    assert [r.move for r in a.rounds] == [r.move for r in b.rounds]
    assert a.best.plan.schedule == b.best.plan.schedule
