"""The analytical model under tensor parallelism: one GPU's share of each layer, the tp
collectives' times, and what lint and the executor rely on in octodsl.models.tp."""

import pytest

from octodsl.costs.analytical import analytical_costs
from octodsl.costs.devices import get_device, get_link
from octodsl.costs.profile import ProfileError
from octodsl.costs.resolve import cost_table
from octodsl.errors import OctoError
from octodsl.models import load_model
from octodsl.models.tp import local_params, padded_vocab, tp_problems

H800 = get_device("H800")
MODELS = ["nemotron-h-56b", "jamba-v0.1", "qwen3-next-80b", "llama3-70b", "nemotron-h-tiny"]


def _replicated(spec) -> int:
    """Parameters every GPU of a tp group holds whole, counted from the spec by hand: each
    layer's pre-norm (and the final norm), MoE routers, Jamba's inner norms, gated DeltaNet's
    per-head-dim norm."""
    total = 0
    for layer in spec.layers:
        if layer.kind == "embedding":
            continue
        total += spec.hidden
        if layer.kind == "moe":
            total += spec.hidden * layer.experts
        if layer.kind == "mamba1" and layer.inner_norms:
            total += layer.dt_rank + 2 * layer.state
        if layer.kind == "gated_deltanet":
            total += layer.value_head_dim
    return total


def _kv_copies(spec, tp: int) -> int:
    """Parameters added by KV heads replicated over a tp group larger than their number: each
    GPU holds one KV head, so tp of them exist instead of kv_heads."""
    return sum(
        2 * (tp - layer.kv_heads) * layer.head_dim * spec.hidden
        for layer in spec.layers
        if layer.kind == "attention" and layer.kv_heads < tp
    )


@pytest.mark.parametrize(
    "name,tp",
    [
        (m, tp)
        for m in MODELS
        for tp in (2, 4, 8)
        if (m, tp) not in {("nemotron-h-tiny", 4), ("nemotron-h-tiny", 8)}
    ],
)
def test_the_shards_add_up_to_the_model(name, tp):
    spec = load_model(name)
    assert not [p for p in tp_problems(spec, tp) if p.fatal]
    shards = tp * sum(local_params(spec, i, tp) for i in range(spec.num_layers))
    pad = (
        (padded_vocab(spec.vocab, tp) - spec.vocab)
        * spec.hidden
        * (1 if spec.tie_embeddings else 2)
    )
    assert shards - spec.params() == (tp - 1) * _replicated(spec) + pad + _kv_copies(spec, tp)


@pytest.mark.parametrize("kind", ["attention", "mlp", "mamba2"])
def test_sequence_parallel_splits_every_activation(kind):
    spec = load_model("nemotron-h-8b").with_shape(1, 4096)
    one = analytical_costs(spec, H800)
    i = next(i for i, layer in enumerate(spec.layers) if layer.kind == kind)
    for tp in (2, 4, 8):
        sp = analytical_costs(spec, H800, tp=tp, sp=True).layers[i]
        assert sp.act * tp == pytest.approx(one.layers[i].act, rel=1e-12)
        assert sp.out_bytes * tp == one.layers[i].out_bytes
        # without sp, x and norm(x) stay whole on every GPU (Korthikanti et al.'s 10 s b h)
        whole = analytical_costs(spec, H800, tp=tp, sp=False).layers[i]
        assert whole.act - sp.act == pytest.approx(2 * 4096 * spec.hidden * 2 * (1 - 1 / tp))
        assert whole.out_bytes == one.layers[i].out_bytes


def test_collectives_are_ring_times_on_the_node_link():
    spec = load_model("nemotron-h-8b").with_shape(1, 4096)
    mlp = next(i for i, layer in enumerate(spec.layers) if layer.kind == "mlp")
    link = get_link("nvlink")
    whole = 4096 * spec.hidden * 2
    step = link.latency + whole / 8 / link.bandwidth  # one ring step moves 1/8 of the tensor
    sp = analytical_costs(spec, H800, tp=8).layers[mlp]
    assert sp.tp_f == pytest.approx(2 * 7 * step)  # all-gather in, reduce-scatter out
    assert sp.tp_b == pytest.approx(2 * 7 * step)
    assert sp.tp_w == pytest.approx(7 * step)  # the input gathered again for the weight gradient
    plain = analytical_costs(spec, H800, tp=8, sp=False).layers[mlp]
    assert (plain.tp_f, plain.tp_b, plain.tp_w) == (
        pytest.approx(2 * 7 * step),
        pytest.approx(2 * 7 * step),
        0.0,
    )
    assert sp.f > sp.tp_f > 0
    assert analytical_costs(spec, H800).layers[mlp].tp_f == 0.0


def test_an_h100_node_link_is_faster():
    spec = load_model("llama3-70b").with_shape(1, 4096)
    h800 = analytical_costs(spec, H800, tp=8).layers[2]
    h100 = analytical_costs(spec, get_device("H100"), tp=8).layers[2]
    assert h100.tp_f < h800.tp_f


def test_tp_makes_each_gpu_faster_until_communication_dominates():
    times = [
        sum(x.f + x.b + x.w for x in cost_table(model="nemotron-h-56b", seq_len=4096, tp=tp).layers)
        for tp in (1, 2, 4, 8)
    ]
    assert times == sorted(times, reverse=True)
    assert cost_table(model="nemotron-h-56b", tp=8).meta["tp"] == 8


def test_what_cannot_split_is_refused():
    assert [p.message for p in tp_problems(load_model("nemotron-h-tiny"), 4) if p.fatal] == [
        "mamba2 groups 2: not divisible by tp 4"
    ]
    with pytest.raises(OctoError, match="does not split over tp 3"):
        cost_table(model="nemotron-h-8b", tp=3)
    with pytest.raises(ProfileError, match="tp 1"):
        cost_table(profile="whatever.json", tp=2)


def test_replicated_kv_heads_sum_their_gradients_in_b():
    spec = load_model("qwen3-next-80b").with_shape(1, 4096)  # 2 KV heads
    i = next(i for i, layer in enumerate(spec.layers) if layer.kind == "attention")
    link = get_link("nvlink")
    kv = 4096 * 2 * 256 * 2
    at = {tp: analytical_costs(spec, H800, tp=tp).layers[i] for tp in (2, 4)}
    assert at[2].tp_b == pytest.approx(at[2].tp_f)  # kv heads split: B mirrors F
    assert at[4].tp_b - at[4].tp_f == pytest.approx(link.ring(kv, 4, 2))


def test_kv_heads_fewer_than_tp_are_replicated():
    spec = load_model("llama3-70b")  # 8 KV heads
    problems = tp_problems(spec, 16)
    kv = [p for p in problems if p.what == "kv_heads"]
    assert kv and not kv[0].fatal and "replicated on 2 GPUs" in kv[0].message
    assert [p for p in tp_problems(spec, 3) if p.fatal]
    vocab = [p for p in tp_problems(spec, 3) if p.what == "vocab"]
    assert vocab == [] or not vocab[0].fatal
