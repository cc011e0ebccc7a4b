"""Processor sharing (sim/sharing.py), a fused backward's own cost, the optimizer step and the
step overhead: the additions calibration makes to the simulator."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from octodsl.costs import Link, uniform_stage_costs
from octodsl.dag import build_graph
from octodsl.gen import generate
from octodsl.sim import SimCosts, simulate
from octodsl.sim.sharing import Sharing, shared_phase

FREE = Link("none", 0.0, 0.0)


def exact_sharing(plan, costs, sharing: Sharing) -> float:
    """An event-by-event processor-sharing simulation (free messages): the reference."""
    g = build_graph(plan)
    work = [
        sum(
            {
                "F": costs[o.stage].f,
                "B": costs[o.stage].b,
                "W": costs[o.stage].w,
                "BW": costs[o.stage].b + costs[o.stage].w,
            }[o.kind.value]
            for o in ops
        )
        for ops in g.node_ops
    ]
    done = [False] * g.num_nodes
    pos = [0] * len(g.order)
    t = 0.0
    while True:
        running = [
            order[pos[d]]
            for d, order in enumerate(g.order)
            if pos[d] < len(order) and all(done[e.src] for e in g.deps[order[pos[d]]])
        ]
        if not running:
            return t
        r = sharing.rate(len(running))
        dt = min(work[n] for n in running) / r
        t += dt
        for n in running:
            work[n] -= dt * r
            if work[n] <= 1e-12:
                done[n] = True
                pos[g.node_device[n]] += 1


@pytest.mark.parametrize(
    "name,p,m",
    [
        ("1f1b", 4, 8),
        ("gpipe", 4, 4),
        ("zb-h1", 4, 8),
        ("zb-v", 4, 8),
        ("interleaved", 4, 8),
        ("1f1b", 2, 4),
        ("dualpipev", 2, 4),
    ],
)
@pytest.mark.parametrize(
    "sharing", [Sharing(2.0), Sharing(2.0, 0.1), Sharing(None, 0.05), Sharing(1.5, 0.02)]
)
def test_matches_exact_processor_sharing(name, p, m, sharing):
    plan = generate(name, p, m)
    costs = uniform_stage_costs(plan.num_stages, 1.0, 1.3, 0.7)
    got = simulate(plan, SimCosts(tuple(costs), sharing=sharing), FREE).iteration_time
    assert got == pytest.approx(exact_sharing(plan, costs, sharing), rel=1e-3)


def test_rate():
    s = Sharing(2.0, 0.1)
    assert s.rate(1) == 1.0
    assert s.rate(2) == pytest.approx(1 / 1.1)
    assert s.rate(4) == pytest.approx(0.5 / 1.1)
    assert Sharing(None, 0.0).rate(8) == 1.0 and not Sharing().active


def test_no_sharing_changes_nothing():
    plan = generate("zb-v", 4, 8)
    costs = uniform_stage_costs(plan.num_stages, 1.0, 1.0, 1.0, send_bytes=1e6)
    link = Link("l", 1e-3, 1e9)
    a = simulate(plan, costs, link)
    b = simulate(plan, SimCosts(tuple(costs), sharing=Sharing()), link)
    assert a.iteration_time == b.iteration_time and np.array_equal(a.start, b.start)


def test_overlap_slowdown_slows_compute_under_messages():
    plan = generate("1f1b", 2, 4)
    costs = uniform_stage_costs(plan.num_stages, 1.0, 1.0, 1.0, send_bytes=1.0)
    link = Link("slow", 0.5, 0.0)
    plain = simulate(plan, costs, link).iteration_time
    slowed = simulate(plan, SimCosts(tuple(costs), sharing=Sharing(None, 0.0, 0.5)), link)
    assert slowed.iteration_time > plain
    assert slowed.busy.sum() > 2 * 4 * 3.0  # some ops ran under a message and took longer


def test_fused_backward_cost_update_and_step_overhead():
    plan = generate("1f1b", 2, 4)
    base = uniform_stage_costs(plan.num_stages, 1.0, 1.0, 1.0)
    fused = [dataclasses.replace(c, bw=1.5, update=0.25 * (s + 1)) for s, c in enumerate(base)]
    r0 = simulate(plan, base, FREE)
    r1 = simulate(plan, SimCosts(tuple(fused), step_overhead=0.1), FREE)
    assert r0.iteration_time == pytest.approx(5 * 3.0)  # (m + p - 1) (F + B + W)
    assert r1.pipeline_time == pytest.approx(5 * 2.5)
    assert list(r1.update) == [0.25, 0.5] and r1.update_start == pytest.approx(12.5)
    assert r1.iteration_time == pytest.approx(12.5 + 0.5 + 0.1)


def test_shared_phase():
    assert list(shared_phase(np.array([1.0, 2.0]), None)) == [1.0, 2.0]
    done = shared_phase(np.array([1.0, 1.0, 2.0, 0.0]), Sharing(2.0))
    # three share two cores at 2/3 each: the two short ones end at 1.5; the last alone then
    assert list(done) == pytest.approx([1.5, 1.5, 2.5, 0.0])
