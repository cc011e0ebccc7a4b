"""The graph's one list of messages: the data edges that cross devices."""

from __future__ import annotations

import pytest

from octodsl.dag import build_graph
from octodsl.gen import generate
from octodsl.plan import Op, OpKind


def test_messages_of_a_two_device_pipeline():
    g = build_graph(generate("1f1b", 2, 1))
    got = [(m.producer.label, m.consumer.label, m.src, m.dst, m.activation, m.boundary, m.mb)
           for m in g.messages]
    # In the order of the consumers' nodes: device 0's (BW0:0) before device 1's (F1:0).
    assert got == [("BW1:0", "BW0:0", 1, 0, False, 0, 0), ("F0:0", "F1:0", 0, 1, True, 0, 0)]


@pytest.mark.parametrize("name", ["zb-v", "dualpipev", "interleaved", "zb-h1"])
def test_messages_are_the_crossing_edges_and_each_edge_knows_its_own(name):
    g = build_graph(generate(name, 3, 6))
    crossing = [e for es in g.deps for e in es if g.node_device[e.src] != g.node_device[e.dst]]
    assert [(m.src_node, m.dst_node, m.producer, m.consumer) for m in g.messages] == \
        [(e.src, e.dst, e.producer, e.consumer) for e in crossing]
    assert [e.msg for e in crossing] == list(range(len(g.messages)))
    assert all(e.msg == -1 for es in g.deps for e in es if e not in crossing)
    for m in g.messages:
        assert (m.src, m.dst) == (g.node_device[m.src_node], g.node_device[m.dst_node])
        assert m.producer in g.node_ops[m.src_node] and m.consumer in g.node_ops[m.dst_node]
        if m.activation:  # stage s's output goes forward to s + 1
            assert (m.producer.kind, m.consumer.kind) == (OpKind.F, OpKind.F)
            assert m.consumer.stage == m.producer.stage + 1 == m.boundary + 1
        else:  # its gradient comes back
            assert m.producer.kind in (OpKind.B, OpKind.BW) and m.consumer.kind in (OpKind.B, OpKind.BW)
            assert m.producer.stage == m.consumer.stage + 1 == m.boundary + 1
        assert m.consumer.mb == m.mb
    assert g.messages and Op(OpKind.F, 0, 0) in [m.producer for m in g.messages]
