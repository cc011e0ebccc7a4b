"""The header's runtime fields in the simulator: blocking sends, Megatron's overlapped gradient
reduction and parameter all-gather, against hand-worked timelines."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from octodsl.costs import Link, StageCost, uniform_stage_costs
from octodsl.costs.devices import CommSms
from octodsl.costs.param_bytes import StaticBytes
from octodsl.gen import generate
from octodsl.plan import Plan
from octodsl.sim import SimCosts, compile, simulate
from octodsl.sim.dpcomm import BUCKET_PARAMS, buckets

from .plans import make_plan

FREE = Link("none", 0.0, 0.0)
DP_LINK = Link("dp", 0.0, 100.0)


def _with(plan: Plan, **header) -> Plan:
    return dataclasses.replace(plan, header=plan.header.model_copy(update=header))


def test_a_blocking_send_holds_the_senders_next_op():
    # F0:0 ends at 1 and its activation takes 3: device 0's F0:1 waits until 4 when sends block.
    plan = make_plan(2, 2, [["F0:0", "F0:1", "BW0:0", "BW0:1"], ["F1:0", "F1:1", "BW1:0", "BW1:1"]])
    costs = uniform_stage_costs(2, 1, 1, 0)
    link = Link("fixed", 3.0, 0.0)
    async_ = {f"{o.kind}{o.stage}:{o.mb}": o.start for o in simulate(plan, costs, link).ops()}
    held = {
        f"{o.kind}{o.stage}:{o.mb}": o.start
        for o in simulate(_with(plan, overlap_p2p_comm=False), costs, link).ops()
    }
    assert async_["F0:1"] == pytest.approx(1)
    assert held["F0:1"] == pytest.approx(4)
    assert held["BW0:0"] >= held["F0:1"] + 3 - 1e-9  # F0:1's own send holds BW0:0 too


def test_blocking_sends_never_change_a_single_device():
    plan = generate("1f1b", 1, 4)
    costs = uniform_stage_costs(1, 1, 1, 1)
    assert (
        simulate(_with(plan, overlap_p2p_comm=False), costs, FREE).iteration_time
        == simulate(plan, costs, FREE).iteration_time
    )


@pytest.mark.parametrize(
    "name,p,m", [("1f1b", 4, 8), ("interleaved", 2, 4), ("zb-v", 2, 4), ("dualpipev", 2, 4)]
)
def test_blocking_sends_only_add_waits(name, p, m):
    plan = generate(name, p, m)
    costs = uniform_stage_costs(plan.num_stages, 1, 1, 1)
    link = Link("l", 0.3, 0.0)
    assert (
        simulate(_with(plan, overlap_p2p_comm=False), costs, link).iteration_time
        >= simulate(plan, costs, link).iteration_time - 1e-9
    )
    # a blocked program is compiled anew when only the order changes (the held node moves)
    blocked = _with(plan, overlap_p2p_comm=False)
    assert (
        compile(blocked, like=compile(blocked)).msg_hold.tolist()
        == compile(blocked).msg_hold.tolist()
    )


def _dp(plan: Plan, grads: float, link: Link = DP_LINK, slowdown: float = 0.0, **header):
    plan = _with(plan, dp=4, **header)
    stages = tuple(StageCost(1.0, 1.0, 1.0, 1.0, 0.5, 0.0, 0.0) for _ in range(plan.num_stages))
    return simulate(
        plan,
        SimCosts(
            stages,
            grad_bytes=(grads,) * plan.num_stages,
            param_bytes=StaticBytes("bf16", "deepspeed", 16.0),
            zero=plan.header.zero,
            dp=4,
            grad_reduce_bytes=4.0,
            # 4 copies of 2 devices: one node, where a ring holds `dp_node` of the 100 SMs
            comm_sms=CommSms(dp_node=round(100 * slowdown)),
            sms=100,
        ),
        FREE,
        dp_link=link,
    )


def test_the_overlapped_gradient_reduction_starts_with_the_last_backward():
    plan = generate("1f1b", 2, 4)
    after = _dp(plan, 600.0)
    during = _dp(plan, 600.0, overlap_grad_reduce=True)
    ring = 2 * 3 * (600.0 / 4 / DP_LINK.bandwidth)
    assert after.allreduce.tolist() == pytest.approx([ring, ring])
    ops = {(o.kind, o.stage, o.mb): o for o in during.ops()}
    for d in range(2):
        last = ops[("BW", d, 3)]
        start, end = float(during.dp_comm.span_start[d]), float(during.dp_comm.span_end[d])
        assert start == pytest.approx(last.start)
        # 600 bytes / 4 = 150 parameters: one bucket, so it ends no sooner than the BW's end + all
        assert end == pytest.approx(max(last.start + ring, last.end + ring))
    assert during.iteration_time <= after.iteration_time + 1e-9
    assert during.dp_comm.reduction_hidden.sum() > 0


def test_buckets_follow_megatrons_default_size():
    assert buckets([1, BUCKET_PARAMS, BUCKET_PARAMS + 1], dp=8).tolist() == [1, 1, 2]
    assert buckets([100_000_000], dp=64).tolist() == [2]  # max(40M, 1M x 64) = 64M


def test_the_overlapped_all_gather_hides_under_the_forwards():
    plan = generate("1f1b", 2, 4)
    plain = _dp(plan, 600.0, zero=1)
    hidden = _dp(plan, 600.0, zero=1, overlap_param_gather=True, overlap_grad_reduce=True)
    assert plain.dp_comm.gather_exposed.tolist() == plain.all_gather.tolist()
    # one bucket each: its all-gather is exposed whole unless the forwards (4 s) are shorter
    assert hidden.dp_comm.gather_exposed.tolist() == pytest.approx(
        [max(g, g - 4.0) for g in hidden.all_gather.tolist()]
    )
    # the all-gather moves the bf16 parameters, half the fp32 gradients' bytes
    assert plain.all_gather.tolist() == pytest.approx([3 * (300.0 / 4 / 100.0)] * 2)


def test_the_collectives_under_compute_slow_it_by_the_sms_they_hold():
    """A collective's kernel holds a quarter of the SMs: the compute under it loses a quarter
    of its rate for the collective's running seconds, at the device's compute's end (the
    reductions under the last backwards); an overlapped all-gather slows the next forwards."""
    plan = generate("1f1b", 2, 4)
    # 8e8 fp32 gradient bytes: 2e8 parameters, 5 buckets; a ring of 4 ranks takes 1 s
    link = Link("dp", 0.0, 3 * 8e8 / 4)
    header = {"zero": 1, "overlap_grad_reduce": True, "overlap_param_gather": True}
    free = _dp(plan, 8e8, link, **header)
    slow = _dp(plan, 8e8, link, slowdown=0.25, **header)
    f, s = free.dp_comm, slow.dp_comm
    assert f.slowed.tolist() == [0.0, 0.0]
    # each device's last BW (2 s) runs under its reduction's whole second (its last bucket's
    # fifth after it): a quarter of that second is lost
    busy = np.array([1.0, 1.0])
    assert f.reduction_hidden.min() >= 1.0 - 1e-9
    assert s.slowed.tolist() == pytest.approx((0.25 * busy).tolist(), rel=1e-9)
    assert s.reduction_hidden.tolist() == pytest.approx(
        (f.reduction_hidden - s.slowed).tolist(), rel=1e-9
    )
    ends = [max(o.end for o in free.ops() if o.device == d) for d in range(2)]
    assert s.compute_end.tolist() == pytest.approx((np.array(ends) + s.slowed).tolist())
    assert s.update_start == pytest.approx(
        max(float(s.compute_end.max()), float(s.span_end.max())), rel=1e-12
    )
    # the all-gather's part under the next forwards costs them a quarter of it
    g, e = f.all_gather, f.gather_exposed
    assert s.gather_exposed.tolist() == pytest.approx((e + 0.25 * (g - e)).tolist())
    assert slow.iteration_time == pytest.approx(
        s.update_start + float((slow.update + s.gather_exposed).max())
    )
    assert slow.iteration_time > free.iteration_time
    # what the overlap costs is counted exposed, and the slowed seconds as compute
    assert slow.exposed()["grad_reduce"].tolist() == pytest.approx(
        (free.exposed()["grad_reduce"] + s.slowed).tolist()
    )
    assert slow.busy.tolist() == pytest.approx((free.busy + s.slowed).tolist())


def test_the_critical_path_ends_in_the_slowed_compute_when_it_ends_last():
    plan = generate("1f1b", 2, 4)
    # one bucket of a short ring under a long BW: the reductions end before the slowed compute
    link = Link("dp", 0.0, 3 * 8e8 / 4 * 10)  # 0.1 s
    r = _dp(plan, 8e8, link, slowdown=0.5, zero=1, overlap_grad_reduce=True)
    dpc = r.dp_comm
    assert dpc.compute_end.max() > dpc.span_end.max()
    path = r.critical_path()
    kinds = [s.kind for s in path]
    assert kinds[-2:] == ["slowed", "all-gather"]  # these stages have no optimizer step
    slowed = path[-2]
    assert slowed.end - slowed.start == pytest.approx(float(dpc.slowed[slowed.device]))
    assert slowed.end == pytest.approx(dpc.update_start)
    for a, b in zip(path, path[1:], strict=False):
        assert b.start == pytest.approx(a.end, abs=1e-12)
