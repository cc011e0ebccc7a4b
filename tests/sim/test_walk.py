"""The walk's invariants, deadlocks, overlap groups, DP, the critical path, recompiling."""

from __future__ import annotations

import ast
import dataclasses
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from octodsl.costs import Link, StageCost, uniform_stage_costs
from octodsl.dag import build_graph, describe_cycle, execution_order
from octodsl.gen import generate
from octodsl.lint import lint_plan
from octodsl.plan import Plan
from octodsl.sim import SimCosts, SimDeadlock, compile, simulate
from octodsl.sim.core import Timeline, comm_overlap, hidden_comm

from .plans import make_plan

FREE = Link("none", 0.0, 0.0)
SCHEDULES = ["gpipe", "1f1b", "zb-h1", "zb-h2", "zb-v", "dualpipev", "interleaved"]


def _plan(name: str, p: int, m: int) -> Plan:
    if name == "dualpipev":
        m = max(m, 2 * p)
    if name == "interleaved":
        m = -(-m // p) * p
    return generate(name, p, m)


@st.composite
def cases(draw):
    name = draw(st.sampled_from(SCHEDULES))
    plan = _plan(name, draw(st.integers(1, 5)), draw(st.integers(1, 9)))
    seconds = st.floats(0.01, 3.0)
    costs = [
        StageCost(
            draw(seconds),
            draw(seconds),
            draw(seconds),
            draw(st.floats(0, 5)),
            0.0,
            draw(st.floats(0, 5)),
            draw(st.floats(0, 1e3)),
        )
        for _ in range(plan.num_stages)
    ]
    link = Link("l", draw(st.floats(0, 0.5)), draw(st.sampled_from([0.0, 1e3, 1e4])))
    return plan, costs, link


@given(cases())
def test_timelines_respect_dependencies_and_streams(case):
    plan, costs, link = case
    r = simulate(plan, costs, link)
    p = r.program
    eps = 1e-9
    # Compute: each device's nodes in order, one at a time, after every message into them.
    for d in range(p.devices):
        nodes = p.order_nodes[p.order_ptr[d] : p.order_ptr[d + 1]]
        assert np.all(r.start[nodes[1:]] >= r.end[nodes[:-1]] - eps)
    assert np.all(r.msg_start >= r.end[p.msg_src_node] - eps)
    assert np.all(r.start[p.msg_dst_node] >= r.msg_end - eps)
    # Communication: each device's send stream carries one message at a time, and so does its
    # receive stream; a send and a receive of one device may overlap (full-duplex links).
    for d in range(p.devices):
        for mine in (np.flatnonzero(p.msg_src_dev == d), np.flatnonzero(p.msg_dst_dev == d)):
            order = mine[
                np.lexsort((r.msg_end[mine], r.msg_start[mine]))
            ]  # free ones first on ties
            assert np.all(r.msg_start[order[1:]] >= r.msg_end[order[:-1]] - eps)
    # Metrics.
    assert r.busy + r.idle == pytest.approx(np.full(p.devices, r.iteration_time))
    assert np.all(r.comm_exposed >= -eps) and np.all(r.comm_exposed <= r.comm + eps)
    assert 0 <= r.overlap_rate <= 1 + eps
    assert r.lower_bound <= r.iteration_time + eps
    assert np.all(r.peak_memory >= r.memory.static - eps)
    # The critical path is a chain of back-to-back steps from 0 to the end.
    path = r.critical_path()
    assert path[0].start == pytest.approx(0, abs=eps)
    assert path[-1].end == pytest.approx(r.iteration_time)
    # strict=False: consecutive pairs, path[1:] is one shorter
    for a, b in zip(path, path[1:], strict=False):
        assert b.start == pytest.approx(a.end)


@given(cases(), st.sampled_from([(1, 0), (2, 1), (4, 2)]))
def test_critical_nodes_are_the_critical_paths_compute_steps(case, dp_zero):
    # the nodes found without making the path's steps: each compute step's device and times
    plan, costs, link = case
    dp, zero = dp_zero
    plan = dataclasses.replace(plan, header=plan.header.model_copy(update={"dp": dp, "zero": zero}))
    r = simulate(plan, SimCosts(tuple(costs), grad_bytes=(1e3,) * len(costs)), link)
    nodes = r.critical_nodes()
    steps = [s for s in r.critical_path() if s.kind == "compute"]
    assert [(s.device, s.start, s.end) for s in steps] == list(
        zip(
            r.program.node_dev[nodes].tolist(),
            r.start[nodes].tolist(),
            r.end[nodes].tolist(),
            strict=True,
        )
    )
    assert [s.label for s in steps] == r.program.node_labels(nodes)


@given(cases())
def test_hidden_comm_sums_each_nodes_overlap(case):
    # hidden_comm merges both streams of a device in one pass; summed node by node, each
    # node's overlaps added in comm_overlap's order: the same floats (the same additions).
    plan, costs, link = case
    r = simulate(plan, costs, link)
    p = r.program
    z = np.zeros(p.devices)
    t = Timeline(
        p.num_nodes, r.start, r.end, r.pred, r.msg_start, r.msg_end, r.msg_pred, r.stream_log, z, z
    )
    _, hidden = hidden_comm(p.walk_graph, t)
    under = comm_overlap(p.walk_graph, t)
    for d in range(p.devices):
        nodes = p.order_nodes[p.order_ptr[d] : p.order_ptr[d + 1]]
        total = 0.0
        for n in nodes:
            total += under[n]
        assert hidden[d] == total


TIMED = ("start", "end", "msg_start", "msg_end", "pred", "msg_pred", "stream_log")


def tied_walk():
    """DualPipeV with uniform costs: many messages ready at the same instant on the same
    stream, and overlap groups with two messages in."""
    plan = generate("dualpipev", 4, 12)
    return simulate(
        plan, uniform_stage_costs(8, 1.0, 1.0, 1.0, send_bytes=1e6), Link("l", 1e-2, 1e8)
    )


def test_deterministic_across_processes():
    # Ties between messages are broken by message id, which comes from the graph's edge order:
    # nothing in compiling or walking a plan may depend on hash order or memory addresses.
    # Fresh processes with other hash seeds must time everything alike.
    r = tied_walk()
    p = r.program
    ready = r.end[p.msg_src_node]
    assert any(
        len(set(ready[mine].tolist())) < len(mine)  # the precondition: ties to break
        for mine in (
            np.flatnonzero((p.msg_src_dev == d) | (p.msg_dst_dev == d)) for d in range(p.devices)
        )
    )
    here = {k: getattr(r, k).tolist() for k in TIMED}
    code = (
        "from tests.sim.test_walk import TIMED, tied_walk; r = tied_walk(); "
        "print(repr({k: getattr(r, k).tolist() for k in TIMED}))"
    )
    for hash_seed in ("1", "2"):
        out = subprocess.run(
            [sys.executable, "-c", code],
            capture_output=True,
            text=True,
            check=True,
            cwd=Path(__file__).resolve().parents[2],
            env={**os.environ, "PYTHONHASHSEED": hash_seed},
        ).stdout
        assert ast.literal_eval(out) == here


def test_deadlock_reports_lints_cycle():
    plan = make_plan(2, 2, [["F0:0", "BW0:0", "F0:1", "BW0:1"], ["BW1:0", "F1:0", "F1:1", "BW1:1"]])
    with pytest.raises(SimDeadlock) as info:
        simulate(plan, uniform_stage_costs(2, 1, 1, 1), FREE)
    cycle = execution_order(build_graph(plan))
    assert info.value.cycle == cycle
    assert describe_cycle(cycle) in str(info.value)
    (lint,) = [d for d in lint_plan(plan) if d.code == "E310"]
    assert list(lint.notes) == describe_cycle(cycle).splitlines()


def test_overlap_group_runs_its_ops_back_to_back():
    plan = make_plan(
        2, 2, [["F0:0", "F0:1", "BW0:0", "BW0:1"], ["F1:0", ("F1:1", "BW1:0"), "BW1:1"]]
    )
    r = simulate(plan, uniform_stage_costs(2, 1.0, 2.0, 0.0), FREE)
    spans = {op.label: op for op in r.ops()}
    assert spans["F1:1"].start == 2 and spans["F1:1"].end == 3
    assert spans["BW1:0"].start == 3 and spans["BW1:0"].end == 5
    # Results leave the group when it ends: BW0:0 waits for the whole group.
    assert spans["BW0:0"].start == 5
    assert r.peak_ops()[1] == "(F1:1 & BW1:0)"


def test_dp_allreduce_is_a_ring_after_the_pipeline():
    plan = generate("1f1b", 2, 4)
    link, dp_link = Link("pp", 0.0, 0.0), Link("dp", 0.01, 1000.0)
    costs = SimCosts(tuple(uniform_stage_costs(2, 1, 1, 1)), grad_bytes=(400.0, 800.0))
    one = simulate(plan, costs, link)
    r = simulate(plan, costs, link, dp=4, dp_link=dp_link)
    ring = [2 * 3 * (0.01 + g / 4 / 1000.0) for g in (400.0, 800.0)]
    assert r.allreduce == pytest.approx(ring)
    assert one.allreduce.sum() == 0
    ends = [
        max(e for s, e in ((o.start, o.end) for o in r.ops() if o.device == d)) for d in range(2)
    ]
    assert r.iteration_time == pytest.approx(max(e + t for e, t in zip(ends, ring, strict=True)))
    assert r.critical_path()[-1].kind == "allreduce"
    assert r.overlap_rate == 0  # the all-reduce is the only communication, after all compute


def test_large_dp_is_a_formula():
    # PP 16 x DP 512 = 8192 devices: one pipeline is walked, the all-reduce is computed.
    plan = generate("1f1b", 16, 32)
    costs = SimCosts(tuple(uniform_stage_costs(16, 1e-3, 1e-3, 1e-3)), grad_bytes=(2e9,) * 16)
    r = simulate(plan, costs, Link("ib", 1e-5, 5e10), dp=512)
    assert r.allreduce[0] == pytest.approx(2 * 511 * (1e-5 + 2e9 / 512 / 5e10))
    assert r.iteration_time > r.pipeline_time


def test_throughput_and_lower_bound():
    plan = generate("1f1b", 4, 8)
    costs = SimCosts(
        tuple(uniform_stage_costs(4, 1, 1, 1)), layer_work=2.0, tokens_per_microbatch=100
    )
    r = simulate(plan, costs, FREE)
    assert r.throughput == pytest.approx(8 * 100 / (33 * 4))
    assert r.lower_bound == 24  # all work spread over 4 devices: 4 x 8 x 3 / 4
    assert r.efficiency == pytest.approx(24 / 33)
    heavy = simulate(plan, dataclasses.replace(costs, layer_work=3.5), FREE)
    assert heavy.lower_bound == 3.5 * 8


def test_reordered_plan_reuses_the_program():
    plan = generate("zb-v", 4, 8)
    costs, link = uniform_stage_costs(8, 1.0, 1.2, 0.8, send_bytes=10.0), Link("l", 0.1, 100.0)
    base = compile(plan)
    order = list(plan.schedule[2])
    i = next(
        k
        for k in range(len(order) - 1)
        if str(order[k]).startswith("W") and str(order[k + 1]).startswith("F")
    )
    order[i], order[i + 1] = order[i + 1], order[i]  # run a forward before a weight gradient
    moved = dataclasses.replace(plan, schedule=[*plan.schedule[:2], order, *plan.schedule[3:]])
    quick = compile(moved, like=base)
    assert quick.msg_dst_node is base.msg_dst_node  # the graph was not rebuilt
    fast, full = simulate(quick, costs, link), simulate(compile(moved), costs, link)
    assert fast.iteration_time == full.iteration_time
    assert sorted((o.label, o.start) for o in fast.ops()) == sorted(
        (o.label, o.start) for o in full.ops()
    )


def test_a_reused_program_sums_each_devices_seconds_as_a_fresh_one():
    # Per-device sums run in the plan's order, not the program's node numbers (which a reused
    # program keeps from the old plan): the same additions in the same order, so equal to the
    # last bit, which the tuner's choices between tying devices rely on. The seconds are
    # chosen so that the order shows: 1 then tiny ones rounds to 1, tiny ones then 1 does not.
    plan = generate("1f1b", 4, 8)
    moved = dataclasses.replace(
        plan,
        schedule=[list(reversed(o)) if d == 2 else list(o) for d, o in enumerate(plan.schedule)],
    )
    first = str(plan.schedule[2][0])
    sums = []
    for program in (compile(moved, like=compile(plan)), compile(moved)):
        labels = [str(program.op(int(program.op_ptr[n]))) for n in range(program.num_nodes)]
        seconds = np.array([1.0 if x == first else 1e-16 for x in labels])
        sums.append(program.per_device(seconds).tolist())
    assert sums[0] == sums[1]
    assert sums[1][2] > 1.0  # the tiny ones first, as the plan now orders device 2


def test_reorder_of_a_whole_schedule():
    # GPipe and 1F1B run the same ops on each device, in other orders.
    base = compile(generate("1f1b", 4, 8))
    gpipe = compile(generate("gpipe", 4, 8), like=base)
    assert gpipe.msg_dst_node is base.msg_dst_node
    r = simulate(gpipe, uniform_stage_costs(4, 1, 1, 1), FREE)
    assert r.iteration_time == 33 and list(r.peak_memory) == [8] * 4


@pytest.mark.parametrize("other", [("zb-h1", 4, 8), ("1f1b", 4, 9), ("zb-v", 2, 8)])
def test_reorder_falls_back_when_more_than_the_order_changed(other):
    base = compile(generate("1f1b", 4, 8))
    plan = generate(*other)
    quick = compile(plan, like=base)
    assert quick.msg_dst_node is not base.msg_dst_node
    costs = uniform_stage_costs(plan.num_stages, 1, 1, 1)
    assert simulate(quick, costs, FREE).iteration_time == simulate(plan, costs, FREE).iteration_time


def test_costs_must_match_stages():
    with pytest.raises(ValueError, match="3 stage costs for 4 stages"):
        simulate(generate("1f1b", 4, 4), uniform_stage_costs(3, 1, 1, 1), FREE)


def test_plain_python_walk_matches_the_compiled_one():
    # Without numba the same loops run as Python; check both give the same timelines.
    pytest.importorskip("numba")
    code = (
        "from octodsl.gen import generate; from octodsl.sim import simulate; "
        "from octodsl.costs import Link, uniform_stage_costs; "
        "r = simulate(generate('zb-v', 3, 6), uniform_stage_costs(6, 1.0, 1.5, 0.5, send_bytes=7.0), "
        "Link('l', 0.1, 10.0)); print(repr(r.start.tolist() + r.msg_end.tolist()))"
    )
    env = {**os.environ, "NUMBA_DISABLE_JIT": "1"}
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        env=env,
        check=True,
        cwd=Path(__file__).resolve().parents[2],
    ).stdout
    r = simulate(
        generate("zb-v", 3, 6),
        uniform_stage_costs(6, 1.0, 1.5, 0.5, send_bytes=7.0),
        Link("l", 0.1, 10.0),
    )
    assert ast.literal_eval(out) == r.start.tolist() + r.msg_end.tolist()
