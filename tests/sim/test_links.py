"""Links by where ranks sit (octodsl/sim/links.py): which cuts and dp groups leave a node, the
times they take, the per-link busy seconds of `SimResult.link_busy` / `--json` against hand
sums, and the refusal of a cost table costed at another tp."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from octodsl.costs import Link, StageCost
from octodsl.costs.table import CostTable, LayerCost
from octodsl.gen import generate
from octodsl.plan import Plan
from octodsl.sim import SimCosts, compile, simulate
from octodsl.sim.costs import TpMismatch
from octodsl.sim.report import summary, to_json

INTRA = Link("intra", 1e-3, 1e4)
INTER = Link("inter", 5e-3, 1e3)
DP_LINK = Link("dp", 0.01, 1000.0)
SEND = 20.0
"""Bytes per message: 3 ms inside a node, 25 ms between nodes."""


def _plan(name: str = "1f1b", p: int = 16, m: int = 4, **header) -> Plan:
    plan = generate(name, p, m)
    return dataclasses.replace(plan, header=plan.header.model_copy(update=header))


def _costs(stages: int, **kw) -> SimCosts:
    return SimCosts(
        tuple(StageCost(1.0, 1.0, 1.0, 1.0, 0.5, 0.0, SEND, **kw) for _ in range(stages)),
        grad_bytes=(400.0,) * stages,
    )


def test_sixteen_devices_at_tp_1_cross_nodes_once_at_7_8():
    cuts = compile(_plan()).cut_inter
    assert np.flatnonzero(cuts).tolist() == [7]
    assert not cuts[-1]  # the last stage sends nothing


def test_tp_8_makes_every_cut_leave_the_node():
    cuts = compile(_plan(tp=8)).cut_inter
    assert cuts[:-1].all() and not cuts[-1]


def test_dp_fills_nodes_so_every_other_cut_leaves():
    # tp 1 x dp 4 on 8 GPUs per node: two pipeline devices per node.
    assert np.flatnonzero(compile(_plan(p=8, dp=4)).cut_inter).tolist() == [1, 3, 5]
    # 4 GPUs per node: every pipeline device a node of its own.
    assert compile(_plan(p=8, dp=4, gpus_per_node=4)).cut_inter[:-1].all()


def test_a_v_placement_crosses_where_its_devices_do():
    # zb-v on 16 devices: stages 0..15 down, 16..31 back up; the cuts 7|8 and 23|24 join
    # devices 7 and 8, and 15|16 stays on device 15 (no message).
    plan = _plan("zb-v", p=16, m=4)
    assert np.flatnonzero(compile(plan).cut_inter).tolist() == [7, 23]


def test_pipeline_messages_take_each_cut_s_link():
    plan = _plan(m=4)
    r = simulate(plan, _costs(16), INTRA, inter_link=INTER)
    seconds = {m.stage: m.end - m.start for m in r.messages() if m.kind == "F"}
    assert seconds[7] == pytest.approx(INTER.time(SEND))
    assert all(seconds[s] == pytest.approx(INTRA.time(SEND)) for s in range(15) if s != 7)
    # Without an inter-node link every message is on the one link, as before.
    one = simulate(plan, _costs(16), INTRA)
    assert {round(m.end - m.start, 12) for m in one.messages()} == {round(INTRA.time(SEND), 12)}
    assert one.iteration_time < r.iteration_time


def test_a_program_keeps_its_cuts_when_only_the_order_changes_but_not_the_mesh():
    plan = _plan()
    program = compile(plan)
    again = compile(
        dataclasses.replace(plan, schedule=[list(o) for o in plan.schedule]), like=program
    )
    assert again.cut_inter is program.cut_inter
    tp8 = _plan(tp=8)
    assert compile(tp8, like=program).cut_inter[:-1].all()


@pytest.mark.parametrize(
    "dp, gpus, spans, rails",
    [
        (4, 8, [False, False, False, False], [4, 4, 4, 4]),  # each dp group is 4 GPUs of one node
        (16, 8, [True, True, True, True], [8, 8, 8, 8]),  # 16 GPUs: two nodes, 8 in each
        (3, 8, [False, False, True, False], [3, 3, 2, 3]),  # device 2's group is ranks 6, 7 | 8
    ],
)
def test_dp_link_by_where_each_device_s_group_sits(dp, gpus, spans, rails):
    plan = _plan(p=4, m=4, dp=dp, gpus_per_node=gpus)
    assert compile(plan).dp_inter.tolist() == spans
    assert compile(plan).dp_rails.tolist() == rails
    r = simulate(plan, _costs(4), INTRA, inter_link=INTER)
    # Across nodes each GPU of the group in a node drives its own port: k x INTER's bandwidth.
    links = [
        Link("x", INTER.latency, k * INTER.bandwidth) if x else INTRA
        for x, k in zip(spans, rails, strict=True)
    ]
    expected = [2 * (dp - 1) * link.time(400.0 / dp) for link in links]
    assert r.allreduce.tolist() == pytest.approx(expected)
    # --dp-link overrides both.
    given = simulate(plan, _costs(4), INTRA, inter_link=INTER, dp_link=DP_LINK)
    assert given.allreduce.tolist() == pytest.approx([2 * (dp - 1) * DP_LINK.time(400.0 / dp)] * 4)


def test_simulate_dp_override_places_the_ranks_for_that_dp():
    plan = _plan(p=4, m=4, dp=1)
    assert not compile(plan).cut_inter.any()  # 4 GPUs: one node
    r = simulate(plan, _costs(4), INTRA, inter_link=INTER, dp=16)
    eight_ports = Link("x", INTER.latency, 8 * INTER.bandwidth)
    assert r.allreduce.tolist() == pytest.approx([30 * eight_ports.time(400.0 / 16)] * 4)
    assert r.links.cut_inter[:-1].all()  # 64 GPUs: a device per two nodes
    assert {round(m.end - m.start, 12) for m in r.messages()} == {round(INTER.time(SEND), 12)}


def test_the_rails_are_capped_by_the_node_link():
    plan = _plan(p=4, m=4, dp=16)
    fast = Link("fast", INTER.latency, INTRA.bandwidth)  # 8 ports of it: more than NVLink's
    r = simulate(plan, _costs(4), INTRA, inter_link=fast)
    assert r.allreduce.tolist() == pytest.approx(
        [30 * Link("x", fast.latency, INTRA.bandwidth).time(400.0 / 16)] * 4
    )


def test_link_busy_against_hand_sums():
    # 1F1B on 16 devices, 4 micro-batches, tp 2 x dp 2 on 16 GPUs per node: 4 devices per
    # node, so cuts 3|4, 7|8 and 11|12 leave a node; each stage's ops carry tp seconds.
    m = 4
    plan = _plan(m=m, tp=2, dp=2, zero=1, gpus_per_node=16)
    costs = _costs(16, tp_f=0.1, tp_b=0.2, tp_w=0.05)
    r = simulate(plan, costs, INTRA, inter_link=INTER)
    busy = r.link_busy()
    assert np.flatnonzero(r.program.cut_inter).tolist() == [3, 7, 11]
    # 1F1B splits no backward: each device runs m F and m BW (tp_b + tp_w).
    assert busy["tp"].busy.tolist() == pytest.approx([m * (0.1 + 0.2 + 0.05)] * 16)
    assert busy["tp"].total == pytest.approx(16 * m * 0.35)
    intra, inter = INTRA.time(SEND), INTER.time(SEND)
    # Each device sends and receives m activations and m gradients across each of its cuts.
    hand_intra, hand_inter = np.zeros(16), np.zeros(16)
    for d in range(16):
        for cut in (d - 1, d):
            if 0 <= cut < 15:
                if cut in (3, 7, 11):
                    hand_inter[d] += 2 * m * inter
                else:
                    hand_intra[d] += 2 * m * intra
    assert busy["pipeline_intra_node"].busy.tolist() == pytest.approx(hand_intra.tolist())
    assert busy["pipeline_inter_node"].busy.tolist() == pytest.approx(hand_inter.tolist())
    assert busy["pipeline_inter_node"].total == pytest.approx(3 * 2 * m * inter)  # each once
    assert busy["pipeline_intra_node"].total == pytest.approx(12 * 2 * m * intra)
    # dp 2 x tp 2: a device's dp groups are in its node; ZeRO 1: reduce-scatter and
    # all-gather, one ring pass each.
    half = 1 * INTRA.time(400.0 / 2)
    assert busy["dp_intra_node"].busy.tolist() == pytest.approx([2 * half] * 16)
    assert not busy["dp_inter_node"].busy.any()
    assert (busy["dp_intra_node"].link, busy["dp_inter_node"].link) == ("intra", "inter")
    # The JSON carries the same, and the mesh.
    data = to_json(r, link=INTRA.name)
    assert data["mesh"] == {
        "tp": 2,
        "pp": 16,
        "dp": 2,
        "world": 64,
        "nodes": 4,
        "gpus_per_node": 16,
    }
    assert data["links"]["pipeline_inter_node"] == {
        "link": "inter",
        "busy": busy["pipeline_inter_node"].busy.tolist(),
        "total": busy["pipeline_inter_node"].total,
    }
    assert set(data["links"]) == {
        "tp",
        "pipeline_intra_node",
        "pipeline_inter_node",
        "dp_intra_node",
        "dp_inter_node",
    }
    text = summary(r, link="intra").renderables[0].plain
    assert "tp 2 x pp 16 x dp 2 = 64 GPUs on 4 nodes of 16" in text
    assert "pipeline intra" in text and "+ inter" in text


def test_split_backward_counts_tp_of_b_and_w_apart():
    plan = _plan("zb-h1", p=4, m=4)
    r = simulate(plan, _costs(4, tp_f=0.1, tp_b=0.2, tp_w=0.05), INTRA)
    assert r.link_busy()["tp"].busy.tolist() == pytest.approx([4 * 0.35] * 4)


def test_throughput_is_per_gpu():
    plan = _plan(p=4, m=4, tp=4)
    costs = dataclasses.replace(_costs(4), tokens_per_microbatch=100)
    r = simulate(plan, costs, INTRA)
    assert r.throughput == pytest.approx(4 * 100 / (r.iteration_time * 4 * 4))


def _table(**meta) -> CostTable:
    layer = LayerCost("mlp", 1.0, 1.0, 1.0, 1.0, 0.5, 16.0, 1, 1.0)
    return CostTable([layer] * 4, "a profile", meta=meta)


def test_a_table_at_another_tp_is_refused():
    plan = _plan(p=2, m=2, tp=2)
    plan = dataclasses.replace(
        plan,
        stages=[
            dataclasses.replace(s, first=2 * i, last=2 * i + 1) for i, s in enumerate(plan.stages)
        ],
    )
    with pytest.raises(
        TpMismatch,
        match=r"for tp 1, the plan runs tp 2 with sequence "
        r"parallelism on: profile at the plan's tp, or use the analytical model",
    ):
        SimCosts.from_table(_table(), plan)
    assert SimCosts.from_table(_table(tp=2, sp=True), plan).stages
    with pytest.raises(TpMismatch, match="sequence parallelism off"):
        SimCosts.from_table(_table(tp=2, sp=False), plan)
    tp1 = dataclasses.replace(plan, header=plan.header.model_copy(update={"tp": 1}))
    with pytest.raises(TpMismatch, match="are for tp 2"):
        SimCosts.from_table(_table(tp=2, sp=True), tp1)
    assert SimCosts.from_table(_table(), tp1).stages
