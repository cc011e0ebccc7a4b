"""Dense MLP layer (SwiGLU or squared ReLU); tensor-parallel as Megatron's: the up (and gate)
projection column-parallel, the down projection row-parallel, one `enter` / `leave` pair."""

from __future__ import annotations

import torch
from torch import nn

from ..models.spec import MLPConfig
from . import tensor_parallel as tpl
from .common import FeedForward
from .recompute import recomputable


class MLP(nn.Module):
    """Pre-norm residual feed-forward layer, for the tp group current at construction (the
    norm and the residual on what the layer holds: the sequence slice under sp)."""

    def __init__(self, cfg: MLPConfig, hidden: int, norm_eps: float = 1e-5):
        super().__init__()
        self.tp = tpl.current()
        tpl.local_config(cfg, self.tp)  # it splits
        self.norm = nn.RMSNorm(hidden, eps=norm_eps)
        self.ffn = FeedForward(hidden, cfg.ffn, cfg.activation)
        self.ffn.shard(self.tp)
        tpl.mark_sequence_parallel(self.norm, self.tp)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = tpl.enter(recomputable(self.norm, x), self.tp)
        return x + tpl.leave(self.ffn(h), self.tp)
