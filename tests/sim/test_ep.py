"""The simulator under expert parallelism (issue 29): the experts' gradients reduced (and under
ZeRO their parameters gathered) over the dp / ep copies that hold them, the all-to-alls
reported per device, and a plan without ep simulating and printing exactly as before."""

from __future__ import annotations

import dataclasses
import json

import pytest

from octodsl.cli import main
from octodsl.costs import Link, StageCost, uniform_stage_costs
from octodsl.costs.resolve import cost_table, header_costing
from octodsl.gen import generate
from octodsl.plan import Plan
from octodsl.sim import SimCosts, simulate
from octodsl.sim.report import summary, to_json

FREE = Link("none", 0.0, 0.0)
DP_LINK = Link("dp", 0.01, 1000.0)
GRADS = (400.0, 800.0)
EXPERT = (300.0, 0.0)  # stage 0's gradients are three quarters experts', stage 1 has none


def _plan(zero: int, dp: int = 8, ep: int = 1) -> Plan:
    plan = generate("1f1b", 2, 4)
    return dataclasses.replace(
        plan, header=plan.header.model_copy(update={"zero": zero, "dp": dp, "ep": ep})
    )


def _pass(g: float, ranks: int) -> float:
    """One ring pass over `ranks` copies (dp - 1 steps of g / dp bytes)."""
    return 0.0 if ranks == 1 else (ranks - 1) * (DP_LINK.latency + g / ranks / DP_LINK.bandwidth)


@pytest.mark.parametrize("zero", [0, 1, 2])
def test_expert_gradients_reduce_over_dp_over_ep(zero):
    costs = SimCosts(
        tuple(uniform_stage_costs(2, 1, 1, 1)), grad_bytes=GRADS, expert_grad_bytes=EXPERT, ep=4
    )
    r = simulate(_plan(zero, ep=4), costs, FREE, dp_link=DP_LINK)
    passes = 2 if zero == 0 else 1
    per_backward = 4 if zero == 2 else 1  # zero 2: after each of the 4 micro-batches' backward
    want = [
        per_backward * passes * (_pass(g - e, 8) + _pass(e, 2))
        for g, e in zip(GRADS, EXPERT, strict=True)
    ]
    assert r.dp_comm.reduction.tolist() == pytest.approx(want)
    if zero:  # the updated parameters: the experts' gathered over their 2 copies too
        assert r.all_gather.tolist() == pytest.approx(
            [_pass(g - e, 8) + _pass(e, 2) for g, e in zip(GRADS, EXPERT, strict=True)]
        )
    # the same costs at ep 1 reduce everything over the 8 copies
    one = simulate(
        _plan(zero),
        dataclasses.replace(costs, ep=1),
        FREE,
        dp_link=DP_LINK,
    )
    assert one.dp_comm.reduction.tolist() == pytest.approx(
        [per_backward * passes * _pass(g, 8) for g in GRADS]
    )


def test_ep_equal_to_dp_leaves_no_expert_reduction():
    costs = SimCosts(
        tuple(uniform_stage_costs(2, 1, 1, 1)), grad_bytes=GRADS, expert_grad_bytes=EXPERT, ep=8
    )
    r = simulate(_plan(0, ep=8), costs, FREE, dp_link=DP_LINK)
    assert r.allreduce.tolist() == pytest.approx(
        [2 * _pass(g - e, 8) for g, e in zip(GRADS, EXPERT, strict=True)]
    )


def test_all_to_all_reported_per_device():
    stages = (
        StageCost(1.0, 2.0, 1.0, 1.0, 0.5, 0.0, 0.0, ep_f=0.1, ep_b=0.2),
        StageCost(1.0, 2.0, 1.0, 1.0, 0.5, 0.0, 0.0),
    )
    plan = _plan(0, ep=2)
    r = simulate(plan, SimCosts(stages, ep=2), FREE)
    # device 0: 4 forwards x 0.1 and 4 fused backwards x 0.2; device 1 has no MoE layer
    assert r.all_to_all.tolist() == pytest.approx([4 * 0.1 + 4 * 0.2, 0.0])
    assert r.exposed()["all_to_all"].tolist() == r.all_to_all.tolist()
    text = summary(r, link="none").renderables[0].plain
    assert "EP 2" in text and "expert all-to-all 1.200 s (in line)" in text
    obj = json.loads(json.dumps(to_json(r, link="none")))
    assert obj["ep"] == 2 and obj["all_to_all_time"] == pytest.approx([1.2, 0.0])


def test_a_plan_without_ep_prints_as_before():
    r = simulate(_plan(1), SimCosts(tuple(uniform_stage_costs(2, 1, 1, 1))), FREE)
    text = summary(r, link="none").renderables[0].plain
    assert "EP" not in text and "all-to-all" not in text and "ep " not in text
    assert r.all_to_all.tolist() == [0.0, 0.0]


def test_ep_1_costs_equal_the_costs_without_ep():
    """The header's default costs exactly what a header written before ep did: the same table
    (field by field) and the same simulation."""
    plan = generate("1f1b", 4, 8, model="jamba-v0.1", mesh={"dp": 4})
    h = plan.header
    args = header_costing(h)
    assert args["ep"] == 1
    with_ep = cost_table(model="jamba-v0.1", **args)
    without = cost_table(
        model="jamba-v0.1", **{k: v for k, v in args.items() if not k.startswith("ep")}
    )
    assert with_ep.layers == without.layers
    a = simulate(plan, SimCosts.from_table(with_ep, plan), FREE)
    b = simulate(plan, SimCosts.from_table(without, plan), FREE)
    assert a.iteration_time == b.iteration_time and a.peak_memory.tolist() == b.peak_memory.tolist()


def test_simulate_cli_takes_ep(tmp_path, capsys):
    path = tmp_path / "p.octo"
    assert (
        main(["gen", "1f1b", "-p", "4", "-m", "8", "--model", "jamba-v0.1", "-o", str(path)]) == 0
    )
    capsys.readouterr()
    assert main(["simulate", str(path), "--dp", "8", "--json"]) == 0
    base = json.loads(capsys.readouterr().out)
    assert main(["simulate", str(path), "--dp", "8", "--ep", "8", "--json"]) == 0
    ep = json.loads(capsys.readouterr().out)
    assert base["all_to_all_time"] == [0.0] * 4 and min(ep["all_to_all_time"]) > 0
    assert ep["exposed"]["all_to_all"] == ep["all_to_all_time"]
    assert "ep 8 on nvlink" in ep["costs"]
    assert max(s["static"] for s in ep["stages"]) < 0.5 * max(s["static"] for s in base["stages"])
    # an ep the dp copies cannot hold is refused in one line
    assert main(["simulate", str(path), "--dp", "6", "--ep", "4"]) != 0
    err = capsys.readouterr().err.strip()
    assert "ep 4 does not divide dp 6" in err and len(err.splitlines()) == 1


def test_static_parts_shard_the_experts_over_their_copies():
    """zero 1, dp 8, ep 4, stage 0 three quarters experts: per parameter the dense part holds
    2 + 2 + 12 / 8 bytes, the experts' 2 + 2 + 12 / 2."""
    from octodsl.costs.param_bytes import ParamBytes, StaticBytes

    stages = (
        StageCost(1.0, 1.0, 1.0, 1.0, 0.5, 8875.0, 0.0),
        StageCost(1.0, 1.0, 1.0, 1.0, 0.5, 5500.0, 0.0),
    )
    costs = SimCosts(
        stages,
        grad_bytes=GRADS,
        param_bytes=StaticBytes("bf16", "deepspeed", 16.0),
        zero=1,
        dp=8,
        expert_grad_bytes=EXPERT,
        ep=4,
    )
    assert costs.static_parts(0) == ParamBytes(2000.0, 2000.0, 4875.0)
    assert costs.static_parts(1) == ParamBytes(2000.0, 2000.0, 1500.0)  # no experts: dp's
