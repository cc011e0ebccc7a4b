"""Torch layers: shapes, gradients (gradcheck in float64), parameter counts, MoE aux loss,
tied embeddings and the DeepSpeed layer specs."""

import pytest
import torch
from torch.func import functional_call

from octodsl.layers import (
    MLP,
    Attention,
    Embedding,
    LMHead,
    Mamba1,
    Mamba2,
    MoE,
    TiedHead,
    build_layers,
    lm_loss,
    pipeline_specs,
    set_aux_loss_scale,
)
from octodsl.layers.gated_deltanet import GatedDeltaNet
from octodsl.models import (
    AttentionConfig,
    GatedDeltaNetConfig,
    Mamba1Config,
    Mamba2Config,
    MLPConfig,
    ModelSpec,
    MoEConfig,
    load_model,
)

H = 8
TINY = {
    "attention": (Attention, AttentionConfig(heads=4, kv_heads=2, head_dim=4, rope_theta=1e4)),
    "gated attention": (
        Attention,
        AttentionConfig(heads=2, kv_heads=2, head_dim=4, output_gate=True),
    ),
    "mlp swiglu": (MLP, MLPConfig(ffn=12)),
    "mlp relu2": (MLP, MLPConfig(ffn=12, activation="relu2")),
    "moe": (MoE, MoEConfig(experts=4, top_k=2, expert_ffn=6, shared_ffn=5, aux_loss_coef=0)),
    "mamba2": (Mamba2, Mamba2Config(heads=4, head_dim=2, groups=2, state=3, chunk=4)),
    "mamba1": (Mamba1, Mamba1Config(inner=6, state=3, dt_rank=2, inner_norms=True)),
    "gated deltanet": (
        GatedDeltaNet,
        GatedDeltaNetConfig(
            key_heads=1, value_heads=2, key_head_dim=3, value_head_dim=2, conv=3, chunk=4
        ),
    ),
}


def gradcheck_module(module, x):
    """gradcheck with respect to the input (every entry), and to the input and every parameter
    together (fast mode: random directions, so it stays quick under load)."""
    assert torch.autograd.gradcheck(module, (x,), atol=1e-6)
    names = [n for n, _ in module.named_parameters()]
    params = [p.detach().clone().requires_grad_() for _, p in module.named_parameters()]

    def f(x, *ps):
        return functional_call(module, dict(zip(names, ps, strict=True)), (x,))

    return torch.autograd.gradcheck(f, (x, *params), atol=1e-6, fast_mode=True)


@pytest.mark.parametrize("name", list(TINY))
def test_block_shape_params_and_gradcheck(name):
    cls, cfg = TINY[name]
    torch.manual_seed(0)
    module = cls(cfg, H).double()
    assert sum(p.numel() for p in module.parameters()) == cfg.params(H, 0, False)
    x = torch.randn(2, 6, H, requires_grad=True)
    assert module(x).shape == x.shape
    assert gradcheck_module(module, x)


def test_embedding_and_head():
    emb, head = Embedding(11, H).double(), LMHead(11, H).double()
    ids = torch.randint(0, 11, (2, 5))
    x = emb(ids)
    assert x.shape == (2, 5, H)
    logits = head(x)
    assert logits.shape == (2, 5, 11)
    assert torch.autograd.gradcheck(
        lambda w: torch.nn.functional.embedding(ids, w),
        (emb.weight.detach().clone().requires_grad_(),),
    )
    assert gradcheck_module(head, torch.randn(2, 5, H, requires_grad=True))
    loss = lm_loss(logits, ids)
    ref = torch.nn.functional.cross_entropy(logits.reshape(10, 11), ids.reshape(10))
    torch.testing.assert_close(loss, ref)


def test_attention_is_causal():
    module = Attention(AttentionConfig(heads=2, kv_heads=1, head_dim=4, rope_theta=1e4), H)
    x = torch.randn(1, 7, H)
    y = module(x)
    x2 = x.clone()
    x2[:, 4:] += 1.0
    torch.testing.assert_close(module(x2)[:, :4], y[:, :4])


def test_moe_aux_loss_reaches_the_gradients():
    """Backward through the layer gives the gradient of loss + scale x aux loss."""
    from octodsl.layers.moe import load_balancing_loss

    torch.manual_seed(0)
    cfg = MoEConfig(experts=4, top_k=2, expert_ffn=6, aux_loss_coef=0.5)
    module = MoE(cfg, H).double()
    weight = module.router.weight
    x = torch.randn(2, 6, H)
    # The aux loss recomputed by hand from the router.
    probs = torch.softmax(module.router(module.norm(x).reshape(-1, H)), -1)
    counts = torch.bincount(probs.topk(2, -1).indices.reshape(-1), minlength=4)
    aux = cfg.aux_loss_coef * load_balancing_loss(probs, counts, 2)
    torch.testing.assert_close(module(x) is not None and module.last_aux_loss, aux.detach())
    aux_grad = torch.autograd.grad(aux, weight)[0]
    try:
        set_aux_loss_scale(0.0)
        main_grad = torch.autograd.grad(module(x).sum(), weight)[0]
        for scale in (1.0, 0.25):
            set_aux_loss_scale(scale)
            injected = torch.autograd.grad(module(x).sum(), weight)[0]
            torch.testing.assert_close(injected, main_grad + scale * aux_grad)
    finally:
        set_aux_loss_scale(1.0)
    assert aux_grad.abs().sum() > 0


def test_tiny_models_train_step():
    torch.set_default_dtype(torch.float32)  # the tiny models are fp32; the fixture restores it
    for name in ("nemotron-h-tiny", "jamba-tiny", "qwen3-next-tiny"):
        spec = load_model(name).with_shape(seq_len=16)
        layers = build_layers(spec, seed=0)
        assert [sum(p.numel() for p in m.parameters()) for m in layers] == [
            spec.layer_params(i) for i in range(spec.num_layers)
        ]
        ids = torch.randint(0, spec.vocab, (spec.microbatch_size, spec.seq_len))
        x = ids
        for m in layers:
            x = m(x)
        loss = lm_loss(x, ids)
        loss.backward()
        assert torch.isfinite(loss)
        assert all(p.grad is not None for m in layers for p in m.parameters())


def test_seeded_build_is_per_layer():
    torch.set_default_dtype(torch.float32)
    spec = load_model("nemotron-h-tiny")
    whole = build_layers(spec, seed=7)
    part = build_layers(spec, seed=7, layers=range(5, 8))
    for a, b in zip(whole[5:8], part, strict=True):
        for pa, pb in zip(a.parameters(), b.parameters(), strict=True):
            assert torch.equal(pa, pb)


def tied_spec():
    return ModelSpec.model_validate(
        {
            "name": "tied",
            "hidden": H,
            "vocab": 13,
            "seq_len": 5,
            "dtype": "fp32",
            "tie_embeddings": True,
            "pattern": "-",
            "mlp": {"ffn": 12},
        }
    )


def test_tied_embeddings_share_the_matrix():
    spec = tied_spec()
    layers = build_layers(spec, seed=0)
    assert isinstance(layers[-1], TiedHead)
    assert sum(p.numel() for m in layers for p in m.parameters()) == spec.params()
    ids = torch.randint(0, 13, (1, 5))
    x = ids
    for m in layers:
        x = m(x)
    lm_loss(x, ids).backward()
    weight = layers[0].weight
    assert weight.grad is not None and layers[-1](
        torch.randn(1, 5, H, dtype=torch.float32)
    ).shape == (1, 5, 13)


def test_pipeline_specs():
    from deepspeed.pipe import LayerSpec, TiedLayerSpec

    specs = pipeline_specs(tied_spec())
    assert isinstance(specs[0], TiedLayerSpec) and isinstance(specs[-1], TiedLayerSpec)
    assert specs[0].key == specs[-1].key and specs[-1].forward_fn is not None
    assert isinstance(specs[1], LayerSpec) and not isinstance(specs[1], TiedLayerSpec)
    assert isinstance(specs[1].build(), MLP)
