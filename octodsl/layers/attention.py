"""Causal grouped-query self-attention on torch's scaled_dot_product_attention.

Tensor-parallel as Megatron's: the heads split over the group, the QKV projection
column-parallel (each rank keeps its query heads, their output gates (Qwen3-Next) and the KV
heads they use), the output projection row-parallel. When there are fewer KV heads than ranks
(`models.tp.kv_split`: each replicated on tp / kv_heads ranks) the ranks sharing a head each hold its
projection, a separate `kv` Linear: each rank's gradient of it covers its own query heads only,
so `copy_shared` sums the keys' and values' gradients over the sharers in B (one all-reduce of
every head's), giving every sharer the whole weight gradient (local in W, as for any shard),
and only the first sharer passes the keys' and values' share of the input gradient on (the
others' would be the same, and `enter` sums over the group). The `kv` weight is marked a shard
on that first sharer only, so a gradient norm over the group counts each head once."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ..models.spec import AttentionConfig
from ..models.tp import kv_split
from . import tensor_parallel as tpl
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
        self.tp = tp = tpl.current()
        self.cfg = tpl.local_config(cfg, tp)
        """This rank's heads (all of them at tp 1)."""
        self.norm = nn.RMSNorm(hidden, eps=norm_eps)
        self.qkv = linear(hidden, cfg.q_out + cfg.kv_out)
        self.out = linear(cfg.heads * cfg.head_dim, hidden)
        self.kv_heads = cfg.kv_heads
        """The layer's KV heads, on all ranks."""
        kv = kv_split(cfg.kv_heads, tp.size)
        self.kv_head = kv.first_head(tp.rank)
        """The first KV head this rank's query heads use."""
        self.sharers = kv.sharers
        """Ranks holding each KV head (1 unless replicated)."""
        self.kv: nn.Linear | None = None
        """The replicated KV head's projection (fewer KV heads than ranks), else None."""
        if tp.size > 1:
            self._shard(cfg, tp)
        tpl.mark_sequence_parallel(self.norm, tp)

    def _shard(self, full: AttentionConfig, tp: tpl.TpGroup) -> None:
        d = full.head_dim
        q_parts = [full.heads * d] * (2 if full.output_gate else 1)  # [q | gate]: each split
        kvw = full.kv_heads * d
        kv = slice(self.kv_head * d, (self.kv_head + self.cfg.kv_heads) * d)
        if self.sharers > 1:  # the replicated KV head's projection apart
            self.kv = nn.utils.skip_init(nn.Linear, self.qkv.in_features, 2 * d, bias=False)
            self.kv.weight = nn.Parameter(
                tpl.keep_parts(
                    self.qkv.weight.detach(), 0, [(full.q_out, slice(0, 0)), (kvw, kv), (kvw, kv)]
                ).clone()
            )
            if tp.rank % self.sharers == 0:
                tpl.mark_shard(self.kv.weight, 0)
            kv = slice(0, 0)
        tpl.shard_param(
            self.qkv,
            "weight",
            0,
            tp,
            [*q_parts, kvw, kvw],
            [tp.shard(n) for n in q_parts] + [kv, kv],
        )
        self.qkv.out_features = self.qkv.weight.shape[0]
        tpl.row_parallel(self.out, tp)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        c, tp = self.cfg, self.tp
        h = tpl.enter(recomputable(self.norm, x), tp)
        b, s, _ = h.shape  # the whole sequence
        kv = c.kv_heads * c.head_dim
        if self.kv is None:
            q, k, v = self.qkv(h).split([c.q_out, kv, kv], dim=-1)
        else:
            q = self.qkv(h)
            # the input gradient from the first sharer only; the weight gradient summed
            first = float(tp.rank % self.sharers == 0)
            k, v = tpl.copy_shared(
                self.kv(tpl.scale_grad(h, first)), tp, self.kv_head, self.kv_heads
            ).split([kv, kv], dim=-1)
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
        return x + tpl.leave(self.out(o), tp)
