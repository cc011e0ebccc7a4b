"""Gated DeltaNet: the chunked gated delta rule against a naive sequential recurrence (float64),
the layer against transformers' Qwen3NextGatedDeltaNet with the same weights, gradients
(gradcheck) and the parameter count the spec gives."""

import pytest
import torch

from octodsl.layers.gated_deltanet import GatedDeltaNet, gated_delta_rule, l2norm
from octodsl.models import GatedDeltaNetConfig

from .test_layers import gradcheck_module

H = 8


def delta_reference(q, k, v, g, beta):
    """S_t = exp(g_t) (I - beta_t k_t k_t^T) S_{t-1} + beta_t k_t v_t^T, o_t = S_t^T q_t, one
    token at a time (each key head serving consecutive value heads)."""
    b, s, heads, dv = v.shape
    reps = heads // k.shape[2]
    q, k = q.repeat_interleave(reps, 2), k.repeat_interleave(reps, 2)
    S = torch.zeros(b, heads, k.shape[-1], dv)
    eye = torch.eye(k.shape[-1])
    out = []
    for t in range(s):
        kt, bt = k[:, t], beta[:, t, :, None, None]
        forget = eye - bt * kt[..., :, None] * kt[..., None, :]
        S = (
            torch.exp(g[:, t])[..., None, None] * forget @ S
            + bt * kt[..., :, None] * v[:, t, :, None, :]
        )
        out.append(torch.einsum("bhkv,bhk->bhv", S, q[:, t]))
    return torch.stack(out, dim=1)


def rule_inputs(seed, b=2, s=13, key_heads=2, value_heads=4, dk=5, dv=3):
    """q and k unit vectors (as the layer gives them), decays <= 0, beta in (0, 1)."""
    gen = torch.Generator().manual_seed(seed)
    q = l2norm(torch.randn(b, s, key_heads, dk, generator=gen))
    k = l2norm(torch.randn(b, s, key_heads, dk, generator=gen))
    v = torch.randn(b, s, value_heads, dv, generator=gen)
    g = -torch.nn.functional.softplus(torch.randn(b, s, value_heads, generator=gen))
    beta = torch.rand(b, s, value_heads, generator=gen)
    return q, k, v, g, beta


@pytest.mark.parametrize("s", [1, 8, 13, 33])
@pytest.mark.parametrize("chunk", [1, 3, 8, 64])
def test_chunked_rule_matches_the_sequential_recurrence(s, chunk):
    # s 13 and 33 are not multiples of 3, 8 or 64: the padding is exercised
    args = rule_inputs(s, s=s)
    torch.testing.assert_close(gated_delta_rule(*args, chunk=chunk), delta_reference(*args))


def test_rule_with_one_value_head_per_key_head():
    args = rule_inputs(5, key_heads=3, value_heads=3)
    torch.testing.assert_close(gated_delta_rule(*args, chunk=4), delta_reference(*args))


def test_reference_can_fail():
    # the check above is not vacuous: the rule with beta and the decay left out differs
    q, k, v, g, beta = rule_inputs(6)
    assert not torch.allclose(
        gated_delta_rule(q, k, v, g * 0, beta, chunk=4), delta_reference(q, k, v, g, beta)
    )
    assert not torch.allclose(
        gated_delta_rule(q, k, v, g, beta * 0 + 1, chunk=4), delta_reference(q, k, v, g, beta)
    )


def test_rule_gradcheck():
    q, k, v, g, beta = (t.requires_grad_() for t in rule_inputs(7, b=1, s=6, dk=3, dv=2))
    assert torch.autograd.gradcheck(lambda *a: gated_delta_rule(*a, chunk=4), (q, k, v, g, beta))


CONFIGS = {
    "gqa": GatedDeltaNetConfig(
        key_heads=2, value_heads=4, key_head_dim=4, value_head_dim=3, conv=3, chunk=4
    ),
    "equal heads": GatedDeltaNetConfig(
        key_heads=2, value_heads=2, key_head_dim=3, value_head_dim=4, conv=4, chunk=8
    ),
}


@pytest.mark.parametrize("name", list(CONFIGS))
def test_layer_params_and_gradcheck(name):
    cfg = CONFIGS[name]
    torch.manual_seed(0)
    module = GatedDeltaNet(cfg, H)
    assert sum(p.numel() for p in module.parameters()) == cfg.params(H, 0, False)
    x = torch.randn(2, 7, H, requires_grad=True)  # 7 is not a multiple of the chunk
    assert module(x).shape == x.shape
    assert gradcheck_module(module, x)


def test_layer_is_causal():
    module = GatedDeltaNet(CONFIGS["gqa"], H)
    x = torch.randn(1, 11, H)
    x2 = x.clone()
    x2[:, 6:] += 1.0
    torch.testing.assert_close(module(x2)[:, :6], module(x)[:, :6])
    assert not torch.allclose(module(x2)[:, 6:], module(x)[:, 6:])


# transformers computes the rule and the gated norm in fp32 whatever the input dtype, so it
# matches our float64 run to fp32 rounding only
FP32 = {"rtol": 1e-5, "atol": 1e-5}


def test_rule_matches_transformers():
    qwen = pytest.importorskip("transformers.models.qwen3_next.modeling_qwen3_next")
    gen = torch.Generator().manual_seed(8)
    q, k = (torch.randn(2, 21, 2, 8, generator=gen) for _ in range(2))
    v = torch.randn(2, 21, 4, 6, generator=gen)
    g = -torch.nn.functional.softplus(torch.randn(2, 21, 4, generator=gen))
    beta = torch.rand(2, 21, 4, generator=gen)
    ours = gated_delta_rule(l2norm(q) * 8**-0.5, l2norm(k), v, g, beta, chunk=8)
    chunked, _ = qwen.torch_chunk_gated_delta_rule(
        q, k, v, g, beta, chunk_size=8, use_qk_l2norm_in_kernel=True
    )
    recurrent, _ = qwen.torch_recurrent_gated_delta_rule(
        q, k, v, g, beta, use_qk_l2norm_in_kernel=True
    )
    torch.testing.assert_close(ours, chunked.double(), **FP32)
    torch.testing.assert_close(ours, recurrent.double(), **FP32)


def to_transformers(ours: GatedDeltaNet, cfg: GatedDeltaNetConfig, hidden: int, eps: float):
    """transformers' Qwen3NextGatedDeltaNet with our layer's weights. Its in-projections hold,
    for each key head in turn, [q, k, v, z] and [b, a] of that head and its value heads; ours
    holds [q | k | v | z | b | a], each in head order."""
    from transformers import Qwen3NextConfig
    from transformers.models.qwen3_next.modeling_qwen3_next import (
        Qwen3NextGatedDeltaNet,
    )

    hf_cfg = Qwen3NextConfig(
        hidden_size=hidden,
        num_hidden_layers=1,
        layer_types=["linear_attention"],
        linear_num_key_heads=cfg.key_heads,
        linear_num_value_heads=cfg.value_heads,
        linear_key_head_dim=cfg.key_head_dim,
        linear_value_head_dim=cfg.value_head_dim,
        linear_conv_kernel_dim=cfg.conv,
        rms_norm_eps=eps,
    )
    hf = Qwen3NextGatedDeltaNet(hf_cfg, 0).double()
    kh, vh = cfg.key_heads, cfg.value_heads
    q, k, v, z, b, a = ours.in_proj.weight.detach().split(
        [cfg.key_dim, cfg.key_dim, cfg.value_dim, cfg.value_dim, vh, vh]
    )
    per_head = [t.reshape(kh, -1, hidden) for t in (q, k, v, z, b, a)]
    with torch.no_grad():
        hf.in_proj_qkvz.weight.copy_(torch.cat(per_head[:4], dim=1).reshape(-1, hidden))
        hf.in_proj_ba.weight.copy_(torch.cat(per_head[4:], dim=1).reshape(-1, hidden))
        for mine, theirs in [
            (ours.conv.weight, hf.conv1d.weight),
            (ours.dt_bias, hf.dt_bias),
            (ours.A_log, hf.A_log),
            (ours.out_norm, hf.norm.weight),
            (ours.out_proj.weight, hf.out_proj.weight),
        ]:
            theirs.copy_(mine)
    return hf


@pytest.mark.parametrize("name", list(CONFIGS))
def test_layer_matches_transformers(name):
    pytest.importorskip("transformers.models.qwen3_next.modeling_qwen3_next")
    cfg, eps = CONFIGS[name], 1e-6
    torch.manual_seed(1)
    ours = GatedDeltaNet(cfg, H, norm_eps=eps)
    with torch.no_grad():  # away from the init's ones, so that a weight left uncopied shows
        for p in (ours.dt_bias, ours.out_norm, ours.norm.weight, ours.conv.weight):
            p.add_(torch.randn_like(p) * 0.3)
    hf = to_transformers(ours, cfg, H, eps)
    x = torch.randn(2, 19, H)
    # our layer is pre-norm residual; transformers' is the mixer alone
    torch.testing.assert_close(ours(x) - x, hf(ours.norm(x)), **FP32)
