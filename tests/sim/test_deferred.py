"""A SimResult's metrics that a search does not read (communication under compute, busy and
idle seconds, the bubble, all-to-all hidden by overlap groups, the lower bound) are found when
first read: here against the eager computation `simulate` made before, from a fresh walk of
the same plan. The same operations on the same arrays, so the same floats (exact asserts)."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from octodsl.costs import Link, StageCost
from octodsl.gen import generate
from octodsl.sim import SimCosts, simulate
from octodsl.sim.bounds import lower_bound
from octodsl.sim.core import hidden_comm, walk

SCHEDULES = ["gpipe", "1f1b", "zb-h1", "zb-v", "dualpipev", "interleaved"]


@st.composite
def cases(draw):
    name = draw(st.sampled_from(SCHEDULES))
    p = draw(st.integers(1, 4))
    m = draw(st.integers(1, 8))
    if name == "dualpipev":  # overlap groups, whose all-to-alls hide under each other
        m = max(m, 2 * p)
    if name == "interleaved":
        m = -(-m // p) * p
    mesh = {"dp": draw(st.sampled_from([1, 2, 4])), "zero": draw(st.integers(0, 2))}
    plan = generate(name, p, m, mesh=mesh)
    seconds = st.floats(0.01, 3.0)
    costs = []
    for _ in range(plan.num_stages):
        f, b = draw(seconds), draw(seconds)
        costs.append(
            StageCost(
                f,
                b,
                draw(seconds),
                draw(st.floats(0, 5)),
                0.0,
                draw(st.floats(0, 5)),
                draw(st.floats(0, 1e3)),
                ep_f=f * draw(st.floats(0, 0.9)),
                ep_b=b * draw(st.floats(0, 0.9)),
            )
        )
    link = Link("l", draw(st.floats(0, 0.5)), draw(st.sampled_from([0.0, 1e3, 1e4])))
    grads = tuple(draw(st.floats(0, 1e4)) for _ in costs)
    return plan, SimCosts(tuple(costs), grad_bytes=grads), link


@settings(max_examples=60, deadline=None)
@given(cases())
def test_metrics_found_when_read_are_the_eager_ones(case):
    plan, costs, link = case
    r = simulate(plan, costs, link)
    p, col = r.program, costs.column
    # as `simulate` computed them before every one was deferred
    op_dur = p.per_op(col("f"), col("b"), col("w"), col("fused_backward"))
    op_comm = p.per_op(col("ep_f"), col("ep_b"), np.zeros_like(col("ep_f")), col("ep_b"))
    work = p.per_slot(op_dur, op_comm)
    cut_time = r.links.cut_times(col("send_bytes")) + costs.message_overhead
    t = walk(p.walk_graph, work, cut_time[p.msg_boundary])
    comm, hidden = hidden_comm(p.walk_graph, t)
    comm, hidden = comm + r.dp_comm.total, hidden + r.dp_comm.hidden
    busy = np.bincount(p.node_dev, weights=work, minlength=p.devices)
    idle = r.iteration_time - busy
    if p.grouped and op_comm.any():
        stages = [replace(c, f=c.f - c.ep_f, b=c.b - c.ep_b, bw=None) for c in costs.stages]
        bound = lower_bound(p, stages, float(work.sum()), cut_time)
    else:
        bound = lower_bound(p, costs.stages, float(work.sum()), cut_time, costs.layer_work)

    assert np.array_equal(r.start, t.start) and np.array_equal(r.msg_end, t.msg_end)
    assert np.array_equal(r.comm, comm)
    assert np.array_equal(r.comm_exposed, comm - hidden)
    total = float(comm.sum())
    assert r.overlap_rate == (float(hidden.sum()) / total if total > 0 else 1.0)
    assert np.array_equal(r.busy, busy) and np.array_equal(r.idle, idle)
    assert np.array_equal(r.bubble_ratios, idle / r.iteration_time)
    assert r.bubble_ratio == float(idle.sum() / (p.devices * r.iteration_time))
    hidden_a2a = np.bincount(p.node_dev, weights=p.per_node(op_dur) - work, minlength=p.devices)
    assert np.array_equal(r.all_to_all_hidden, hidden_a2a)
    assert r.lower_bound == bound
    assert r.efficiency == bound / r.iteration_time
