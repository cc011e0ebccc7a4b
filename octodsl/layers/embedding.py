"""Embedding, LM head and the loss.

The LM head layer returns logits and `lm_loss(logits, labels)` is the cross-entropy: DeepSpeed's
PipelineModule hands the labels only to its `loss_fn(outputs, labels)`, so the loss lives
there (pass `loss_fn=lm_loss`). The labels are the next tokens (the data loader shifts them).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from .common import INIT_STD, wide_dtype
from .recompute import recomputable


def lm_loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy of logits [batch, seq, vocab] against labels [batch, seq], in at least
    fp32."""
    flat = logits.reshape(-1, logits.shape[-1])
    return F.cross_entropy(flat.to(wide_dtype(flat.dtype)), labels.reshape(-1))


class Embedding(nn.Module):
    """Token ids [batch, seq] -> activations [batch, seq, hidden]."""

    def __init__(self, vocab: int, hidden: int):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(vocab, hidden) * INIT_STD)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return F.embedding(ids, self.weight)


class LMHead(nn.Module):
    """Final RMSNorm and projection to vocabulary logits."""

    def __init__(self, vocab: int, hidden: int, norm_eps: float = 1e-5):
        super().__init__()
        self.norm = nn.RMSNorm(hidden, eps=norm_eps)
        self.weight = nn.Parameter(torch.randn(vocab, hidden) * INIT_STD)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(recomputable(self.norm, x), self.weight)


class TiedEmbeddingHead(Embedding):
    """Embedding whose matrix is also the LM head's (tied embeddings). The module is both first
    and last layer: `forward` embeds, `head` (or `tied_head_forward`) gives logits. Its `norm`
    is the final norm, used by the head only."""

    def __init__(self, vocab: int, hidden: int, norm_eps: float = 1e-5):
        super().__init__(vocab, hidden)
        self.norm = nn.RMSNorm(hidden, eps=norm_eps)

    def head(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(recomputable(self.norm, x), self.weight)


def tied_head_forward(module: TiedEmbeddingHead, x: torch.Tensor) -> torch.Tensor:
    """The LM-head use of a tied module (DeepSpeed TiedLayerSpec `forward_fn`)."""
    return module.head(x)
