"""Causal grouped-query self-attention on torch's scaled_dot_product_attention."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ..models.spec import AttentionConfig
from .common import linear
from .recompute import recomputable


def rotary(x: torch.Tensor, theta: float) -> torch.Tensor:
    """Rotary position embedding (rotate-half form) of x [batch, heads, seq, head_dim]."""
    seq, dim = x.shape[-2], x.shape[-1]
    inv_freq = theta ** (-torch.arange(0, dim, 2, device=x.device, dtype=torch.float32) / dim)
    angles = torch.arange(seq, device=x.device, dtype=torch.float32)[:, None] * inv_freq
    cos, sin = angles.cos().to(x.dtype), angles.sin().to(x.dtype)
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat([x1 * cos - x2 * sin, x1 * sin + x2 * cos], dim=-1)


def attention_core(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, gqa: bool) -> torch.Tensor:
    """Causal attention of q [batch, heads, seq, head_dim] over k, v [batch, kv_heads, seq,
    head_dim], as [batch, seq, heads * head_dim]."""
    b, heads, s, d = q.shape
    o = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=gqa)
    return o.transpose(1, 2).reshape(b, s, heads * d)


class Attention(nn.Module):
    """Pre-norm residual causal self-attention with GQA; optional RoPE and output gate."""

    def __init__(self, cfg: AttentionConfig, hidden: int, norm_eps: float = 1e-5):
        super().__init__()
        self.cfg = cfg
        self.norm = nn.RMSNorm(hidden, eps=norm_eps)
        self.qkv = linear(hidden, cfg.q_out + cfg.kv_out)
        self.out = linear(cfg.heads * cfg.head_dim, hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        c = self.cfg
        b, s, _ = x.shape
        kv = c.kv_heads * c.head_dim
        q, k, v = self.qkv(recomputable(self.norm, x)).split([c.q_out, kv, kv], dim=-1)
        if c.output_gate:
            q, gate = q.chunk(2, dim=-1)
        q = q.view(b, s, c.heads, c.head_dim).transpose(1, 2)
        k = k.view(b, s, c.kv_heads, c.head_dim).transpose(1, 2)
        v = v.view(b, s, c.kv_heads, c.head_dim).transpose(1, 2)
        if c.rope_theta is not None:
            q, k = rotary(q, c.rope_theta), rotary(k, c.rope_theta)
        # selective recompute drops the core's output (and its log-sum-exp) and runs it again
        o = recomputable(attention_core, q, k, v, c.kv_heads != c.heads)
        if c.output_gate:
            o = o * torch.sigmoid(gate)
        return x + self.out(o)
