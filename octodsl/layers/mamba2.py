"""Mamba2 mixer with the chunked SSD scan in pure PyTorch (after the reference `ssd_minimal`
of state-spaces/mamba): quadratic attention-like form inside chunks, a linear recurrence over
chunk states between them.

Tensor-parallel as Megatron's hybrid models: the heads and the B/C groups split over the group
(each rank's heads use its groups, heads // groups per group either way); the in-projection
column-parallel, each of its parts [z, x, B, C, dt] split (this rank's heads' z, x, dt and its
groups' B, C), the convolution's channels likewise, the scan, D skip and gate on the local
heads, the out-projection row-parallel. The gated RMSNorm is per group of channels (as
Megatron's Mamba2 norm with ngroups), and a group's channels are on one rank, so it stays local
and equals the tp 1 norm with no communication."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from ..models.spec import Mamba2Config
from . import tensor_parallel as tpl
from .common import conv_silu, linear, wide_dtype
from .recompute import recomputable


def segsum(x: torch.Tensor) -> torch.Tensor:
    """out[..., i, j] = x[..., j+1] + ... + x[..., i] for j <= i, and -inf for j > i, so that
    exp(out) is the decay from step j to step i of a causal scan (stable: no differences of
    cumulative sums)."""
    n = x.shape[-1]
    x = x[..., None].expand(*x.shape, n)
    below = torch.tril(torch.ones(n, n, dtype=torch.bool, device=x.device), diagonal=-1)
    sums = torch.cumsum(x.masked_fill(~below, 0), dim=-2)
    causal = torch.tril(torch.ones(n, n, dtype=torch.bool, device=x.device))
    return sums.masked_fill(~causal, -torch.inf)


def chunk_states(B: torch.Tensor, X: torch.Tensor, a_cum: torch.Tensor) -> torch.Tensor:
    """The state entering each chunk [b, chunks, heads, head_dim, state]: each chunk's final
    state, then the recurrence over chunks (a scan of length chunks + 1)."""
    decay_to_end = torch.exp(a_cum[..., -1:] - a_cum)
    states = torch.einsum("bclhn,bhcl,bclhp->bchpn", B, decay_to_end, X)
    states = torch.cat([torch.zeros_like(states[:, :1]), states], dim=1)
    chunk_decay = torch.exp(segsum(F.pad(a_cum[..., -1], (1, 0))))
    return torch.einsum("bhzc,bchpn->bzhpn", chunk_decay, states)[:, :-1]


def ssd_scan(
    x: torch.Tensor, dt: torch.Tensor, A: torch.Tensor, B: torch.Tensor, C: torch.Tensor, chunk: int
) -> torch.Tensor:
    """y of the scalar-decay SSM h_t = exp(dt_t A) h_{t-1} + dt_t x_t B_t^T, y_t = h_t C_t.

    x [b, s, heads, head_dim], dt [b, s, heads] (positive), A [heads] (negative),
    B and C [b, s, groups, state] shared by heads // groups heads each. Returns [b, s, heads,
    head_dim]. The sequence is zero-padded to a multiple of `chunk` (padding has dt = 0, which
    changes nothing before it)."""
    b, s, heads, _ = x.shape
    reps = heads // B.shape[2]
    B, C = B.repeat_interleave(reps, dim=2), C.repeat_interleave(reps, dim=2)
    pad = -s % chunk
    if pad:
        x, B, C = (F.pad(t, (0, 0, 0, 0, 0, pad)) for t in (x, B, C))
        dt = F.pad(dt, (0, 0, 0, pad))
    c = (s + pad) // chunk
    X = (x * dt[..., None]).view(b, c, chunk, heads, -1)
    B, C = B.view(b, c, chunk, heads, -1), C.view(b, c, chunk, heads, -1)
    a = (dt * A).view(b, c, chunk, heads).permute(0, 3, 1, 2)  # [b, heads, chunks, chunk]
    a_cum = torch.cumsum(a, dim=-1)
    # Inside each chunk: y = (C B^T o L) X with L the causal decay matrix.
    L = torch.exp(segsum(a))
    y_diag = torch.einsum("bclhn,bcshn,bhcls,bcshp->bclhp", C, B, L, X)
    # selective recompute drops the chunk states and runs the state passing again
    states = recomputable(chunk_states, B, X, a_cum)
    # What the state entering each chunk contributes inside it.
    y_off = torch.einsum("bclhn,bchpn,bhcl->bclhp", C, states, torch.exp(a_cum))
    return (y_diag + y_off).reshape(b, c * chunk, heads, -1)[:, :s]


class Mamba2(nn.Module):
    """Pre-norm residual Mamba2 mixer: in-projection to (z, x, B, C, dt), causal depthwise
    convolution on (x, B, C), SSD scan, D skip, grouped gated RMSNorm, out-projection."""

    def __init__(self, cfg: Mamba2Config, hidden: int, norm_eps: float = 1e-5):
        super().__init__()
        self.tp = tp = tpl.current()
        self.cfg = tpl.local_config(cfg, tp)
        """This rank's heads and groups (all of them at tp 1)."""
        self.eps = norm_eps
        self.norm = nn.RMSNorm(hidden, eps=norm_eps)
        self.in_proj = linear(hidden, cfg.in_proj_out)
        ch = cfg.conv_channels
        self.conv = nn.Conv1d(ch, ch, cfg.conv, groups=ch, padding=cfg.conv - 1)
        # dt starts log-uniform in [1e-3, 1e-1]; dt_bias is its softplus inverse.
        dt = torch.exp(torch.rand(cfg.heads) * (math.log(0.1) - math.log(1e-3)) + math.log(1e-3))
        self.dt_bias = nn.Parameter(dt + torch.log(-torch.expm1(-dt)))
        self.A_log = nn.Parameter(torch.log(torch.empty(cfg.heads).uniform_(1, 16)))
        self.D = nn.Parameter(torch.ones(cfg.heads))
        self.out_norm = nn.Parameter(torch.ones(cfg.inner))
        self.out_proj = linear(cfg.inner, hidden)
        if tp.size > 1:
            gn = cfg.groups * cfg.state
            tpl.column_parallel(self.in_proj, tp, [cfg.inner, cfg.inner, gn, gn, cfg.heads])
            tpl.depthwise_parallel(self.conv, tp, [cfg.inner, gn, gn])
            for name in ("dt_bias", "A_log", "D", "out_norm"):
                tpl.shard_param(self, name, 0, tp)
            tpl.row_parallel(self.out_proj, tp)
        tpl.mark_sequence_parallel(self.norm, tp)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        c, tp = self.cfg, self.tp
        h = tpl.enter(recomputable(self.norm, x), tp)
        b, s, _ = h.shape  # the whole sequence
        gn = c.groups * c.state
        z, xbc, dt = self.in_proj(h).split([c.inner, c.conv_channels, c.heads], -1)
        xbc = recomputable(conv_silu, self.conv, xbc)  # selective recompute drops the conv output
        xs, B, C = xbc.split([c.inner, gn, gn], dim=-1)
        xs = xs.view(b, s, c.heads, c.head_dim)
        st = wide_dtype(x.dtype)
        dt = F.softplus(dt.to(st) + self.dt_bias.to(st))
        A = -torch.exp(self.A_log.to(st))
        y = ssd_scan(
            xs.to(st),
            dt,
            A,
            B.view(b, s, c.groups, c.state).to(st),
            C.view(b, s, c.groups, c.state).to(st),
            c.chunk,
        ).to(x.dtype)
        y = (y + xs * self.D[:, None]).reshape(b, s, c.inner) * F.silu(z)
        # Gated RMSNorm over each group's channels (norm after the gate, as in Mamba2).
        g = y.view(b, s, c.groups, -1)
        g = g * torch.rsqrt(g.square().mean(dim=-1, keepdim=True) + self.eps)
        return x + tpl.leave(self.out_proj(g.view(b, s, c.inner) * self.out_norm), tp)
