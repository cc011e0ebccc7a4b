"""Bytes per parameter by dtype, runtime and ZeRO stage, each worked out by hand from the code
or document octodsl.costs.param_bytes cites; and which runtime a plan's header implies. The
figures are sums of small dyadic fractions, so == is exact."""

from __future__ import annotations

import pytest

from octodsl.costs.param_bytes import ParamBytes, param_bytes
from octodsl.plan import DEEPSPEED, MEGATRON, Header, plan_runtime


@pytest.mark.parametrize(
    "dtype,zero,dp,parts",
    [
        # Megatron-LM's dist_optimizer.md table: bf16 params, fp32 grads: 18, 6 + 12/d
        ("bf16", 0, 8, (2, 4, 12)),
        ("bf16", 1, 8, (2, 4, 12 / 8)),  # 6 + 12/8 = 7.5
        ("bf16", 2, 8, (2, 4, 12 / 8)),  # the grad buffer is reduce-scattered in place
        # fp16 params, fp16 grads: 20, 4 + 16/d
        ("fp16", 0, 4, (2, 2, 16)),
        ("fp16", 1, 4, (2, 2, 4)),
        # fp32: 16, 8 + 8/d
        ("fp32", 0, 4, (4, 4, 8)),
        ("fp32", 1, 4, (4, 4, 2)),
    ],
)
def test_megatron(dtype, zero, dp, parts):
    assert param_bytes(dtype, MEGATRON, zero, dp) == ParamBytes(*map(float, parts))


def test_megatron_totals_are_its_documented_ones():
    for dtype, plain, base, sharded in (
        ("bf16", 18, 6, 12),
        ("fp16", 20, 4, 16),
        ("fp32", 16, 8, 8),
    ):
        assert param_bytes(dtype, MEGATRON, 0, 8).total == plain
        assert param_bytes(dtype, MEGATRON, 1, 8).total == base + sharded / 8


def test_a_1b_bf16_model_on_megatron_with_the_distributed_optimizer_at_dp_8():
    assert 10**9 * param_bytes("bf16", MEGATRON, 1, 8).total == 7.5e9


@pytest.mark.parametrize(
    "dtype,zero,dp,parts",
    [
        # BF16_Optimizer (stage 0 in a pipeline): flat bf16 params 2; each .grad 2 and the flat
        # accumulator in grad_acc_dtype (bf16 with no data_types) 2; fp32 partition + m, v / dp
        ("bf16", 0, 1, (2, 4, 12)),
        ("bf16", 0, 8, (2, 4, 1.5)),
        # DeepSpeedZeroOptimizer stage 1: .grad whole, fp32 partition + m, v over dp
        ("bf16", 1, 8, (2, 2, 1.5)),
        ("fp16", 1, 8, (2, 2, 1.5)),
        # FP16_Optimizer: whole fp32 copy + m, v
        ("fp16", 0, 8, (2, 2, 12)),
        # fp32: the plain optimizer's m, v; at stage 1 a cloned fp32 partition besides them
        ("fp32", 0, 8, (4, 4, 8)),
        ("fp32", 1, 8, (4, 4, 1.5)),
        # ZeRO stage 2: the gradients sharded too
        ("bf16", 2, 8, (2, 0.25, 1.5)),
    ],
)
def test_deepspeed(dtype, zero, dp, parts):
    assert param_bytes(dtype, DEEPSPEED, zero, dp) == ParamBytes(*map(float, parts))


def test_an_unknown_runtime_is_refused():
    with pytest.raises(ValueError, match="unknown runtime"):
        param_bytes("bf16", "jax", 0)


def _header(**fields) -> Header:
    return Header(name="p", devices=2, microbatches=4, **fields)


@pytest.mark.parametrize(
    "fields,runtime",
    [
        ({}, DEEPSPEED),
        ({"dp": 8, "zero": 1}, DEEPSPEED),
        ({"dp": 8, "zero": 1, "reduce_scatter": False}, DEEPSPEED),
        ({"overlap_p2p_comm": False}, DEEPSPEED),  # Megatron's default, DeepSpeed's stock too
        ({"dp": 8, "zero": 2}, MEGATRON),
        ({"grad_accumulation_fusion": True}, MEGATRON),
        ({"overlap_grad_reduce": True}, MEGATRON),
        ({"overlap_param_gather": True}, MEGATRON),
        ({"overlap_tp_comm": True}, MEGATRON),
        # DeepSpeed's stock engine scatters and gathers too (pipe_partitioned, with tp > 1)
        ({"scatter_gather_messages": True}, DEEPSPEED),
    ],
)
def test_the_runtime_a_header_implies(fields, runtime):
    assert plan_runtime(_header(**fields)) == runtime


@pytest.mark.parametrize("written", [DEEPSPEED, MEGATRON])
def test_a_written_runtime_is_the_plans_whatever_the_fields_imply(written):
    assert plan_runtime(_header(runtime=written)) == written
    assert plan_runtime(_header(dp=8, zero=1, runtime=written)) == written
    # not a contradiction for Megatron (it runs both ways); lint's E407 refuses the other way
    assert plan_runtime(_header(overlap_grad_reduce=True, runtime=MEGATRON)) == MEGATRON


def test_a_header_refuses_an_unknown_runtime():
    with pytest.raises(ValueError, match="one of deepspeed, megatron"):
        _header(runtime="colossalai")
