"""GQA's KV heads over a tp group, in one function (`models.tp.kv_split`): over random (heads,
kv_heads, tp), the executor's attention layer on every rank and the cost model's work of one GPU
hold the KV heads it says, and it agrees with GQA's own rule (query head q uses KV head
q // (heads / kv_heads)). No process group is needed: building a tp layer only slices weights."""

from __future__ import annotations

import torch
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from octodsl.costs.work import layer_work
from octodsl.layers import Attention
from octodsl.layers import tensor_parallel as tpl
from octodsl.models.load import parse_model
from octodsl.models.spec import AttentionConfig
from octodsl.models.tp import kv_split, layer_problems

HIDDEN, HEAD_DIM = 8, 2


def _splits(heads: int, kv_heads: int, tp: int) -> bool:
    """Megatron's rule, written here from the layout: tp divides the query heads, and divides
    the KV heads or is a multiple of them."""
    return heads % tp == 0 and (kv_heads % tp == 0 or tp % kv_heads == 0)


@st.composite
def gqa(draw, valid: bool = True) -> tuple[int, int, int, bool]:
    kv_heads = draw(st.integers(1, 8))
    heads = kv_heads * draw(st.integers(1, 4))
    tp = draw(st.sampled_from([1, 2, 3, 4, 6, 8, 16]))
    if valid:
        assume(_splits(heads, kv_heads, tp))
    return heads, kv_heads, tp, draw(st.booleans())


@settings(max_examples=200, deadline=None)
@given(gqa(valid=False))
def test_the_problems_are_fatal_exactly_where_the_layout_does_not_split(case):
    heads, kv_heads, tp, _ = case
    layer = AttentionConfig(heads=heads, kv_heads=kv_heads, head_dim=HEAD_DIM)
    assert any(p.fatal for p in layer_problems(layer, tp)) == (not _splits(heads, kv_heads, tp))


@settings(max_examples=200, deadline=None)
@given(gqa())
def test_kv_split_is_the_heads_each_gpus_query_heads_use(case):
    heads, kv_heads, tp, _ = case
    kv = kv_split(kv_heads, tp)
    group = heads // kv_heads
    used = [
        sorted({q // group for q in range(r * heads // tp, (r + 1) * heads // tp)})
        for r in range(tp)
    ]
    assert all(
        u == list(range(kv.first_head(r), kv.first_head(r) + kv.per_gpu))
        for r, u in enumerate(used)
    )
    assert all(sum(h in u for u in used) == kv.sharers for h in range(kv_heads))
    assert kv.replicated == (kv_heads < tp)


@settings(max_examples=60, deadline=None)
@given(gqa())
def test_the_executor_and_the_cost_model_hold_the_kv_heads_kv_split_says(case):
    heads, kv_heads, tp, gate = case
    block = {"heads": heads, "kv_heads": kv_heads, "head_dim": HEAD_DIM, "output_gate": gate}
    spec = parse_model(
        {
            "name": "gqa",
            "hidden": HIDDEN,
            "vocab": 64,
            "seq_len": 4,
            "pattern": "*",
            "attention": block,
        },
        "test",
    )
    kv = kv_split(kv_heads, tp)
    q_rows = heads // tp * HEAD_DIM * (2 if gate else 1)
    rows = q_rows + 2 * kv.per_gpu * HEAD_DIM  # this GPU's fused QKV projection
    for rank in range(tp):
        torch.manual_seed(0)
        full = Attention(spec.layers[1], HIDDEN)
        torch.manual_seed(0)
        with tpl.building(tpl.TpGroup(tp, rank)):
            layer = Attention(spec.layers[1], HIDDEN)
        assert layer.cfg.kv_heads == kv.per_gpu and layer.sharers == kv.sharers
        assert (layer.kv is not None) == kv.replicated
        held = (
            layer.qkv.weight if layer.kv is None else torch.cat([layer.qkv.weight, layer.kv.weight])
        )
        assert held.shape == (rows, HIDDEN)
        # the KV rows held are those of heads first_head .. first_head + per_gpu of the full
        # layer's K and then V blocks (the same init: equal copies, compared exactly)
        k0 = full.cfg.q_out + kv.first_head(rank) * HEAD_DIM
        width = kv.per_gpu * HEAD_DIM
        k_full = full.qkv.weight[k0 : k0 + width]
        v_full = full.qkv.weight[k0 + kv_heads * HEAD_DIM : k0 + kv_heads * HEAD_DIM + width]
        assert torch.equal(held[q_rows:], torch.cat([k_full, v_full]))

    work = layer_work(spec, spec.layers[1], tp, sp=tp > 1)
    assert work.gemms[0].n == rows
    # against the same layer with as many KV heads as query heads (never replicated): the only
    # difference in B's collectives is the replicated heads' gradient all-reduce
    mha = spec.model_copy(
        update={
            "layers": [
                spec.layers[0],
                spec.layers[1].model_copy(update={"kv_heads": heads}),
                spec.layers[2],
            ]
        }
    )
    base = layer_work(mha, mha.layers[1], tp, sp=tp > 1).tp_b
    extra = (("all-reduce", float(spec.tokens * 2 * HEAD_DIM * spec.dtype_bytes)),)
    assert work.tp_b == base + (extra if kv.replicated else ())
