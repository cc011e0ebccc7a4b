"""Mamba1 mixer with the selective scan in pure PyTorch.

The scan h_t = exp(dt_t A) h_{t-1} + dt_t u_t B_t, y_t = <h_t, C_t> (per channel, diagonal A)
runs in chunks: inside a chunk h_t = e^{a_t} (h_0 + sum_{r<=t} dt_r u_r B_r / e^{a_r}) with a_t the
running sum of dt A, all positions at once; only the chunk-start states are carried through a
Python loop (seq / chunk steps on [batch, d_inner, state] tensors).

Tensor-parallel (models.tp): the inner channels split over the group. The in-projection is
column-parallel ([x | z], each half split), the convolution, dt-projection (column-parallel),
A, D and the scan run on the local channels, the out-projection is row-parallel. The
x-projection reads every channel, so it is row-parallel too: its small dt | B | C output is
summed over the group (`reduce`), Jamba's inner norms run on the sums alike on every rank (so
their weights get the same gradient everywhere), and `copy` then sums the gradients each
rank's channels give dt, B and C.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from ..models.spec import Mamba1Config
from . import tensor_parallel as tpl
from .common import conv_silu, linear, wide_dtype
from .recompute import recomputable

SCAN_CHUNK = 8
"""Positions per chunk of the selective scan."""
MAX_STEP_DECAY = 80.0 / SCAN_CHUNK
"""Per-step decay dt * |A| is clipped here so e^{-a} stays below e^80 inside a chunk (fp32 overflows
past e^88). A step that decays by e^-10 already erases the state to 5e-5, so the clip is invisible
in practice."""


def selective_scan(
    u: torch.Tensor, dt: torch.Tensor, A: torch.Tensor, B: torch.Tensor, C: torch.Tensor
) -> torch.Tensor:
    """y [b, s, d] of the selective SSM for u and dt [b, s, d], A [d, state] (negative), B and C
    [b, s, state]. The sequence is zero-padded to a multiple of SCAN_CHUNK (dt = 0 there)."""
    b, s, d = u.shape
    pad = -s % SCAN_CHUNK
    if pad:
        u, dt, B, C = (F.pad(t, (0, 0, 0, pad)) for t in (u, dt, B, C))
    c = (s + pad) // SCAN_CHUNK
    decay = (dt[..., None] * A).clamp(min=-MAX_STEP_DECAY).view(b, c, SCAN_CHUNK, d, -1)
    inject = ((dt * u)[..., None] * B[:, :, None, :]).view(b, c, SCAN_CHUNK, d, -1)
    # e^a >= e^-80 inside a chunk, so dividing by it is safe (and cheaper than a second exp)
    ea = torch.exp(torch.cumsum(decay, dim=2))
    local = ea * torch.cumsum(inject / ea, dim=2)  # from a zero state
    # unbind once: indexing chunk j inside the loop would make backward fill a full-size zero
    # gradient per chunk
    ends, decays = local[:, :, -1].unbind(1), ea[:, :, -1].unbind(1)
    state = torch.zeros_like(ends[0])
    starts = []
    for end, chunk_decay in zip(ends, decays, strict=True):
        starts.append(state)
        state = chunk_decay * state + end
    h = local + ea * torch.stack(starts, dim=1)[:, :, None]
    y = torch.einsum("bcqdn,bcqn->bcqd", h, C.view(b, c, SCAN_CHUNK, -1))
    return y.reshape(b, c * SCAN_CHUNK, d)[:, :s]


class Mamba1(nn.Module):
    """Pre-norm residual Mamba1 mixer: in-projection to (x, z), causal depthwise convolution,
    x-projection to (dt, B, C) (optionally RMS-normed, as in Jamba), selective scan, D skip,
    SiLU(z) gate, out-projection."""

    def __init__(self, cfg: Mamba1Config, hidden: int, norm_eps: float = 1e-5):
        super().__init__()
        self.tp = tp = tpl.current()
        self.cfg = tpl.local_config(cfg, tp)
        """This rank's channels (all of them at tp 1)."""
        d = cfg.inner
        self.norm = nn.RMSNorm(hidden, eps=norm_eps)
        self.in_proj = linear(hidden, 2 * d)
        self.conv = nn.Conv1d(d, d, cfg.conv, groups=d, padding=cfg.conv - 1)
        self.x_proj = linear(d, cfg.dt_rank + 2 * cfg.state)
        self.dt_proj = nn.Linear(cfg.dt_rank, d)
        # dt starts log-uniform in [1e-3, 1e-1] (dt_proj's bias is its softplus inverse).
        dt = torch.exp(torch.rand(d) * (math.log(0.1) - math.log(1e-3)) + math.log(1e-3))
        with torch.no_grad():
            self.dt_proj.bias.copy_(dt + torch.log(-torch.expm1(-dt)))
        self.A_log = nn.Parameter(torch.log(torch.arange(1, cfg.state + 1.0)).repeat(d, 1))
        self.D = nn.Parameter(torch.ones(d))
        if cfg.inner_norms:
            self.dt_norm = nn.RMSNorm(cfg.dt_rank, eps=norm_eps)
            self.b_norm = nn.RMSNorm(cfg.state, eps=norm_eps)
            self.c_norm = nn.RMSNorm(cfg.state, eps=norm_eps)
        self.out_proj = linear(d, hidden)
        if tp.size > 1:
            tpl.column_parallel(self.in_proj, tp, [d, d])
            tpl.depthwise_parallel(self.conv, tp)
            tpl.row_parallel(self.x_proj, tp)
            tpl.column_parallel(self.dt_proj, tp)
            tpl.shard_param(self, "A_log", 0, tp)
            tpl.shard_param(self, "D", 0, tp)
            tpl.row_parallel(self.out_proj, tp)
        tpl.mark_sequence_parallel(self.norm, tp)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        c, tp = self.cfg, self.tp
        h = tpl.enter(recomputable(self.norm, x), tp)
        xs, z = self.in_proj(h).chunk(2, dim=-1)
        xs = recomputable(conv_silu, self.conv, xs)  # selective recompute drops the conv output
        dt, B, C = tpl.reduce(self.x_proj(xs), tp).split([c.dt_rank, c.state, c.state], dim=-1)
        if c.inner_norms:
            dt, B, C = self.dt_norm(dt), self.b_norm(B), self.c_norm(C)
        dt, B, C = (tpl.copy(t, tp) for t in (dt, B, C))
        st = wide_dtype(x.dtype)
        dt = F.softplus(self.dt_proj(dt).to(st))
        A = -torch.exp(self.A_log.to(st))
        y = selective_scan(xs.to(st), dt, A, B.to(st), C.to(st)).to(x.dtype)
        y = recomputable(_gate, y, xs, self.D, z)  # and the gated output
        return x + tpl.leave(self.out_proj(y), tp)


def _gate(y: torch.Tensor, xs: torch.Tensor, D: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
    """The scan output with the D skip, gated by SiLU(z)."""
    return (y + xs * D) * F.silu(z)
