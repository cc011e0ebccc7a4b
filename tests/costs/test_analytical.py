"""The analytical cost model: FLOPs against the reference numbers, heterogeneity, scaling."""

from __future__ import annotations

import pytest

from octodsl.costs.analytical import BYTES_PER_PARAM, analytical_costs
from octodsl.costs.devices import get_device
from octodsl.costs.work import layer_work
from octodsl.models import load_model, parse_model

H800 = get_device("H800")


def per_kind(table, spec):
    """The first layer's cost of each kind."""
    out = {}
    for layer, cost in zip(spec.layers, table.layers, strict=True):
        out.setdefault(layer.kind, cost)
    return out


def mflop_per_token(spec, kind):
    layer = next(l for l in spec.layers if l.kind == kind)
    work = layer_work(spec, layer)
    return (work.gemm + work.core) / spec.tokens / 1e6


@pytest.mark.parametrize(
    "model,kind,expected",
    [
        ("nemotron-h-8b", "mamba2", 226),
        ("nemotron-h-8b", "attention", 117),
        ("nemotron-h-8b", "mlp", 352),
        ("nemotron-h-8b", "lm_head_loss", 1074),
        ("jamba-v0.1", "mamba1", 211),
        ("jamba-v0.1", "attention", 117),
        ("jamba-v0.1", "mlp", 352),
        ("jamba-v0.1", "moe", 705),
        ("jamba-v0.1", "lm_head_loss", 537),
        ("llama3-8b", "lm_head_loss", 1051),
    ],
)
def test_forward_flops_match_the_reference(model, kind, expected):
    """models-and-costs.md, derived at s = 4096 (MFLOP per token)."""
    assert mflop_per_token(load_model(model), kind) == pytest.approx(expected, rel=0.015)


def test_llama_layer_flops():
    spec = load_model("llama3-8b")
    assert mflop_per_token(spec, "attention") + mflop_per_token(spec, "mlp") == pytest.approx(
        470, rel=0.01
    )


def test_nemotron_8b_heterogeneity():
    spec = load_model("nemotron-h-8b")
    table = analytical_costs(spec, H800)
    k = per_kind(table, spec)
    assert k["mlp"].f > k["mamba2"].f > k["attention"].f > k["embedding"].f
    total = [c.f + c.b + c.w for c in table.layers]
    assert max(total) == total[-1]  # the LM head + loss is the heaviest layer
    # GEMM-dominated layers: B about F (their GEMMs and per-op overheads alike), W the weight
    # gradients' GEMMs alone; weight-free work puts B above W
    assert k["mlp"].b == pytest.approx(k["mlp"].f, rel=0.15)
    assert 0.5 * k["mlp"].f < k["mlp"].w < k["mlp"].f
    assert k["attention"].b > 1.5 * k["attention"].w
    assert k["mamba2"].b > 1.3 * k["mamba2"].w
    assert k["embedding"].b == 0 and k["embedding"].w > 0


def test_memory_fields():
    spec = load_model("jamba-v0.1")
    table = analytical_costs(spec, H800)
    T, h = spec.tokens, spec.hidden
    for i, (layer, cost) in enumerate(zip(spec.layers, table.layers, strict=True)):
        assert cost.params == spec.layer_params(i)
        assert cost.static == cost.params * BYTES_PER_PARAM
        assert 0 < cost.act_w <= cost.act
        assert cost.out_bytes == (0 if layer.kind == "lm_head_loss" else T * h * 2)
    k = per_kind(table, spec)
    assert k["moe"].act > k["mlp"].act > k["attention"].act
    assert k["lm_head_loss"].act_w < k["lm_head_loss"].act  # the log-softmax goes after B


def test_costs_follow_sequence_length_and_width():
    spec = load_model("nemotron-h-8b")
    short = per_kind(analytical_costs(spec.with_shape(seq_len=2048), H800), spec)
    long = per_kind(analytical_costs(spec.with_shape(seq_len=8192), H800), spec)
    # attention's core is quadratic in s: more than 4x from 2k to 8k tokens
    assert long["attention"].f > 4.2 * short["attention"].f
    # linear in the tokens but for the GEMMs' last wave, fuller with 4x the tiles (costs/gemm.py)
    assert 3.8 * short["mlp"].f < long["mlp"].f <= 4 * short["mlp"].f
    assert long["mamba2"].act == pytest.approx(4 * short["mamba2"].act, rel=0.01)
    data = spec.compact()
    wide = parse_model({**data, "mlp": {**data["mlp"], "ffn": 2 * data["mlp"]["ffn"]}}, "wide")
    base = per_kind(analytical_costs(spec, H800), spec)
    # twice the GEMMs, the same per-op overheads (they scale with tokens x hidden)
    assert per_kind(analytical_costs(wide, H800), wide)["mlp"].f > 1.6 * base["mlp"].f
    mb2 = analytical_costs(spec.with_shape(microbatch_size=2), H800)
    assert mb2.tokens_per_microbatch == 2 * spec.tokens


def test_devices_order_and_cpu():
    spec = load_model("llama3-8b")
    a100, h200 = (analytical_costs(spec, get_device(n)) for n in ("A100", "h200"))
    h800 = analytical_costs(spec, H800)
    assert a100.layers[1].f > h800.layers[1].f >= h200.layers[1].f
    tiny = load_model("nemotron-h-tiny")
    cpu = analytical_costs(tiny, get_device("cpu"))
    assert 1e-3 < sum(c.f for c in cpu.layers) < 1.0  # milliseconds to a second per forward
    assert cpu.meta["dtype"] == "fp32" and cpu.source == "analytical nemotron-h-tiny on cpu"


def test_analytical_only_kinds():
    spec = load_model("qwen3-next-80b")
    k = per_kind(analytical_costs(spec, H800), spec)
    assert k["gated_deltanet"].b > k["gated_deltanet"].w > 0
    assert k["moe"].f > 0
