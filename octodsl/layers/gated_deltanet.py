"""Gated DeltaNet (Yang et al. 2024, "Gated Delta Networks"), Qwen3-Next's linear attention, in
pure PyTorch: the gated delta rule in its chunked form (the WY / UT transform inside chunks, a
recurrence over chunk states between them), with the math of transformers' Qwen3NextGatedDeltaNet.

Per value head, with state S [key_head_dim, value_head_dim]:
    S_t = exp(g_t) (I - beta_t k_t k_t^T) S_{t-1} + beta_t k_t v_t^T,   o_t = S_t^T q_t,
q and k L2-normalised per head (q also scaled by key_head_dim^-1/2), each key head serving
value_heads // key_heads consecutive value heads.

Tensor-parallel as mamba2.py: the key and value heads split over the group in contiguous
shards, so a rank's value heads are those its key heads serve; the in-projection
column-parallel, each of its parts [q, k, v, z, b, a] split; the convolution's channels
likewise; the rule and the gated norm on the local heads; the out-projection row-parallel. The
norm's weight (one per value-head channel, shared by all heads) is replicated; each rank's
gradient of it is over its heads only, so it is marked to be summed over the group like the
sequence-parallel norms'."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ..models.spec import GatedDeltaNetConfig
from . import tensor_parallel as tpl
from .common import conv_silu, linear, wide_dtype
from .mamba2 import segsum
from .recompute import recomputable

L2_EPS = 1e-6
"""The epsilon of the q and k L2 norms (transformers' and the fla kernels')."""


def l2norm(x: torch.Tensor) -> torch.Tensor:
    """x over the L2 norm of its last dimension."""
    return x * torch.rsqrt(x.square().sum(-1, keepdim=True) + L2_EPS)


def chunk_recurrence(
    U: torch.Tensor, W: torch.Tensor, k_dec: torch.Tensor, chunk_decay: torch.Tensor
) -> torch.Tensor:
    """The state entering each chunk [b, heads, chunks, key_dim, value_dim]: with S the state
    entering chunk i, the chunk's corrected values are U_i - W_i S, and the state leaving it is
    exp(g summed over the chunk) S + k_dec_i^T (U_i - W_i S)."""
    b, h, c, _, dv = U.shape
    S = U.new_zeros(b, h, k_dec.shape[-1], dv)
    states = []
    for i in range(c):
        states.append(S)
        d = U[:, :, i] - W[:, :, i] @ S
        S = S * chunk_decay[:, :, i, None, None] + k_dec[:, :, i].transpose(-1, -2) @ d
    return torch.stack(states, dim=2)


def gated_delta_rule(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    chunk: int,
) -> torch.Tensor:
    """o of the gated delta rule (module docstring) from a zero state.

    q, k [b, s, key_heads, key_head_dim] (as used: normalised and scaled by the caller),
    v [b, s, value_heads, value_head_dim], g [b, s, value_heads] (log decay, <= 0), beta
    [b, s, value_heads] in (0, 1). Returns [b, s, value_heads, value_head_dim]. The sequence is
    zero-padded to a multiple of `chunk` (padding has g = 0 and beta = 0: it changes nothing)."""
    b, s, heads, _ = v.shape
    reps = heads // k.shape[2]
    q, k = q.repeat_interleave(reps, dim=2), k.repeat_interleave(reps, dim=2)
    pad = -s % chunk
    if pad:
        q, k, v = (F.pad(t, (0, 0, 0, 0, 0, pad)) for t in (q, k, v))
        g, beta = (F.pad(t, (0, 0, 0, pad)) for t in (g, beta))
    c = (s + pad) // chunk

    def chunked(t: torch.Tensor) -> torch.Tensor:  # [b, s, h, ...] -> [b, h, chunks, chunk, ...]
        return t.reshape(b, c, chunk, heads, -1).permute(0, 3, 1, 2, 4)

    q, k, v, g, beta = chunked(q), chunked(k), chunked(v), chunked(g)[..., 0], chunked(beta)
    g_cum = torch.cumsum(g, dim=-1)
    decay = torch.exp(segsum(g))  # [..., i, j] = exp(g_{j+1} + ... + g_i), 0 for j > i
    k_beta = k * beta
    # Inside a chunk, the corrected values d (the delta rule's v_t - S_{t-1}^T k_t, times beta)
    # solve (I + A) d = beta v - beta exp(g_cum) k S, A strictly lower: the earlier tokens' writes
    # as token i reads them. So d = U - W S with U, W one unit-triangular solve each.
    A = ((k_beta @ k.transpose(-1, -2)) * decay).tril(-1)
    U = torch.linalg.solve_triangular(A, v * beta, upper=False, unitriangular=True)
    W = torch.linalg.solve_triangular(
        A, k_beta * torch.exp(g_cum)[..., None], upper=False, unitriangular=True
    )
    g_last = g_cum[..., -1:]
    k_dec = k * torch.exp(g_last - g_cum)[..., None]
    # selective recompute drops the chunk states and runs the state passing again
    states = recomputable(chunk_recurrence, U, W, k_dec, torch.exp(g_last[..., 0]))
    d = U - W @ states
    o = (q * torch.exp(g_cum)[..., None]) @ states + ((q @ k.transpose(-1, -2)) * decay) @ d
    return o.permute(0, 2, 3, 1, 4).reshape(b, c * chunk, heads, -1)[:, :s]


class GatedDeltaNet(nn.Module):
    """Pre-norm residual gated DeltaNet: in-projection to (q, k, v, z, b, a), causal depthwise
    convolution with SiLU on (q, k, v), the gated delta rule with beta = sigmoid(b) and decay
    g = -exp(A_log) softplus(a + dt_bias), an RMSNorm per value head gated by SiLU(z),
    out-projection."""

    def __init__(self, cfg: GatedDeltaNetConfig, hidden: int, norm_eps: float = 1e-5):
        super().__init__()
        self.tp = tp = tpl.current()
        self.cfg = tpl.local_config(cfg, tp)
        """This rank's key and value heads (all of them at tp 1)."""
        self.eps = norm_eps
        self.norm = nn.RMSNorm(hidden, eps=norm_eps)
        kd, vd, vh = cfg.key_dim, cfg.value_dim, cfg.value_heads
        self.in_proj = linear(hidden, cfg.in_proj_out)
        ch = cfg.conv_channels
        self.conv = nn.Conv1d(ch, ch, cfg.conv, groups=ch, padding=cfg.conv - 1, bias=False)
        # transformers' init: dt_bias 1, A uniform in [0.01, 16] (kept away from 0 for the log)
        self.dt_bias = nn.Parameter(torch.ones(vh))
        self.A_log = nn.Parameter(torch.log(torch.empty(vh).uniform_(0.01, 16)))
        self.out_norm = nn.Parameter(torch.ones(cfg.value_head_dim))
        self.out_proj = linear(vd, hidden)
        if tp.size > 1:
            tpl.column_parallel(self.in_proj, tp, [kd, kd, vd, vd, vh, vh])
            tpl.depthwise_parallel(self.conv, tp, [kd, kd, vd])
            for name in ("dt_bias", "A_log"):
                tpl.shard_param(self, name, 0, tp)
            tpl.row_parallel(self.out_proj, tp)
            # replicated, but each rank's heads use it: its gradient is a partial sum, summed
            # over the group as the sequence-parallel norms' are (whether sp is on or not)
            self.out_norm.sequence_parallel = True  # type: ignore[attr-defined]
        tpl.mark_sequence_parallel(self.norm, tp)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        c, tp = self.cfg, self.tp
        h = tpl.enter(recomputable(self.norm, x), tp)
        b, s, _ = h.shape  # the whole sequence
        kd, vd, vh = c.key_dim, c.value_dim, c.value_heads
        qkv, z, beta_logit, a = self.in_proj(h).split([c.conv_channels, vd, vh, vh], -1)
        qkv = recomputable(conv_silu, self.conv, qkv)  # selective recompute drops the conv output
        st = wide_dtype(x.dtype)
        q, k, v = (t.to(st) for t in qkv.split([kd, kd, vd], -1))
        q = l2norm(q.view(b, s, c.key_heads, c.key_head_dim)) * c.key_head_dim**-0.5
        k = l2norm(k.view(b, s, c.key_heads, c.key_head_dim))
        g = -torch.exp(self.A_log.to(st)) * F.softplus(a.to(st) + self.dt_bias.to(st))
        y = gated_delta_rule(
            q, k, v.view(b, s, vh, c.value_head_dim), g, torch.sigmoid(beta_logit.to(st)), c.chunk
        )
        # RMSNorm per value head (before the gate, as transformers' Qwen3NextRMSNormGated)
        y = y * torch.rsqrt(y.square().mean(-1, keepdim=True) + self.eps) * self.out_norm.to(st)
        y = y * F.silu(z.to(st).view(b, s, vh, c.value_head_dim))
        return x + tpl.leave(self.out_proj(y.to(x.dtype).reshape(b, s, vd)), tp)
