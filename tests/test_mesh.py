"""octodsl.mesh against a brute-force walk over every rank (the mesh's checks look at no more than
gpus_per_node ranks, whatever the mesh's size)."""

from hypothesis import given
from hypothesis import strategies as st

from octodsl.mesh import Mesh
from octodsl.plan import Header

meshes = st.builds(
    Mesh, st.integers(1, 16), st.integers(1, 6), st.integers(1, 6), st.integers(1, 12)
)


def _nodes(m: Mesh, ranks) -> set[int]:
    return {m.node(r) for r in ranks}


@given(meshes)
def test_checks_equal_a_walk_over_every_rank(m):
    assert sorted(
        m.rank(p, d, t) for p in range(m.pp) for d in range(m.dp) for t in range(m.tp)
    ) == list(range(m.world))
    for r in range(m.world):
        assert m.rank(*m.coords(r)) == r
    assert m.tp_spans_nodes == any(
        len(_nodes(m, [m.rank(p, d, t) for t in range(m.tp)])) > 1
        for p in range(m.pp)
        for d in range(m.dp)
    )
    for p in range(m.pp):
        assert m.dp_spans_nodes(p) == any(
            len(_nodes(m, [m.rank(p, d, t) for d in range(m.dp)])) > 1 for t in range(m.tp)
        )
        for q in range(m.pp):
            assert m.crosses_nodes(p, q) == any(
                m.node(m.rank(p, d, t)) != m.node(m.rank(q, d, t))
                for d in range(m.dp)
                for t in range(m.tp)
            )


def test_megatron_order_tp_fastest_then_dp_then_pp():
    m = Mesh(tp=2, pp=2, dp=2, gpus_per_node=8)
    assert [m.coords(r) for r in range(8)] == [
        (0, 0, 0),
        (0, 0, 1),
        (0, 1, 0),
        (0, 1, 1),
        (1, 0, 0),
        (1, 0, 1),
        (1, 1, 0),
        (1, 1, 1),
    ]


def test_a_cluster_of_8192_gpus():
    m = Mesh.of(Header(name="x", devices=16, microbatches=32, tp=8, dp=64))
    assert (m.world, m.nodes) == (8192, 1024)
    assert not m.tp_spans_nodes  # 8 divides the node
    assert m.dp_spans_nodes(0) and m.crosses_nodes(0, 1)
    assert Mesh(tp=3, pp=1, dp=4, gpus_per_node=8).tp_spans_nodes  # ranks 6, 7 | 8
    assert not Mesh(tp=1, pp=8, dp=1).crosses_nodes(0, 7)
    assert Mesh(tp=1, pp=16, dp=1).crosses_nodes(7, 8)
