"""What the simulator and the list scheduler remember between calls (a tuner makes thousands):
never stale for other costs, layers, meshes or placements, and equal to what a fresh call
computes. Equal exactly where the remembered value is made by the same operations on the same
numbers as the fresh one (said at each)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from octodsl.costs.levers import op_bytes
from octodsl.costs.table import Link, StageCost
from octodsl.gen import generate
from octodsl.mesh import Mesh
from octodsl.plan import PlanError
from octodsl.sim import compile, simulate
from octodsl.sim.core import NO_PRED, msg_pred_code
from octodsl.sim.links import Links, cut_crosses_nodes, dp_links, dp_rails, dp_spans_nodes
from octodsl.sim.program import CodedOrders, _coded_nodes
from octodsl.tune.pipeline import construct
from octodsl.tune.pipeline.layout import StageLayout, even_cuts
from octodsl.tune.pipeline.moves.schedule import rebuild
from octodsl.tune.problem import Problem

from ..tune.test_mirrors import layouts

FIELDS = [f.name for f in dataclasses.fields(StageCost)]


@settings(max_examples=25, deadline=None)
@given(layouts(), st.data())
def test_cost_columns_are_the_stages_and_never_another_costs(case, data):
    pr, layout = case
    costs = pr.sim_costs(pr.skeleton(layout))
    for name in (*[f for f in FIELDS if f != "bw"], "fused_backward"):
        col = costs.column(name)
        # np.array of the same floats: exactly the fields
        assert col.tolist() == [getattr(c, name) for c in costs.stages]
        assert col is costs.column(name)  # remembered
        assert not col.flags.writeable  # shared: nobody may write into it
    # other stages: their own columns, not the first costs'
    k = data.draw(st.integers(0, len(costs.stages) - 1))
    other = dataclasses.replace(
        costs,
        stages=(
            *costs.stages[:k],
            dataclasses.replace(costs.stages[k], f=123.0),
            *costs.stages[k + 1 :],
        ),
    )
    assert other.column("f")[k] == 123.0
    assert costs.column("f")[k] == costs.stages[k].f


@settings(max_examples=15, deadline=None)
@given(layouts(), layouts(), st.booleans())
def test_a_simulation_with_costs_used_before_is_a_fresh_ones(first, second, w_gap):
    # The same costs object simulated on one layout and then another, against a copy that
    # remembers nothing: the same operations on the same numbers, so equal exactly.
    for pr, layout in (first, second):
        plan = rebuild(pr.skeleton(layout), pr, w_gap)
        used = pr.sim_costs(plan)
        a = simulate(plan, used, pr.link, inter_link=pr.inter_link)
        b = simulate(plan, used, pr.link, inter_link=pr.inter_link)
        fresh = simulate(plan, dataclasses.replace(used), pr.link, inter_link=pr.inter_link)
        for r in (a, b):
            assert r.iteration_time == fresh.iteration_time
            assert r.peak_memory.tolist() == fresh.peak_memory.tolist()
            assert r.end.tolist() == fresh.end.tolist()
            assert r.lower_bound == fresh.lower_bound


@settings(max_examples=25, deadline=None)
@given(st.sampled_from(["nemotron-h-tiny", "jamba-tiny"]), st.data())
def test_gradient_bytes_remembered_per_range_and_kind(model, data):
    table = Problem.create(model, 4, 8, memory=None, dp=2, zero=1).table
    n = len(table.layers)
    first = data.draw(st.integers(0, n - 1))
    last = data.draw(st.integers(first, n - 1))
    for name, method in (
        ("params", table.grad_params),
        ("expert_params", table.expert_grad_params),
    ):
        # the sum the table made before it remembered: the same operations, exactly equal
        direct = float(sum(getattr(l, name) for l in table.layers[first : last + 1]))
        assert method(first, last) == direct
        assert method(first, last) == direct  # remembered
        assert method(first) == method(first, n - 1)  # the default end is the last layer
    fresh = dataclasses.replace(table, layers=table.layers[: last + 1])  # a new table forgets
    assert fresh.grad_params(first) == table.grad_params(first, last)
    assert fresh._sums is not table._sums


@settings(max_examples=40, deadline=None)
@given(
    st.lists(st.integers(0, 7), min_size=2, max_size=12),
    st.sampled_from([1, 2, 4, 8]),
    st.sampled_from([1, 2, 8]),
    st.sampled_from([1, 2, 4]),
)
def test_remembered_crossings_are_the_meshes_and_placements(devices, gpus_per_node, dp, tp):
    mesh = Mesh(tp, 8, dp, gpus_per_node, 1)
    got = construct._crossings(mesh, tuple(devices))
    assert got.tolist() == cut_crosses_nodes(mesh, devices).tolist()
    assert not got.flags.writeable
    other = Mesh(tp, 8, dp, 8 if gpus_per_node == 1 else 1, 1)
    assert construct._crossings(other, tuple(devices)).tolist() == (
        cut_crosses_nodes(other, devices).tolist()
    )


@settings(max_examples=30, deadline=None)
@given(
    st.sampled_from([1, 2, 8]),
    st.sampled_from([1, 2, 4, 8]),
    st.sampled_from([1, 2]),
    st.floats(0.0, 1e-3),
    st.floats(0.0, 1e12),
)
def test_remembered_dp_links_are_the_meshes(gpus_per_node, dp, tp, latency, bandwidth):
    mesh = Mesh(tp, 4, dp, gpus_per_node, 1)
    intra, inter = Link("in", 1e-6, 4e11), Link("out", latency, bandwidth)
    spans, rails = dp_spans_nodes(mesh), dp_rails(mesh)
    links = Links.of(np.zeros(4, bool), spans, rails, intra, inter)
    assert links.dp == dp_links(intra, inter, spans, rails)
    assert [k.name for k in links.dp] == [k.name for k in dp_links(intra, inter, spans, rails)]


@settings(max_examples=25, deadline=None)
@given(layouts())
def test_remembered_op_bytes_are_the_levers(case):
    # the same function of the same columns: equal exactly, and another costs' own
    pr, layout = case
    costs = pr.sim_costs(pr.skeleton(layout))
    fresh = op_bytes(*(costs.column(k) for k in ("act", "act_w", "act_b")))
    for kept, made in zip(costs.op_bytes, fresh, strict=True):
        assert np.array_equal(kept, made) and not kept.flags.writeable
    other = dataclasses.replace(
        costs, stages=tuple(dataclasses.replace(c, act=c.act + 1.0) for c in costs.stages)
    )
    assert not np.array_equal(other.op_bytes[0], costs.op_bytes[0])


def _reference_path(r, node: int, msg: int) -> list[tuple]:
    """The chain back from `node` (or `msg`), step by step in Python as the walk records it."""
    p = r.program
    out = []
    while node >= 0 or msg >= 0:
        if node >= 0:
            out.append(("compute", p.node_label(node), int(p.node_dev[node]), r.start[node]))
            before = int(r.pred[node])
            node = msg = -1
            if before >= 0:
                node = before
            elif before != NO_PRED:
                msg = int(msg_pred_code(before))
        else:
            out.append(
                ("message", p.msg_producer(msg).label, int(p.msg_src_dev[msg]), r.msg_start[msg])
            )
            before = int(r.msg_pred[msg])
            node, msg = (int(p.msg_src_node[msg]), -1) if before < 0 else (-1, before)
    return out


@pytest.mark.parametrize(
    "name, p, m", [("1f1b", 4, 8), ("zb-v", 4, 8), ("dualpipev", 4, 8), ("interleaved", 4, 8)]
)
def test_the_compiled_chain_is_the_walks(name, p, m):
    plan = generate(name, p, m)
    costs = [StageCost(1.0 + s / 7, 1.5, 0.5, 1.0, 0.5, 0.0, 1e6) for s in range(plan.num_stages)]
    r = simulate(plan, costs, Link("slow", 1e-2, 1e8))
    assert r.program.num_messages
    for node in range(0, r.program.num_nodes, 5):
        got = [(s.kind, s.label, s.device, s.start) for s in r._path_to(node, -1)]
        assert got == _reference_path(r, node, -1)
    for msg in range(0, r.program.num_messages, 7):
        got = [(s.kind, s.label, s.device, s.start) for s in r._path_to(-1, msg)]
        assert got == _reference_path(r, -1, msg)


def test_coded_nodes_accept_only_each_node_once_on_its_device():
    # Nodes 0..3: 0 and 1 on device 0, 2 and 3 on device 1; table[kind, stage, mb] -> node.
    table = np.full((3, 2, 2), -1, np.int64)
    table[0, 0, 0], table[0, 0, 1], table[0, 1, 0], table[0, 1, 1] = 0, 1, 2, 3
    node_dev = np.array([0, 0, 1, 1])
    old = np.array([0, 1, 2, 3])

    def nodes(kind, stage, mb):
        ok, out = _coded_nodes(table, np.array(kind), np.array(stage), np.array(mb), node_dev, old)
        return out.tolist() if ok else None

    assert nodes([0] * 4, [0, 0, 1, 1], [1, 0, 0, 1]) == [1, 0, 2, 3]  # reordered on devices
    assert nodes([0] * 4, [0, 1, 0, 1], [0, 0, 1, 1]) is None  # an op on another device
    assert nodes([0] * 4, [0, 0, 1, 1], [0, 0, 0, 1]) is None  # an op twice
    assert nodes([0] * 4, [0, 0, 1, 1], [0, 1, 0, 2]) is None  # no such micro-batch
    assert nodes([1] * 4, [0, 0, 1, 1], [0, 1, 0, 1]) is None  # no such op in the table
    assert nodes([0] * 3, [0, 0, 1], [0, 1, 0]) is None  # one op short


def test_a_coded_plan_with_ops_across_devices_is_compiled_as_from_scratch():
    # The order's codes put an op on another device than `like`'s node of it: not reordered,
    # compiled (or refused) as without `like`.
    pr = Problem.create("jamba-tiny", 4, 8, memory=None)
    layout = StageLayout(even_cuts(pr.num_layers, pr.devices), tuple(range(pr.devices)))
    plan = rebuild(pr.skeleton(layout), pr, True)
    like = compile(rebuild(pr.skeleton(layout), pr, False))
    codes = [c.copy() for c in plan.schedule.codes]
    orders = [list(o) for o in plan.schedule]
    n0 = len(orders[0])  # swap the first ops of devices 0 and 1, in the orders and the codes
    orders[0][0], orders[1][0] = orders[1][0], orders[0][0]
    for c in codes:
        c[0], c[n0] = c[n0], c[0]
    swapped = dataclasses.replace(plan, schedule=CodedOrders(orders, tuple(codes)))

    def outcome(**like_):
        try:
            return {
                f.name: getattr(p, f.name).tolist()
                for p in [compile(swapped, **like_)]
                for f in dataclasses.fields(p)
                if isinstance(getattr(p, f.name), np.ndarray)
            }
        except PlanError as e:
            return str(e)

    assert outcome(like=like) == outcome()
