"""The memory levers in the costs: bytes per parameter and ZeRO sharding of the static bytes,
full and selective recompute (`CostTable.range_costs`), and what the memory timeline and the
simulated B make of them. Every figure is hand-computed from the small table below; its values
are dyadic (and 7/16, 9/16, 5.5/16 are too), so the sums are exact and compared with ==."""

from __future__ import annotations

import pytest

from octodsl.costs import Link
from octodsl.costs.param_bytes import ParamBytes, StaticBytes
from octodsl.costs.table import Calibration, CostTable, LayerCost
from octodsl.plan import Recompute, Stage
from octodsl.sim import SimCosts, compile, memory, simulate

from ..sim.plans import make_plan

FREE = Link("none", 0.0, 0.0)
FULL, SEL, NONE = Recompute.FULL, Recompute.SELECTIVE, Recompute.NONE


def _table(calibration: Calibration | None = None) -> CostTable:
    def layer(kind, f, b, w, act, act_w, params, out, sel_f=0.0, sel_act=0.0):
        return LayerCost(kind, f, b, w, act, act_w, 16.0 * params, params, out, sel_f, sel_act)

    return CostTable(
        [
            layer("embedding", 1.0, 0.0, 1.0, 8.0, 8.0, 100, 40.0),
            layer("attention", 2.0, 3.0, 1.0, 100.0, 60.0, 50, 40.0, 0.5, 30.0),
            layer("mlp", 3.0, 3.0, 2.0, 120.0, 100.0, 200, 40.0, 0.25, 50.0),
            layer("lm_head_loss", 4.0, 4.0, 2.0, 200.0, 80.0, 100, 0.0, 0.125, 40.0),
        ],
        "test",
        meta={"dtype": "bf16", "bytes_per_param": 16},
        calibration=calibration,
    )


RANGES = [(0, 1), (2, 3)]  # 150 and 300 parameters


def test_the_table_counts_16_and_the_runtime_says_what_is_held():
    assert _table().static_bytes() == StaticBytes("bf16", "deepspeed", 16.0)
    assert _table().static_bytes("megatron").share(1, 8) == 7.5 / 16
    # a table whose static counts nothing (bytes_per_param 0) holds nothing under any runtime
    empty = StaticBytes("bf16", "megatron", 0.0)
    assert empty.sharded(1, 8) == ParamBytes(0.0, 0.0, 0.0) and empty.share(1, 8) == 1.0


@pytest.mark.parametrize(
    "runtime,zero,dp,per_param",
    [
        # DeepSpeed's BF16 optimizer at stage 0: bf16 .grad and flat accumulator, 12 / dp
        ("deepspeed", 0, 4, 2 + 4 + 3),
        ("deepspeed", 0, 1, 18),
        ("deepspeed", 1, 1, 16),
        ("deepspeed", 1, 4, 2 + 2 + 3),
        ("deepspeed", 2, 4, 2 + 0.5 + 3),
        # Megatron-LM: the fp32 main_grad buffer whole at every stage
        ("megatron", 0, 4, 18),
        ("megatron", 1, 4, 2 + 4 + 3),
        ("megatron", 2, 4, 2 + 4 + 3),
        # DeepSpeed's BF16 optimizer at stage 1 with fp32 accumulation (grad_accum_dtype fp32):
        # bf16 .grad and the fp32 buffer, 12 / dp
        ("deepspeed-fp32", 1, 4, 2 + 2 + 4 + 3),
    ],
)
def test_static_bytes_per_device_are_sharded_over_dp(runtime, zero, dp, per_param):
    runtime, _, accum = runtime.partition("-")
    held = _table().static_bytes(runtime, accum or None)
    stages = _table().range_costs(RANGES, zero=zero, dp=dp, held=held)
    assert [c.static for c in stages] == [150 * per_param, 300 * per_param]


def test_static_parts_after_sharding():
    plan = make_plan(2, 1, [["F0:0", "BW0:0"], ["F1:0", "BW1:0"]], zero=2, dp=4)
    plan.stages[:] = [Stage(0, 1), Stage(2, 3)]
    costs = SimCosts.from_table(_table(), plan)
    assert (costs.zero, costs.dp) == (2, 4)
    # zero 2 is Megatron's (plan_runtime): its distributed optimizer keeps the fp32 gradient
    # buffer whole
    assert costs.param_bytes == StaticBytes("bf16", "megatron", 16.0)
    assert costs.static_parts(1) == ParamBytes(300 * 2, 300 * 4, 300 * 3)
    assert SimCosts(costs.stages).static_parts(1) is None  # per-parameter bytes unknown


def test_full_recompute_keeps_the_stage_input_and_reruns_its_forward():
    s0, s1 = _table().range_costs(RANGES, [FULL, FULL])
    # stage 0 keeps the token ids (the embedding's act), stage 1 the activation it received
    assert (s0.b, s0.act, s0.act_b, s0.act_w) == (3.0 + 3.0, 8.0, 100.0, 68.0)
    assert (s1.b, s1.act, s1.act_b, s1.act_w) == (7.0 + 7.0, 40.0, 280.0, 180.0)
    assert (s1.f, s1.w) == (7.0, 4.0)  # F and W unchanged


def test_selective_recompute_drops_and_reruns_the_selected_parts():
    s0, s1 = _table().range_costs(RANGES, [SEL, NONE])
    assert (s0.b, s0.act, s0.act_b, s0.act_w) == (3.0 + 0.5, 108.0 - 30.0, 30.0, 68.0)
    assert (s1.b, s1.act, s1.act_b) == (7.0, 320.0, 0.0)


def test_calibrated_recompute_and_sharded_optimizer_step():
    cal = Calibration(
        scale={"F": 2.0, "B": 1.0}, overhead={"B": 0.5, "BW": 0.25}, update_per_param=0.01
    )
    (s0,) = _table(cal).range_costs([(0, 1)], [FULL], zero=1, dp=4)
    assert s0.b == (3.0 + 0.5) + 2.0 * 3.0  # calibrated B, plus the forward at F's scale
    assert s0.bw == (5.0 + 0.25) + 2.0 * 3.0  # a fused BW: b + w calibrated, plus the same
    assert s0.update == 0.01 * 150 / 4  # this copy's shard of the optimizer step
    (plain,) = _table(cal).range_costs([(0, 1)], zero=0, dp=4)
    assert plain.update == 0.01 * 150


def _one_device_plan(orders: list[str], recompute: tuple[Recompute, Recompute]):
    plan = make_plan(1, 2, [orders], num_stages=2, placement=[(0, 1)])
    plan.stages[:] = [Stage(0, 1, recompute=recompute[0]), Stage(2, 3, recompute=recompute[1])]
    return plan


SPLIT = [
    "F0:0",
    "F1:0",
    "F0:1",
    "F1:1",
    "B1:0",
    "B0:0",
    "B1:1",
    "B0:1",
    "W1:0",
    "W0:0",
    "W1:1",
    "W0:1",
]


def test_recompute_timeline_peaks_at_b_with_what_it_brings_back():
    plan = _one_device_plan(SPLIT, (SEL, FULL))
    costs = SimCosts.from_table(_table(), plan)
    r = simulate(plan, costs, FREE)
    p = r.program
    static = 150 * 18.0 + 300 * 18.0  # DeepSpeed's BF16 optimizer at zero 0, dp 1
    # F keeps 78 (stage 0, selective) and 40 (stage 1, full); B brings back 30 and 280, and
    # leaves act_w (68, 180) until W.
    starts = [static + x for x in (78, 118, 196, 236, 516, 406, 646, 536, 496, 316, 248, 68)]
    ends = [static + x for x in (78, 118, 196, 236, 376, 366, 506, 496, 316, 248, 68, 0)]
    order = p.order_nodes.tolist()
    assert r.memory.at_start[order].tolist() == starts
    assert r.memory.at_end[order].tolist() == ends
    assert r.peak_memory[0] == static + 646 and r.peak_ops() == ["B1:1"]
    # Without recompute the peak is the last forward's, higher.
    keep = _one_device_plan(SPLIT, (NONE, NONE))
    assert memory(compile(keep), SimCosts.from_table(_table(), keep).stages).peak[0] == static + 856
    # B runs the recomputation first: stage 1's B is its F + B, stage 0's B + the selected F.
    b = {op.label: op.end - op.start for op in r.ops() if op.kind == "B"}
    assert b == {"B1:0": 14.0, "B1:1": 14.0, "B0:0": 3.5, "B0:1": 3.5}


def test_recompute_with_a_fused_backward_frees_everything_at_its_end():
    plan = _one_device_plan(
        ["F0:0", "F1:0", "BW1:0", "BW0:0", "F0:1", "F1:1", "BW1:1", "BW0:1"], (SEL, FULL)
    )
    mem = memory(compile(plan), SimCosts.from_table(_table(), plan).stages)
    static = 450 * 18.0  # as above
    order = compile(plan).order_nodes.tolist()
    assert mem.at_start[order].tolist()[:4] == [
        static + 78,
        static + 118,
        static + 398,
        static + 108,
    ]
    assert mem.at_end[order].tolist()[:4] == [static + 78, static + 118, static + 78, static]
    assert mem.peak[0] == static + 398  # BW1 with stage 1's 280 brought back
