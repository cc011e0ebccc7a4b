"""The tensor-parallel layers against the unsplit layer, on a tp group of 2 gloo processes in
float64: forward output, input gradient and every parameter gradient (this rank's shard of the
unsplit layer's, or the whole gradient of a replicated parameter, sequence-parallel ones summed
over the group as the engine does), sp on and off, with a fused backward and with a split
backward's B then W.

The two processes are spawned once for the module and run every case; each case's largest
difference (over both ranks) is judged by its own test. The expected shards are written here
from the layouts (which rows or columns of each fused projection a rank keeps), apart from the
layers' own slicing helpers.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import pytest
import torch
import torch.distributed as dist
from torch import nn

from octodsl.layers import MLP, Attention, Mamba1, Mamba2, MoE
from octodsl.layers import tensor_parallel as tpl
from octodsl.layers.gated_deltanet import GatedDeltaNet
from octodsl.models.load import SpecError
from octodsl.models.spec import (
    AttentionConfig,
    GatedDeltaNetConfig,
    Mamba1Config,
    Mamba2Config,
    MLPConfig,
    MoEConfig,
)

from .multiprocess import record, reporting, run_layer, spawned

TP = 2
HIDDEN, BATCH, SEQ = 16, 2, 8
TOL = 1e-10
SEED = 3

Part = tuple[int, int, int]
"""A block of a fused parameter along its partition dim: (size, pieces, which): the rank keeps
piece `which` of `pieces` equal pieces of it (pieces 0: none of it)."""


@dataclass(frozen=True)
class Shard:
    """How a tp parameter is cut from the unsplit layer's parameter `ref` (default: the same
    name) along `dim`."""

    dim: int
    parts: Callable[[int], list[Part]]
    """The blocks, for a rank."""
    ref: str | None = None
    counted: Callable[[int], bool] = lambda rank: True
    """Is it marked a shard on this rank (a gradient norm over the group counts it here)."""


def even(*sizes: int) -> Callable[[int], list[Part]]:
    """Each block split evenly over the group."""
    return lambda rank: [(n, TP, rank) for n in sizes]


@dataclass(frozen=True)
class Case:
    make: Callable[[], nn.Module]
    shards: dict[str, Shard]
    """The sharded parameters; every other one must be replicated (the unsplit one's shape)."""


def mlp_case(activation: str) -> Case:
    cfg = MLPConfig(ffn=24, activation=activation)
    up = (24, 24) if activation == "swiglu" else (24,)
    return Case(
        lambda: MLP(cfg, HIDDEN),
        {"ffn.up.weight": Shard(0, even(*up)), "ffn.down.weight": Shard(1, even(24))},
    )


def attention_case(heads: int, kv_heads: int, **extra) -> Case:
    d = 4
    cfg = AttentionConfig(heads=heads, kv_heads=kv_heads, head_dim=d, **extra)
    q = [heads * d] * (2 if cfg.output_gate else 1)
    kv = kv_heads * d
    shards = {"out.weight": Shard(1, even(heads * d))}
    if kv_heads % TP:  # replicated: each rank's KV head (the one its queries use) apart
        shards["qkv.weight"] = Shard(
            0, lambda r: [*((n, TP, r) for n in q), (kv, 0, 0), (kv, 0, 0)]
        )
        head = lambda r: r * kv_heads // TP  # noqa: E731
        shards["kv.weight"] = Shard(
            0,
            lambda r: [(cfg.q_out, 0, 0), (kv, kv_heads, head(r)), (kv, kv_heads, head(r))],
            ref="qkv.weight",
            # one copy of each head counts: its first sharer's
            counted=lambda r: r % (TP // kv_heads) == 0,
        )
    else:
        shards["qkv.weight"] = Shard(0, even(*q, kv, kv))
    return Case(lambda: Attention(cfg, HIDDEN), shards)


def moe_shards(cfg: MoEConfig) -> dict[str, Shard]:
    """Each expert's inner size, and the shared expert's, split evenly (each SwiGLU half)."""
    halves = 2 if cfg.activation == "swiglu" else 1
    shards = {
        "w_in": Shard(2, even(*[cfg.expert_ffn] * halves)),
        "w_out": Shard(1, even(cfg.expert_ffn)),
    }
    if cfg.shared_ffn:
        shards |= {
            "shared.up.weight": Shard(0, even(*[cfg.shared_ffn] * halves)),
            "shared.down.weight": Shard(1, even(cfg.shared_ffn)),
        }
    return shards


def moe_case(activation: str, shared: int) -> Case:
    cfg = MoEConfig(
        experts=4,
        top_k=2,
        expert_ffn=8,
        shared_ffn=shared,
        activation=activation,
        aux_loss_coef=0.1,
    )
    return Case(lambda: MoE(cfg, HIDDEN), moe_shards(cfg))


def mamba2_case(heads: int, groups: int) -> Case:
    cfg = Mamba2Config(heads=heads, head_dim=4, groups=groups, state=4, conv=3, chunk=4)
    inner, gn = cfg.inner, groups * cfg.state
    return Case(
        lambda: Mamba2(cfg, HIDDEN),
        {
            "in_proj.weight": Shard(0, even(inner, inner, gn, gn, heads)),
            "conv.weight": Shard(0, even(inner, gn, gn)),
            "conv.bias": Shard(0, even(inner, gn, gn)),
            **{
                name: Shard(0, even(n))
                for name, n in [
                    ("dt_bias", heads),
                    ("A_log", heads),
                    ("D", heads),
                    ("out_norm", inner),
                ]
            },
            "out_proj.weight": Shard(1, even(inner)),
        },
    )


def mamba1_case(inner_norms: bool) -> Case:
    cfg = Mamba1Config(inner=8, state=4, conv=3, dt_rank=2, inner_norms=inner_norms)
    d = cfg.inner
    return Case(
        lambda: Mamba1(cfg, HIDDEN),
        {
            "in_proj.weight": Shard(0, even(d, d)),
            **{
                name: Shard(0, even(d))
                for name in (
                    "conv.weight",
                    "conv.bias",
                    "dt_proj.weight",
                    "dt_proj.bias",
                    "A_log",
                    "D",
                )
            },
            "x_proj.weight": Shard(1, even(d)),
            "out_proj.weight": Shard(1, even(d)),
        },
    )


def gated_deltanet_case(key_heads: int, value_heads: int) -> Case:
    cfg = GatedDeltaNetConfig(
        key_heads=key_heads,
        value_heads=value_heads,
        key_head_dim=4,
        value_head_dim=3,
        conv=3,
        chunk=4,
    )
    kd, vd, vh = cfg.key_dim, cfg.value_dim, value_heads
    return Case(
        lambda: GatedDeltaNet(cfg, HIDDEN),
        {
            "in_proj.weight": Shard(0, even(kd, kd, vd, vd, vh, vh)),
            "conv.weight": Shard(0, even(kd, kd, vd)),
            "dt_bias": Shard(0, even(vh)),
            "A_log": Shard(0, even(vh)),
            "out_proj.weight": Shard(1, even(vd)),
        },
    )


CASES: dict[str, Case] = {
    "gated-deltanet-gqa": gated_deltanet_case(2, 4),
    "gated-deltanet": gated_deltanet_case(2, 2),
    "mamba1": mamba1_case(False),
    "mamba1-jamba-norms": mamba1_case(True),
    "mamba2-groups2": mamba2_case(4, 2),
    "mamba2-groups4": mamba2_case(8, 4),
    "moe-swiglu-shared": moe_case("swiglu", 12),
    "moe-relu2": moe_case("relu2", 0),
    "attention-gqa": attention_case(4, 2, rope_theta=10000.0),
    "attention-mha-gate": attention_case(4, 4, output_gate=True),
    "attention-kv-replicated": attention_case(4, 1, rope_theta=10000.0, output_gate=True),
    "attention-kv-replicated-mqa": attention_case(2, 1),
    "mlp-swiglu": mlp_case("swiglu"),
    "mlp-relu2": mlp_case("relu2"),
}
VARIANTS = ("nosp", "sp", "nosp-split", "sp-split", "nosp-recompute", "sp-recompute-split")
"""sp on or off; `split`: B then W (else a fused backward); `recompute`: the forward under
selective recompute (what `recomputable` marks dropped, brought back by the backward)."""


def expected_shard(t: torch.Tensor, shard: Shard, rank: int) -> torch.Tensor:
    blocks = t.split([n for n, _, _ in shard.parts(rank)], shard.dim)
    return torch.cat(
        [
            b.chunk(pieces, shard.dim)[which]
            for b, (_, pieces, which) in zip(blocks, shard.parts(rank), strict=True)
            if pieces
        ],
        shard.dim,
    )


def run_case(case: Case, tp: tpl.TpGroup, variant: str) -> float:
    """The largest difference between the tp layer and the unsplit one, on this rank."""
    torch.manual_seed(SEED)
    ref = case.make()
    torch.manual_seed(SEED)
    with tpl.building(tp):
        layer = case.make()
    torch.manual_seed(SEED + 1)
    x = torch.randn(BATCH, SEQ, HIDDEN)
    gy = torch.randn(BATCH, SEQ, HIDDEN)
    xr = x.clone().requires_grad_()
    yr = ref(xr)
    yr.backward(gy)
    xt = tpl.seq_slice(x, tp).clone().requires_grad_()
    yt = run_layer(layer, xt, tpl.seq_slice(gy, tp), variant, tp)

    diffs = [
        (yt - tpl.seq_slice(yr, tp)).abs().max(),
        (xt.grad - tpl.seq_slice(xr.grad, tp)).abs().max(),
    ]
    refs = dict(ref.named_parameters())
    for name, p in layer.named_parameters():
        shard = case.shards.get(name)
        if shard is None:
            r = refs[name]
            assert p.shape == r.shape, f"{name}: {p.shape} is neither a listed shard nor replicated"
            want, want_grad = r, r.grad
        else:
            r = refs[shard.ref or name]
            want, want_grad = (expected_shard(t, shard, tp.rank) for t in (r, r.grad))
            assert getattr(p, "tensor_model_parallel", False) == shard.counted(tp.rank), name
        assert p.grad is not None, f"{name} got no gradient"
        diffs += [(p - want).abs().max(), (p.grad - want_grad).abs().max()]
    return float(torch.stack(diffs).max())


def _worker(rank: int, world: int, port: int, out: str) -> None:
    with reporting(rank, world, port, out) as results:
        for name, case in CASES.items():
            for variant in VARIANTS:
                tp = tpl.TpGroup(TP, rank, dist.group.WORLD, sp=variant.startswith("sp"))
                record(results, f"{name}/{variant}", run_case, case, tp, variant)


@pytest.fixture(scope="module")
def results(tmp_path_factory) -> dict[str, object]:
    return spawned(_worker, TP, str(tmp_path_factory.mktemp("tp") / "results"))


@pytest.mark.slow  # the two processes run every case: some 15 s on two cores
@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("case", list(CASES))
def test_tp_layer_equals_unsplit(results, case, variant):
    got = results[f"{case}/{variant}"]
    assert not isinstance(got, str), got
    assert got <= TOL, got


@pytest.mark.parametrize("case", list(CASES))
def test_tp1_is_the_layer_itself(case):
    # building(TpGroup()) is what every layer is built for outside `building`: the same init
    # draws, no parameter marked, and no collective (this process has no process group, so a
    # collective in the forward or backward would raise)
    torch.manual_seed(SEED)
    plain = CASES[case].make()
    torch.manual_seed(SEED)
    with tpl.building(tpl.TpGroup()):
        one = CASES[case].make()
    for (n, a), (m, b) in zip(plain.named_parameters(), one.named_parameters(), strict=True):
        assert n == m and torch.equal(a, b)
        assert not hasattr(b, "tensor_model_parallel") and not hasattr(b, "sequence_parallel")
    x = torch.randn(BATCH, SEQ, HIDDEN, requires_grad=True)
    one(x).sum().backward()
    assert x.grad is not None


@pytest.mark.parametrize(
    "make",
    [
        lambda: Attention(AttentionConfig(heads=3, kv_heads=3, head_dim=4), HIDDEN),
        lambda: Attention(AttentionConfig(heads=6, kv_heads=3, head_dim=4), HIDDEN),
        lambda: MLP(MLPConfig(ffn=7), HIDDEN),
        lambda: MoE(MoEConfig(experts=2, top_k=1, expert_ffn=8, shared_ffn=5), HIDDEN),
        lambda: Mamba2(Mamba2Config(heads=4, head_dim=4, groups=1, state=4), HIDDEN),
        lambda: Mamba1(Mamba1Config(inner=9, dt_rank=2), HIDDEN),
        lambda: GatedDeltaNet(
            GatedDeltaNetConfig(key_heads=1, value_heads=2, key_head_dim=4, value_head_dim=4),
            HIDDEN,
        ),
    ],
)
def test_a_layer_tp_cannot_split_is_refused_before_any_communication(make):
    with tpl.building(tpl.TpGroup(TP, 0)), pytest.raises(SpecError, match="tp 2 cannot split"):
        make()
