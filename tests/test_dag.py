"""The graph's one list of messages: the data edges that cross devices."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from octodsl.dag import (
    _done_before,
    _stuck,
    _walk_ids,
    build_graph,
    deadlock,
    execution_order,
)
from octodsl.gen import generate
from octodsl.plan import Header, Op, OpKind, Plan, Slot, Stage, placement_loop


def test_messages_of_a_two_device_pipeline():
    g = build_graph(generate("1f1b", 2, 1))
    got = [
        (m.producer.label, m.consumer.label, m.src, m.dst, m.activation, m.boundary, m.mb)
        for m in g.messages
    ]
    # In the order of the consumers' nodes: device 0's (BW0:0) before device 1's (F1:0).
    assert got == [("BW1:0", "BW0:0", 1, 0, False, 0, 0), ("F0:0", "F1:0", 0, 1, True, 0, 0)]


@pytest.mark.parametrize("name", ["zb-v", "dualpipev", "interleaved", "zb-h1"])
def test_messages_are_the_crossing_edges_and_each_edge_knows_its_own(name):
    g = build_graph(generate(name, 3, 6))
    crossing = [e for es in g.deps for e in es if g.node_device[e.src] != g.node_device[e.dst]]
    assert [(m.src_node, m.dst_node, m.producer, m.consumer) for m in g.messages] == [
        (e.src, e.dst, e.producer, e.consumer) for e in crossing
    ]
    assert [e.msg for e in crossing] == list(range(len(g.messages)))
    assert all(e.msg == -1 for es in g.deps for e in es if e not in crossing)
    for m in g.messages:
        assert (m.src, m.dst) == (g.node_device[m.src_node], g.node_device[m.dst_node])
        assert m.producer in g.node_ops[m.src_node] and m.consumer in g.node_ops[m.dst_node]
        if m.activation:  # stage s's output goes forward to s + 1
            assert (m.producer.kind, m.consumer.kind) == (OpKind.F, OpKind.F)
            assert m.consumer.stage == m.producer.stage + 1 == m.boundary + 1
        else:  # its gradient comes back
            assert m.producer.kind in (OpKind.B, OpKind.BW) and m.consumer.kind in (
                OpKind.B,
                OpKind.BW,
            )
            assert m.producer.stage == m.consumer.stage + 1 == m.boundary + 1
        assert m.consumer.mb == m.mb
    assert g.messages and Op(OpKind.F, 0, 0) in [m.producer for m in g.messages]


# -- the array walk keeps to the ids walk ------------------------------------------------------


@st.composite
def small_plans(draw) -> Plan:
    """Plans of up to 3 devices, 4 stages and 3 micro-batches whose devices list random ops
    (some missing, some twice, some in overlap groups, now and then one outside the plan)."""
    devices, stages, mbs = draw(st.integers(1, 3)), draw(st.integers(1, 4)), draw(st.integers(1, 3))
    op = st.builds(
        Op,
        st.sampled_from(list(OpKind)),
        st.integers(0, stages - 1) | st.just(stages),
        st.integers(0, mbs - 1),
    )
    slot = st.lists(op, min_size=1, max_size=3, unique_by=Op.key).map(lambda ops: Slot(tuple(ops)))
    schedule = [
        draw(st.lists(st.one_of(op.map(lambda o: Slot((o,))), slot), max_size=12))
        for _ in range(devices)
    ]
    return Plan(
        Header(name="p", devices=devices, microbatches=mbs),
        [Stage() for _ in range(stages)],
        placement_loop(stages, devices),
        schedule,
    )


@given(small_plans())
def test_the_array_walk_stops_where_the_ids_walk_does(plan):
    walked = _walk_ids(plan)
    pos = _stuck(plan)
    if pos is None:  # an op outside the plan: deadlock() walks the ids itself
        assert any(not (0 <= op.stage < plan.num_stages) for _, _, op in plan.ops())
        return
    if isinstance(walked, list):
        assert pos == [len(slots) for slots in plan.schedule]
    else:
        assert pos == walked[1] and _done_before(plan, pos) == walked[0]


@given(small_plans())
def test_deadlock_finds_the_cycle_execution_order_finds(plan):
    order = execution_order(build_graph(plan))
    assert deadlock(plan) == (None if not order or isinstance(order[0], int) else order)
