"""ZeRO's data-parallel communication (octodsl/sim/dpcomm.py) against the ring formulas, on a
2-device 1F1B plan whose devices end at different times."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest

from octodsl.costs import Link, StageCost, uniform_stage_costs
from octodsl.gen import generate
from octodsl.plan import Plan
from octodsl.sim import SimCosts, simulate
from octodsl.sim.report import path_segments, summary, to_json
from octodsl.sim.trace import DP_COMM, chrome_trace

FREE = Link("none", 0.0, 0.0)
DP_LINK = Link("dp", 0.01, 1000.0)
GRADS = (400.0, 800.0)
COSTS = SimCosts(tuple(uniform_stage_costs(2, 1, 1, 1)), grad_bytes=GRADS)


def _plan(zero: int, dp: int = 4, name: str = "1f1b", m: int = 4) -> Plan:
    plan = generate(name, 2, m)
    return dataclasses.replace(plan, header=plan.header.model_copy(update={"zero": zero, "dp": dp}))


def _half(g: float, dp: int = 4) -> float:
    """One ring pass (dp - 1 steps of g / dp bytes): a reduce-scatter or an all-gather."""
    return (dp - 1) * (DP_LINK.latency + g / dp / DP_LINK.bandwidth)


def _device_ends(r) -> list[float]:
    return [max(o.end for o in r.ops() if o.device == d) for d in range(r.devices)]


def test_zero_1_is_the_all_reduce_in_two_halves_around_the_step():
    zero0 = simulate(_plan(0), COSTS, FREE, dp_link=DP_LINK)
    r = simulate(_plan(1), COSTS, FREE, dp_link=DP_LINK)
    half = [_half(g) for g in GRADS]
    assert r.reduce_scatter.tolist() == pytest.approx(half)
    assert r.all_gather.tolist() == pytest.approx(half)
    assert r.allreduce.sum() == 0 and zero0.reduce_scatter.sum() == zero0.all_gather.sum() == 0
    # The same bytes as the all-reduce: both halves are (dp - 1) x time(g / dp), and doubling
    # a float is exact, so the sum is the all-reduce's 2 (dp - 1) x time(g / dp) to the bit.
    assert (r.reduce_scatter + r.all_gather).tolist() == zero0.allreduce.tolist()
    # Nothing overlaps the cool-down: the reduce-scatter starts when the device is done; the
    # all-gather when every device's gradients are reduced and the (free) step is done.
    ends = _device_ends(r)
    assert ends[0] != ends[1]
    reduced = max(e + h for e, h in zip(ends, half, strict=True))
    assert r.update_start == pytest.approx(reduced)
    assert r.iteration_time == pytest.approx(reduced + max(half))
    assert r.dp_exposed.tolist() == pytest.approx((r.reduce_scatter + r.all_gather).tolist())
    assert r.iteration_time > zero0.iteration_time  # the all-gather waits for the slowest reduce


def _all_reducing(zero: int) -> Plan:
    plan = _plan(zero)
    return dataclasses.replace(
        plan, header=plan.header.model_copy(update={"reduce_scatter": False})
    )


def test_reduce_scatter_false_all_reduces_then_gathers():
    zero0 = simulate(_plan(0), COSTS, FREE, dp_link=DP_LINK)
    r = simulate(_all_reducing(1), COSTS, FREE, dp_link=DP_LINK)
    # The all-reduce is zero 0's (the same function of the same bytes: equal to the bit),
    # then the all-gather of zero 1 after the step.
    assert r.allreduce.tolist() == zero0.allreduce.tolist()
    assert r.reduce_scatter.sum() == 0
    assert r.all_gather.tolist() == pytest.approx([_half(g) for g in GRADS])
    assert r.dp_comm.reduction_kind == "allreduce"
    assert {c.kind for c in r.collectives()} == {"allreduce", "all-gather"}
    assert "ZeRO 1          all-reduce " in summary(r, link="free").renderables[0].plain
    assert r.iteration_time > simulate(_plan(1), COSTS, FREE, dp_link=DP_LINK).iteration_time
    # zero 2's per-backward reductions become all-reduces too: twice the ring passes
    z2 = simulate(_all_reducing(2), COSTS, FREE, dp_link=DP_LINK)
    assert z2.allreduce.tolist() == pytest.approx([4 * 2 * _half(g) for g in GRADS])
    # without ZeRO the field changes nothing (lint's W406 says so)
    assert (
        simulate(_all_reducing(0), COSTS, FREE, dp_link=DP_LINK).iteration_time
        == zero0.iteration_time
    )


def test_zero_without_copies_to_shard_over_changes_nothing():
    base = simulate(_plan(0, dp=1), COSTS, FREE, dp_link=DP_LINK)
    for zero in (1, 2):
        r = simulate(_plan(zero, dp=1), COSTS, FREE, dp_link=DP_LINK)
        assert r.iteration_time == base.iteration_time
        assert r.dp_comm.total.sum() == 0


def test_zero_2_reduce_scatters_after_each_backward_on_the_dp_stream():
    r = simulate(_plan(2), COSTS, FREE, dp_link=DP_LINK)
    dpc = r.dp_comm
    assert r.allreduce.sum() == 0
    assert r.reduce_scatter.tolist() == pytest.approx([4 * _half(g) for g in GRADS])  # M = 4
    assert r.all_gather.tolist() == pytest.approx([_half(g) for g in GRADS])
    bw_end = {(o.device, o.mb): o.end for o in r.ops() if o.kind == "BW"}
    spans = [c for c in r.collectives() if c.kind == "reduce-scatter"]
    assert len(spans) == 8 and [c.after.label for c in spans[:4]] == [f"BW0:{i}" for i in range(4)]
    for d in range(2):
        mine = [c for c in spans if c.device == d]
        for i, c in enumerate(mine):
            ready = bw_end[(d, c.after.mb)]
            assert c.start == (ready if i == 0 else max(ready, mine[i - 1].end))
            assert c.end == pytest.approx(c.start + _half(GRADS[d]))
    # Under the device's later compute: the intersection of its spans with its ops.
    ops = [(o.device, o.start, o.end) for o in r.ops()]
    under = [
        sum(
            max(0.0, min(c.end, e) - max(c.start, s))
            for c in spans
            if c.device == d
            for dev, s, e in ops
            if dev == d
        )
        for d in range(2)
    ]
    assert dpc.hidden.tolist() == pytest.approx(under) and dpc.hidden.min() > 0
    assert r.dp_exposed.tolist() == pytest.approx((dpc.total - dpc.hidden).tolist())
    last = max(c.end for c in spans)
    assert r.update_start == pytest.approx(max(r.pipeline_time, last))
    assert r.iteration_time == pytest.approx(r.update_start + max(_half(g) for g in GRADS))


@pytest.mark.parametrize(
    "zero,name", [(0, "1f1b"), (1, "zb-h1"), (2, "1f1b"), (2, "zb-h1"), (2, "dualpipev")]
)
def test_critical_path_runs_through_the_collectives_and_the_step(zero, name):
    # Slow dp link, so that the collectives set the iteration time; an optimizer step too.
    plan = _plan(zero, m=6, name=name)
    S = plan.num_stages
    stages = tuple(
        StageCost(1.0, 1.0, 1.0, 1.0, 0.5, 0.0, 0.0, update=0.3 + 0.1 * s) for s in range(S)
    )
    costs = SimCosts(stages, grad_bytes=(1500.0,) * S, step_overhead=0.25)
    r = simulate(plan, costs, FREE, dp_link=DP_LINK)
    path = r.critical_path()
    assert path[0].start == 0
    for a, b in zip(path[:-1], path[1:], strict=True):
        assert b.start == pytest.approx(a.end)
    assert path[-1].end == pytest.approx(r.iteration_time - 0.25)
    kinds = [s.kind for s in path]
    want = {
        0: ["allreduce", "update"],
        1: ["reduce-scatter", "update", "all-gather"],
        2: ["reduce-scatter", "update", "all-gather"],
    }[zero]
    assert [k for k in dict.fromkeys(kinds) if k not in ("compute", "message")] == want
    for seg in path_segments(path):
        assert str(seg)


def test_json_and_trace_carry_the_collectives():
    r = simulate(_plan(2), COSTS, FREE, dp_link=DP_LINK)
    obj = json.loads(json.dumps(to_json(r, link="none"), allow_nan=False))
    assert obj["zero"] == 2 and obj["dp"] == 4
    assert obj["reduce_scatter_time"] == r.reduce_scatter.tolist()
    assert obj["all_gather_time"] == r.all_gather.tolist()
    assert obj["dp_comm_exposed"] == r.dp_exposed.tolist()
    assert obj["dp_slowed"] == r.dp_comm.slowed.tolist() == [0.0, 0.0]  # no SMs in the costs
    assert obj["param_bytes"] is None  # uniform costs: no per-parameter bytes
    assert obj["static"][0] == {"weights": None, "grads": None, "optimizer": None, "total": 0.0}
    assert [s["recompute"] for s in obj["stages"]] == ["none", "none"]
    events = chrome_trace(r)["traceEvents"]
    dp = [e for e in events if e.get("tid") == DP_COMM and e["ph"] == "X"]
    assert len(dp) == 8 + 2 and {e["args"]["kind"] for e in dp} == {"reduce-scatter", "all-gather"}
    assert dp[0]["name"] == "reduce-scatter BW0:0"
    assert any(e["ph"] == "M" and e.get("tid") == DP_COMM for e in events)


def test_dp_override_reaches_the_communication():
    r = simulate(_plan(1, dp=1), COSTS, FREE, dp=8, dp_link=DP_LINK)
    assert r.dp == 8 and r.reduce_scatter.tolist() == pytest.approx([_half(g, 8) for g in GRADS])
    assert np.all(r.comm >= r.dp_comm.total)
