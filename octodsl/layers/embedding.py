"""Embedding, LM head and the loss, vocab-parallel under tensor parallelism.

The LM head layer returns logits and `lm_loss(logits, labels)` is the cross-entropy: DeepSpeed's
PipelineModule hands the labels only to its `loss_fn(outputs, labels)`, so the loss lives
there (pass `loss_fn=lm_loss`). The labels are the next tokens (the data loader shifts them).

Tensor parallelism (the tp group current at construction, `tensor_parallel.current()`) splits
the vocabulary as Megatron-LM does: each rank holds `padded_vocab / tp` consecutive rows of the
embedding matrix (the vocabulary padded up to a multiple of tp with zero rows that no id and no
label ever reaches). The embedding looks up the ids of its rows, zeros for the others, and the
partial sums leave the tp region (`tensor_parallel.leave`: all-reduced, or under sequence
parallelism reduce-scattered, so the first stage's output is this rank's sequence slice). The
LM head enters the region (all-gathered under sp) after its norm and projects onto its rows:
its logits are this rank's vocabulary columns, and `lm_loss` then runs the vocab-parallel
cross-entropy (the max and the sum of exponentials all-reduced over the group, the target's
logit taken from the rank that holds it, padded columns left out). The layers keep the tp 1
init: the full matrix is drawn as at tp 1 and each rank keeps its rows, so a tp run starts from
the tp 1 weights; at tp 1 every operation is the one it always was.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from ..models.tp import local_vocab
from . import tensor_parallel as tpl
from .common import INIT_STD, wide_dtype
from .recompute import recomputable


class VocabShard:
    """The vocabulary columns of this rank's logits: [first, first + rows) of `vocab` (the rest
    of the shard is padding), on the tp group `tp`."""

    def __init__(self, vocab: int, tp: tpl.TpGroup):
        self.vocab = vocab
        self.tp = tp
        self.rows = local_vocab(vocab, tp.size)
        self.first = tp.rank * self.rows

    def weight(self, hidden: int) -> nn.Parameter:
        """This rank's rows of the embedding matrix, drawn whole as at tp 1 (zero padding rows),
        marked as a shard along dim 0."""
        full = torch.randn(self.vocab, hidden) * INIT_STD
        if self.tp.size == 1:
            return nn.Parameter(full)
        rows = torch.zeros(self.rows, hidden)
        real = full[self.first : min(self.first + self.rows, self.vocab)]
        rows[: len(real)] = real
        p = nn.Parameter(rows)
        tpl.mark_shard(p, 0)
        return p

    def local(self, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(ids as rows of this shard, 0 where outside it; where they are outside)."""
        local = ids - self.first
        outside = (local < 0) | (local >= self.rows)
        return local.masked_fill(outside, 0), outside


def lm_loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy of logits [batch, seq, vocab] against labels [batch, seq], in at least
    fp32; of a vocab-parallel LM head's logits (this rank's columns) the vocab-parallel
    cross-entropy over its tp group."""
    flat = logits.reshape(-1, logits.shape[-1]).to(wide_dtype(logits.dtype))
    shard: VocabShard | None = getattr(logits, "vocab_shard", None)
    if shard is None:
        return F.cross_entropy(flat, labels.reshape(-1))
    return _VocabParallelCrossEntropy.apply(flat, labels.reshape(-1), shard).mean()


class _VocabParallelCrossEntropy(torch.autograd.Function):
    """Per token, log(sum exp logits) - logit of the target, over logits split by columns across
    the tp group (Megatron-LM's vocab_parallel_cross_entropy). The collectives are in the
    forward only: the gradient softmax - onehot(target) is this rank's columns of it."""

    @staticmethod
    def forward(ctx, logits: torch.Tensor, target: torch.Tensor, shard: VocabShard):
        group = shard.tp.group
        padding = (
            torch.arange(shard.first, shard.first + shard.rows, device=logits.device) >= shard.vocab
        )
        logits = logits.masked_fill(padding, float("-inf"))
        top = logits.max(dim=-1).values
        dist.all_reduce(top, op=dist.ReduceOp.MAX, group=group)
        shifted = logits - top.unsqueeze(-1)
        local, outside = shard.local(target)
        picked = shifted.gather(-1, local.unsqueeze(-1)).squeeze(-1).masked_fill(outside, 0.0)
        dist.all_reduce(picked, group=group)
        exp = shifted.exp()
        total = exp.sum(dim=-1)
        dist.all_reduce(total, group=group)
        ctx.save_for_backward(exp.div_(total.unsqueeze(-1)), local, outside)
        return total.log() - picked

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        softmax, local, outside = ctx.saved_tensors
        onehot = torch.zeros_like(softmax).scatter_(-1, local.unsqueeze(-1), 1.0)
        onehot.masked_fill_(outside.unsqueeze(-1), 0.0)
        return (softmax - onehot) * grad.unsqueeze(-1), None, None


def _embed(shard: VocabShard, weight: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    if shard.tp.size == 1:
        return F.embedding(ids, weight)
    local, outside = shard.local(ids)
    partial = F.embedding(local, weight).masked_fill(outside.unsqueeze(-1), 0.0)
    return tpl.leave(partial, shard.tp)


def _logits(
    shard: VocabShard, norm: nn.RMSNorm, weight: torch.Tensor, x: torch.Tensor
) -> torch.Tensor:
    logits = F.linear(tpl.enter(recomputable(norm, x), shard.tp), weight)
    if shard.tp.size > 1:
        logits.vocab_shard = shard  # type: ignore[attr-defined]  # for lm_loss
    return logits


class Embedding(nn.Module):
    """Token ids [batch, seq] -> activations [batch, seq, hidden] (this rank's sequence slice
    under sequence parallelism)."""

    def __init__(self, vocab: int, hidden: int):
        super().__init__()
        self.shard = VocabShard(vocab, tpl.current())
        self.weight = self.shard.weight(hidden)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return _embed(self.shard, self.weight, ids)


class LMHead(nn.Module):
    """Final RMSNorm and projection to vocabulary logits (this rank's columns under tp)."""

    def __init__(self, vocab: int, hidden: int, norm_eps: float = 1e-5):
        super().__init__()
        self.shard = VocabShard(vocab, tpl.current())
        self.norm = _norm(hidden, norm_eps, self.shard.tp)
        self.weight = self.shard.weight(hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _logits(self.shard, self.norm, self.weight, x)


class TiedEmbeddingHead(Embedding):
    """Embedding whose matrix is also the LM head's (tied embeddings). The module is both first
    and last layer: `forward` embeds, `head` (or `tied_head_forward`) gives logits. Its `norm`
    is the final norm, used by the head only."""

    def __init__(self, vocab: int, hidden: int, norm_eps: float = 1e-5):
        super().__init__(vocab, hidden)
        self.norm = _norm(hidden, norm_eps, self.shard.tp)

    def head(self, x: torch.Tensor) -> torch.Tensor:
        return _logits(self.shard, self.norm, self.weight, x)


def _norm(hidden: int, eps: float, tp: tpl.TpGroup) -> nn.RMSNorm:
    """The head's final norm: replicated; under sp it normalises this rank's sequence slice, so
    its weight gradient is a partial sum that the engine sums over the group."""
    norm = nn.RMSNorm(hidden, eps=eps)
    tpl.mark_sequence_parallel(norm, tp)
    return norm


def tied_head_forward(module: TiedEmbeddingHead, x: torch.Tensor) -> torch.Tensor:
    """The LM-head use of a tied module (DeepSpeed TiedLayerSpec `forward_fn`)."""
    return module.head(x)
