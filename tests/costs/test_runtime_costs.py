"""What the header's runtime fields and the model's kernel choices do to per-layer costs:
tp overlap, scatter/gather, the gradient-accumulation pass, unfused attention, dropout, the
attention curves, the per-op overheads, the fp32 gradient reduction."""

from __future__ import annotations

import dataclasses

import pytest

from octodsl.costs.analytical import OPTIMIZER_BYTES, analytical_costs
from octodsl.costs.attention import AttentionCurve
from octodsl.costs.devices import (
    A100_ATTENTION,
    MEGATRON_A100_OVERHEADS,
    CommSms,
    get_device,
)
from octodsl.costs.resolve import cost_table, header_costing
from octodsl.gen import generate
from octodsl.models import load_model
from octodsl.models.load import SpecError, parse_model
from octodsl.sim import SimCosts
from octodsl.sim.costs import TpMismatch

A100 = get_device("A100")
GPT = {
    "name": "gpt",
    "hidden": 2048,
    "vocab": 32000,
    "seq_len": 2048,
    "pattern": "*-*-",
    "attention": {"heads": 16, "kv_heads": 16, "head_dim": 128},
    "mlp": {"ffn": 8192, "activation": "gelu"},
}


def _spec(**kw):
    data = {**GPT, **kw}
    if "flash" in kw:
        data["attention"] = {**GPT["attention"], "flash": data.pop("flash")}
    return parse_model(data, "test")


def test_tp_overlap_hides_at_most_the_gemms():
    spec = load_model("llama3-70b").with_shape(1, 4096)
    plain = analytical_costs(spec, get_device("H100"), tp=8)
    hidden = analytical_costs(spec, get_device("H100"), tp=8, overlap_tp=True)
    for a, b in zip(plain.layers, hidden.layers, strict=True):
        assert b.tp_f == a.tp_f and b.tp_hidden_f <= b.tp_f
        assert a.f - b.f == pytest.approx(b.tp_hidden_f, abs=1e-15)
        assert b.f >= a.f - a.tp_f - 1e-15  # never faster than without any collective
    assert sum(b.tp_hidden_f for b in hidden.layers) > 0
    assert hidden.meta["overlap_tp_comm"] and not plain.meta["overlap_tp_comm"]


def test_overlapped_tp_collectives_slow_the_gemms_by_the_sms_they_hold():
    """Transformer Engine's userbuffers hold 16 SMs for the reduce-scatters of F and B and the
    all-gather of W; F's and B's all-gathers run on the copy engine. Under sequence
    parallelism F and B each run one all-gather and one reduce-scatter of the same bytes (so
    half their seconds hold SMs) and W one all-gather (all of it)."""
    spec = load_model("llama3-70b").with_shape(1, 4096)
    h100 = get_device("H100")
    free = dataclasses.replace(h100, comm_sms=CommSms())
    held = analytical_costs(spec, h100, tp=8, overlap_tp=True)
    unheld = analytical_costs(spec, free, tp=8, overlap_tp=True)
    slow = 16 / 132
    assert h100.overlap_slowdown(h100.comm_sms.tp) == slow
    blocks = [
        (a, b)
        for a, b in zip(unheld.layers, held.layers, strict=True)
        if a.kind in ("attention", "mlp")
    ]
    assert blocks
    for a, b in blocks:
        assert min(a.tp_hidden_f, a.tp_hidden_b, a.tp_hidden_w) > 0
        assert b.tp_hidden_f == pytest.approx(a.tp_hidden_f * (1 - 0.5 * slow), rel=1e-12)
        assert b.tp_hidden_b == pytest.approx(a.tp_hidden_b * (1 - 0.5 * slow), rel=1e-12)
        assert b.tp_hidden_w == pytest.approx(a.tp_hidden_w * (1 - slow), rel=1e-12)
        assert b.f - a.f == pytest.approx(a.tp_hidden_f - b.tp_hidden_f, abs=1e-15)
    # a CPU (no SMs) loses nothing
    assert get_device("cpu").overlap_slowdown(16) == 0.0


def test_a_table_costed_without_the_plans_overlap_is_refused():
    plan = generate("1f1b", 2, 4, model="llama3-8b", mesh={"tp": 2, "overlap_tp_comm": True})
    plain = cost_table(model="llama3-8b", device="H100", tp=2)
    with pytest.raises(TpMismatch, match="overlap_tp_comm"):
        SimCosts.from_table(plain, plan)
    SimCosts.from_table(
        cost_table(model="llama3-8b", device="H100", **header_costing(plan.header)), plan
    )


def test_scatter_gather_sends_one_slice_per_gpu_without_sp():
    spec = load_model("llama3-8b")
    whole = analytical_costs(spec, A100, tp=4, sp=False)
    sliced = analytical_costs(spec, A100, tp=4, sp=False, scatter_gather=True)
    assert [s.message_bytes * 4 for s in sliced.layers] == [w.message_bytes for w in whole.layers]
    with_sp = analytical_costs(spec, A100, tp=4, sp=True, scatter_gather=True)
    assert with_sp.meta["scatter_gather_messages"] is False  # sp already sends the slice


def test_the_accumulation_pass_is_in_w_unless_fused():
    plan = generate("1f1b", 2, 4, model="llama3-8b")
    table = cost_table(model="llama3-8b", device="A100")
    separate = table.stage_costs(plan)
    fused = table.stage_costs(
        dataclasses.replace(
            plan, header=plan.header.model_copy(update={"grad_accumulation_fusion": True})
        )
    )
    layer = table.layers[5]
    # bf16: read the new bf16 gradient (2), read and write the fp32 accumulator (4 + 4)
    assert layer.grad_acc == pytest.approx(layer.params * 10 / A100.bandwidth)
    for a, b in zip(separate, fused, strict=True):
        assert a.w > b.w and a.f == b.f


@pytest.mark.parametrize("dtype,nbytes", [("bf16", 2 + 4 + 4), ("fp16", 2 + 2 + 2), ("fp32", 12)])
def test_the_accumulation_pass_moves_the_accumulators_bytes(dtype, nbytes):
    # Megatron-LM accumulates (and reduces) a bf16 model's gradients in fp32, an fp16 model's in
    # fp16: the pass and the data-parallel collectives read the same accumulator
    spec = load_model("llama3-8b").model_copy(update={"dtype": dtype})
    table = analytical_costs(spec, A100)
    layer = table.layers[5]
    assert layer.grad_acc == pytest.approx(layer.params * nbytes / A100.bandwidth)
    held = table.static_bytes("megatron")
    assert held.reduce_bytes == {"bf16": 4, "fp16": 2, "fp32": 4}[dtype]
    assert held.accumulation(False) == 1.0 and held.accumulation(True) == 0.0


@pytest.mark.parametrize(
    "dtype,accum,nbytes,reduced",
    [("bf16", None, 2 + 2 + 2, 2), ("bf16", "fp32", 2 + 4 + 4, 2), ("fp32", None, 12, 4)],
)
def test_deepspeed_accumulates_in_its_dtype_and_reduces_in_the_models(
    dtype, accum, nbytes, reduced
):
    # DeepSpeed's `.grad` (or its BF16 optimizer's fp32 buffer with grad_accum_dtype fp32) and
    # its communication_data_type, the model's dtype
    spec = load_model("llama3-8b").model_copy(update={"dtype": dtype})
    table = analytical_costs(spec, A100)
    layer = table.layers[5]
    held = table.static_bytes("deepspeed", accum)
    assert held.reduce_bytes == reduced
    assert layer.w_run(held.accumulation(False)) == pytest.approx(
        layer.w + layer.params * nbytes / A100.bandwidth
    )


def test_unfused_attention_writes_the_scores():
    flash, unfused = (analytical_costs(_spec(flash=f), A100).layers[1] for f in (True, False))
    scores = 16 * 2048 * 2048 * 2  # heads x s x s, bf16
    # the probabilities instead of flash's output and fp32 log-sum-exp
    assert unfused.act - flash.act == pytest.approx(scores - 4 * 2048 * 16)
    assert unfused.f > flash.f and unfused.b > flash.b
    # selective recompute drops the probabilities (Korthikanti et al.'s 5as/h term)
    assert unfused.sel_act >= scores


def test_dropout_keeps_a_one_byte_mask_per_output():
    none, some = (analytical_costs(_spec(dropout=p), A100).layers[2] for p in (0.0, 0.1))
    assert some.act - none.act == pytest.approx(2048 * 2048)  # tokens x hidden, one byte
    with pytest.raises(SpecError, match="dropout"):
        _spec(dropout=1.0)


def test_attention_curves_interpolate_in_log_length_and_clamp():
    c = AttentionCurve(128, (1024, 4096), (100.0, 200.0))
    assert c.at(2048) == pytest.approx(150.0)
    assert c.at(10) == 100.0 and c.at(1 << 20) == 200.0
    f, b = A100_ATTENTION.rates(2048, 96)  # between the 64 and 128 curves
    assert 140e12 < f < 155e12 and f == b


def test_longer_sequences_run_the_attention_kernel_faster():
    rates = [A100_ATTENTION.rates(s, 128)[0] for s in (512, 2048, 8192)]
    assert rates == sorted(rates) and rates[0] == 99e12 and rates[-1] == 182e12


def test_per_op_overheads_scale_with_the_activation():
    spec = _spec()
    gpu = analytical_costs(spec, A100)
    o = MEGATRON_A100_OVERHEADS
    elements = 2048 * 2048
    # the MLP with and without the overhead bytes: the difference is the per-element part
    bare = analytical_costs(
        spec, dataclasses.replace(A100, overheads=dataclasses.replace(o, f_bytes=0.0, b_bytes=0.0))
    )
    assert gpu.layers[2].f - bare.layers[2].f == pytest.approx(
        elements * o.f_bytes / A100.mem_bandwidth
    )
    assert gpu.layers[2].host_f == o.f_seconds and gpu.layers[0].host_f == 0.0  # not the embedding
    # the host's part only where ops wait for messages
    one = cost_table(model="llama3-8b", device="A100")
    two_devices = one.pipelined().range_costs([(0, 10), (11, 65)])
    alone = one.range_costs([(0, 10), (11, 65)])
    assert two_devices[0].f - alone[0].f == pytest.approx(sum(l.host_f for l in one.layers[:11]))


def test_bf16_gradients_reduce_in_fp32_and_update_through_memory():
    table = cost_table(model="llama3-8b", device="A100")
    assert table.static_bytes("megatron").reduce_bytes == 4
    assert table.grad_params(5, 5) == table.layers[5].params
    assert table.layers[5].update == pytest.approx(
        table.layers[5].params * OPTIMIZER_BYTES / A100.bandwidth
    )
