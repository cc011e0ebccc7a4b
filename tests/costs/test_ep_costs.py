"""The analytical model under expert parallelism (issue 29): the all-to-all volumes and times,
the expert GEMMs at their rows, the experts' memory divided by ep and sharded over dp / ep, and
nothing changed at ep 1. Figures by hand from the formulas in octodsl/models/ep.py and
octodsl/costs/expert.py."""

import math

import pytest

from octodsl.costs.analytical import BYTES_PER_PARAM, analytical_costs
from octodsl.costs.devices import get_device, get_link
from octodsl.costs.expert import EpLinks, all_to_all_time
from octodsl.costs.param_bytes import param_bytes
from octodsl.costs.resolve import cost_table, header_costing
from octodsl.costs.table import Link
from octodsl.costs.work import Gemm, layer_work
from octodsl.errors import OctoError
from octodsl.mesh import Mesh
from octodsl.models import load_model
from octodsl.models.ep import busiest_share, dispatch_bytes, expert_rows
from octodsl.models.spec import DEFAULT_IMBALANCE
from octodsl.models.tp import local_params
from octodsl.plan import Header

H800 = get_device("H800")


def _moe(spec):
    return next(i for i, layer in enumerate(spec.layers) if layer.kind == "moe")


def test_dispatch_volume_by_hand():
    # qwen3-next-80b at 4096 tokens: 4096 x 10 rows of 2048 bf16 values, 3/4 of them leave at ep 4
    assert dispatch_bytes(4096, 10, 2048, 2, 4) == 4096 * 10 * 2048 * 2 * 3 / 4 == 125_829_120
    spec = load_model("qwen3-next-80b")
    work = layer_work(spec, spec.layers[_moe(spec)], ep=4)
    assert work.all_to_all == (125_829_120 * 1.25, 125_829_120 * 1.25)  # dispatch, combine
    assert layer_work(spec, spec.layers[_moe(spec)]).all_to_all == ()  # ep 1: none
    # Jamba: 4096 x top-2 x 4096 x 2 bytes, ep 8 sends 7/8, busiest rank 1.25x
    jamba = load_model("jamba-v0.1")
    got = layer_work(jamba, jamba.layers[_moe(jamba)], ep=8).all_to_all
    assert got == (4096 * 2 * 4096 * 2 * 7 / 8 * 1.25,) * 2


def test_all_to_all_time_by_hand():
    nv, ib = Link("nv", 8e-6, 160e9), Link("ib", 15e-6, 46e9)
    nbytes = 7 * 2**20
    # inside a node: ep - 1 latencies and the bytes at the link's bandwidth, one ring pass's time
    inside = all_to_all_time(nbytes, 8, EpLinks(nv, ib, 8))
    assert inside == pytest.approx(7 * 8e-6 + nbytes / 160e9)
    assert inside == pytest.approx(nv.ring(nbytes * 8 / 7, 8, 1))
    # 16 ranks, 8 per node: 7 peers over NVLink, 8 over InfiniBand at once; the slower sets it
    c = nbytes / 15
    across = all_to_all_time(nbytes, 16, EpLinks(nv, ib, 8))
    assert across == pytest.approx(max(7 * (8e-6 + c / 160e9), 8 * (15e-6 + c / 46e9)))
    assert across == pytest.approx(8 * (15e-6 + c / 46e9))
    # one rank per node: every peer across
    assert all_to_all_time(nbytes, 4, EpLinks(nv, ib, 1)) == pytest.approx(
        3 * (15e-6 + nbytes / 3 / 46e9)
    )
    assert all_to_all_time(nbytes, 1, EpLinks(nv, ib, 1)) == 0.0


def test_expert_rows_by_hand():
    # 4096 tokens, top-10 of 512 experts: 80 rows each at ep 1
    assert expert_rows(4096, 10, 512, 1) == 80
    # ep 4: each of the 128 local experts gets rows from 4 ranks: 320, x1.25 on the busiest
    assert expert_rows(4096, 10, 512, 4) == 320
    assert expert_rows(4096, 10, 512, 4, 1.25) == 400
    assert expert_rows(4096, 2, 16, 8, 1.25) == math.ceil(1.25 * 8 * 4096 * 2 / 16) == 5120
    assert busiest_share(1.25, 1) == 1.0 and busiest_share(5.0, 2) == 2.0  # at most all rows
    spec = load_model("qwen3-next-80b")
    moe = spec.layers[_moe(spec)]
    gemms = layer_work(spec, moe, ep=4).gemms
    # router over all tokens, then the 128 local experts' gate+up and down at 400 rows each
    assert gemms[:3] == (
        Gemm(4096, 512, 2048),
        Gemm(400, 2 * 512, 2048, 128),
        Gemm(400, 2048, 512, 128),
    )
    assert layer_work(spec, moe).gemms[1] == Gemm(80, 1024, 2048, 512)


def test_larger_expert_gemms_run_faster_per_flop():
    """The same expert FLOPs per rank (balanced) in fewer, taller GEMMs: ep 4's run at a higher
    rate (costs/gemm.py's tile and wave quantization), so the MoE layer's compute drops."""
    spec = load_model("qwen3-next-80b").model_copy(deep=True)
    moe = spec.layers[_moe(spec)].model_copy(update={"imbalance": 1.0})
    one, four = layer_work(spec, moe), layer_work(spec, moe, ep=4)
    assert one.gemm == four.gemm  # same FLOPs
    seconds = [
        sum(H800.gemm.seconds(g, H800.matmul_flops("bf16"), H800.bandwidth, 2) for g in w.gemms)
        for w in (one, four)
    ]
    assert seconds[1] < 0.8 * seconds[0]


def test_ep_costs_add_the_all_to_alls_to_f_and_b():
    spec = load_model("jamba-v0.1")
    i = _moe(spec)
    nv = get_link(H800.node_link)
    one = analytical_costs(spec, H800).layers
    eight = analytical_costs(spec, H800, ep=8).layers
    a2a = 2 * all_to_all_time(4096 * 2 * 4096 * 2 * 7 / 8 * 1.25, 8, EpLinks(nv, nv, 8))
    assert eight[i].ep_f == eight[i].ep_b == pytest.approx(a2a)
    assert one[i].ep_f == one[i].ep_b == 0.0
    # W has no all-to-all; the other layers are untouched
    assert eight[i - 1] == one[i - 1] and eight[0] == one[0]
    assert eight[i].f > eight[i].ep_f and eight[i].b > eight[i].ep_b


def test_ep_divides_the_experts_memory():
    spec = load_model("jamba-v0.1")
    i = _moe(spec)
    moe = spec.layers[i]
    routed = moe.experts * 3 * spec.hidden * moe.expert_ffn  # SwiGLU: three matrices
    assert local_params(spec, i, 1) - local_params(spec, i, 1, ep=8) == routed - routed // 8
    # with tp 2 each expert's inner size halves first
    assert local_params(spec, i, 2) - local_params(spec, i, 2, ep=4) == 3 * (routed // 2) // 4
    eight = analytical_costs(spec, H800, ep=8).layers[i]
    assert eight.expert_params == routed // 8
    assert eight.static == eight.params * BYTES_PER_PARAM
    assert analytical_costs(spec, H800, ep=8).layers[i - 1].expert_params == 0


def test_zero_shards_the_experts_over_dp_over_ep():
    """ZeRO 1 over dp 8 at ep 4: the dense part's optimizer state divides by 8, the experts' by
    dp / ep = 2 (the copies that hold the same experts)."""
    spec = load_model("jamba-v0.1")
    table = cost_table(model="jamba-v0.1", device="H800", ep=4)
    i = _moe(spec)
    layer = table.layers[i]
    dense = layer.params - layer.expert_params
    (stage,) = table.range_costs([(i, i)], zero=1, dp=8)
    dtype = spec.dtype
    assert stage.static == pytest.approx(
        dense * param_bytes(dtype, "deepspeed", 1, 8).total
        + layer.expert_params * param_bytes(dtype, "deepspeed", 1, 2).total
    )
    assert stage.update == pytest.approx(
        layer.update * (dense / layer.params / 8 + layer.expert_params / layer.params / 2)
    )
    # no ZeRO: only what the runtime shards at stage 0 (DeepSpeed's BF16 optimizer shards a
    # bf16 model's fp32 copy and Adam state; fp32 shards nothing), the experts' over dp / ep
    (plain,) = table.range_costs([(i, i)], zero=0, dp=8)
    assert plain.static == pytest.approx(
        dense * param_bytes(dtype, "deepspeed", 0, 8).total
        + layer.expert_params * param_bytes(dtype, "deepspeed", 0, 2).total
    )
    assert table.expert_grad_params(i, i) == layer.expert_params


def test_ep_1_is_the_table_of_before():
    spec = load_model("qwen3-next-80b")
    base = analytical_costs(spec, H800)
    assert [(l.f, l.b, l.w, l.act, l.static) for l in base.layers] == [
        (l.f, l.b, l.w, l.act, l.static)
        for l in analytical_costs(spec, H800, ep=1, ep_links=None).layers
    ]
    assert base.ep == 1 and "ep" not in base.source


def test_the_ep_group_link_follows_the_mesh():
    # tp 2 x ep 4 = 8: inside a node; tp 2 x ep 8 crosses, 4 of its ranks per node
    inside = Header(name="x", devices=2, microbatches=4, dp=8, ep=4, tp=2)
    across = inside.model_copy(update={"ep": 8})
    assert not Mesh.of(inside).ep_spans_nodes and Mesh.of(inside).ep_ranks_per_node == 4
    assert Mesh.of(across).ep_spans_nodes and Mesh.of(across).ep_ranks_per_node == 4
    assert header_costing(across)["ep_node_ranks"] == 4
    # ep 2 groups of dp copies 0-1, 2-3, ... never straddle a node boundary at tp 1, 8 per node
    assert not Mesh(1, 4, 16, 8, 2).ep_spans_nodes
    # 6 GPUs per node: copies 4-7 of tp 1 straddle (ranks 4, 5 | 6, 7)
    assert Mesh(1, 1, 8, 6, 4).ep_spans_nodes
    t = cost_table(model="jamba-v0.1", device="H800", **header_costing(across))
    assert "ep 8 on ib-ndr (4 of 8 per node)" in t.source
    nbytes = 4096 * 2 * 4096 * 2 * 7 / 8 * 1.25
    ib = get_link(H800.inter_node_link)
    # 4 peers across nodes at InfiniBand's 46 GB/s set the time, not the 3 over NVLink
    assert max(l.ep_f for l in t.layers) == pytest.approx(2 * 4 * ib.time(nbytes / 7))
    fast = max(l.ep_f for l in cost_table(model="jamba-v0.1", device="H800", tp=2, ep=8).layers)
    assert max(l.ep_f for l in t.layers) > 1.5 * fast


def test_imbalance_is_the_specs_and_overridable():
    assert DEFAULT_IMBALANCE == 1.25
    spec = load_model("jamba-v0.1")
    i = _moe(spec)
    even = spec.model_copy(
        update={
            "layers": [
                l.model_copy(update={"imbalance": 1.0}) if l.kind == "moe" else l
                for l in spec.layers
            ]
        }
    )
    a = layer_work(spec, spec.layers[i], ep=8).all_to_all[0]
    b = layer_work(even, even.layers[i], ep=8).all_to_all[0]
    assert a == pytest.approx(1.25 * b)
    with pytest.raises(ValueError, match="imbalance"):
        type(spec.layers[i]).model_validate({**spec.layers[i].model_dump(), "imbalance": 0.5})


def test_cost_table_refuses_an_ep_the_experts_do_not_divide_and_a_profile_at_ep():
    with pytest.raises(OctoError, match="ep 3 does not divide the 16 experts of jamba-v0.1"):
        cost_table(model="jamba-v0.1", ep=3)
    with pytest.raises(OctoError, match="ep 1"):
        cost_table(profile="no-such.profile.json", ep=2)
