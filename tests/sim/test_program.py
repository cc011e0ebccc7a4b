"""compile's two ways to the dependency graph's arrays: from dag.build_graph's objects (any
plan) and straight from the ops (a plan whose every slot is one op, each op once: every plan
the tuner makes). The second mirrors dag's producer rule; here the two are held equal."""

from __future__ import annotations

import dataclasses

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from octodsl.dag import build_graph
from octodsl.gen import generate
from octodsl.plan import Plan
from octodsl.sim import program
from octodsl.tune.pipeline.moves.schedule import advance, rebuild

from ..tune.test_mirrors import layouts

SCHEDULES = ["gpipe", "1f1b", "zb-h1", "zb-h2", "zb-v", "dualpipev", "interleaved"]


def _arrays(plan: Plan):
    """(graph from build_graph, graph from the ops or None)."""
    slots = [slot for order in plan.schedule for slot in order]
    node_dev = np.repeat(np.arange(plan.devices), [len(o) for o in plan.schedule])
    return program._graph(plan), program._graph_of_ops(plan, slots, node_dev)


def _same(a, b) -> None:
    for name in program._Graph._fields:
        assert getattr(a, name).tolist() == getattr(b, name).tolist(), name


@settings(max_examples=60, deadline=None)
@given(st.sampled_from(SCHEDULES), st.integers(2, 5), st.integers(1, 10))
def test_classic_plans_give_the_graphs_arrays(name, p, m):
    if name == "dualpipev":
        m = max(m, 2 * p)
    if name == "interleaved":
        m = -(-m // p) * p
    plan = generate(name, p, m)
    from_graph, from_ops = _arrays(plan)
    grouped = any(len(s.ops) > 1 for o in plan.schedule for s in o)
    assert (from_ops is None) == grouped  # overlap groups go the graph's way
    if from_ops is not None:
        _same(from_graph, from_ops)
    # nodes are numbered in device order, as compile numbers them
    g = build_graph(plan)
    assert [n for o in g.order for n in o] == list(range(g.num_nodes))


@settings(max_examples=40, deadline=None)
@given(layouts(), st.data())
def test_tuner_plans_give_the_graphs_arrays(case, data):
    pr, layout = case
    plan = rebuild(pr.skeleton(layout), pr, w_gap=data.draw(st.booleans()))
    for _ in range(data.draw(st.integers(0, 3))):  # reordered, possibly so it deadlocks
        d = data.draw(st.integers(0, pr.devices - 1))
        src = data.draw(st.integers(1, len(plan.schedule[d]) - 1))
        plan = advance(plan, d, src, data.draw(st.integers(0, src - 1)))
    from_graph, from_ops = _arrays(plan)
    assert from_ops is not None
    _same(from_graph, from_ops)


@settings(max_examples=30, deadline=None)
@given(st.sampled_from(["1f1b", "zb-h1", "zb-v"]), st.data())
def test_a_plan_missing_an_op_or_repeating_one(name, data):
    # A missing producer gives no edge either way; an op twice is the graph's to resolve.
    plan = generate(name, 4, 4)
    d = data.draw(st.integers(0, 3))
    i = data.draw(st.integers(0, len(plan.schedule[d]) - 1))
    order = list(plan.schedule[d])
    slot = order.pop(i)
    missing = dataclasses.replace(
        plan, schedule=[*plan.schedule[:d], order, *plan.schedule[d + 1 :]]
    )
    from_graph, from_ops = _arrays(missing)
    assert from_ops is not None
    _same(from_graph, from_ops)
    twice = dataclasses.replace(
        plan, schedule=[*plan.schedule[:d], [*plan.schedule[d], slot], *plan.schedule[d + 1 :]]
    )
    assert _arrays(twice)[1] is None
