"""Dense MLP layer (SwiGLU or squared ReLU)."""

from __future__ import annotations

import torch
from torch import nn

from ..models.spec import MLPConfig
from .common import FeedForward
from .recompute import recomputable


class MLP(nn.Module):
    """Pre-norm residual feed-forward layer."""

    def __init__(self, cfg: MLPConfig, hidden: int, norm_eps: float = 1e-5):
        super().__init__()
        self.norm = nn.RMSNorm(hidden, eps=norm_eps)
        self.ffn = FeedForward(hidden, cfg.ffn, cfg.activation)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.ffn(recomputable(self.norm, x))
