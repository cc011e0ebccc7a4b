"""Tensor parallelism for the torch layers: the tp group a layer is built for, and the
collectives that carry activations in and out of a tensor-parallel region through autograd
(Megatron-LM's conjugate operators, Shoeybi et al. 2019, and their sequence-parallel forms,
Korthikanti et al. 2022).

A tensor-parallel layer takes its input x and gives its output as the pipeline carries them
between layers: the whole [batch, seq, hidden] activation on every rank of the group, or, with
sequence parallelism, this rank's slice of the sequence [batch, seq / tp, hidden]. Inside, it
runs `enter(x)` before its column-parallel projections (identity forward / all-reduce backward,
or all-gather / reduce-scatter along the sequence) and `leave(y)` after its row-parallel one
(all-reduce / identity, or reduce-scatter / all-gather). Every collective is in the backward of
the input path only, so a split backward's B does them and W does none: the weight gradients of
a column- or row-parallel projection are local.

Layers read the group at construction (`current()`), set around the model's build by
`building(tp)`, as DeepSpeed builds a PipelineModule's layers from LayerSpecs.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

SEQ_DIM = 1
"""The sequence dimension of a [batch, seq, hidden] activation."""


@dataclass(frozen=True)
class TpGroup:
    """The tensor-parallel group a layer runs on: `size` ranks, this one `rank` of them."""

    size: int = 1
    rank: int = 0
    group: Any = None
    """The torch.distributed process group (None at size 1)."""
    sp: bool = False
    """Sequence parallelism: activations between layers hold this rank's sequence slice."""

    def shard(self, n: int) -> slice:
        """This rank's contiguous 1/size of `n` (n divisible by size)."""
        part = n // self.size
        return slice(self.rank * part, (self.rank + 1) * part)


_SINGLE = TpGroup()
_current: TpGroup = _SINGLE


def current() -> TpGroup:
    """The tp group layers built now are for (size 1 outside `building`)."""
    return _current


@contextlib.contextmanager
def building(tp: TpGroup) -> Iterator[TpGroup]:
    """Build layers for `tp` inside the block."""
    global _current
    before, _current = _current, tp
    try:
        yield tp
    finally:
        _current = before


def _all_reduce(x: torch.Tensor, tp: TpGroup) -> torch.Tensor:
    x = x.contiguous()
    dist.all_reduce(x, group=tp.group)
    return x


def _all_gather(x: torch.Tensor, tp: TpGroup) -> torch.Tensor:
    """Concatenate every rank's x along the sequence, in rank order."""
    x = x.transpose(0, SEQ_DIM).contiguous()
    out = x.new_empty((x.shape[0] * tp.size, *x.shape[1:]))
    dist.all_gather_into_tensor(out, x, group=tp.group)
    return out.transpose(0, SEQ_DIM)


def _reduce_scatter(x: torch.Tensor, tp: TpGroup) -> torch.Tensor:
    """Sum x over the ranks and keep this rank's slice of the sequence."""
    x = x.transpose(0, SEQ_DIM).contiguous()
    out = x.new_empty((x.shape[0] // tp.size, *x.shape[1:]))
    dist.reduce_scatter_tensor(out, x, group=tp.group)
    return out.transpose(0, SEQ_DIM)


class _Enter(torch.autograd.Function):
    """Into a tp region: identity / all-reduce, or with sp all-gather / reduce-scatter."""

    @staticmethod
    def forward(ctx, x, tp: TpGroup):
        ctx.tp = tp
        return _all_gather(x, tp) if tp.sp else x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        tp = ctx.tp
        return (_reduce_scatter(grad, tp) if tp.sp else _all_reduce(grad, tp)), None


class _Leave(torch.autograd.Function):
    """Out of a tp region: all-reduce / identity, or with sp reduce-scatter / all-gather."""

    @staticmethod
    def forward(ctx, y, tp: TpGroup):
        ctx.tp = tp
        return _reduce_scatter(y, tp) if tp.sp else _all_reduce(y.clone(), tp)

    @staticmethod
    def backward(ctx, grad):
        tp = ctx.tp
        return (_all_gather(grad, tp) if tp.sp else grad), None


class _AllReduce(torch.autograd.Function):
    """Sum over the group in both directions: partial sums that every rank goes on using with
    its own shard of the layer (Mamba1's x-projection output feeding each rank's channels),
    so the gradient of the sum is the sum of the ranks' gradients."""

    @staticmethod
    def forward(ctx, y, tp: TpGroup):
        ctx.tp = tp
        return _all_reduce(y.clone(), tp)

    @staticmethod
    def backward(ctx, grad):
        return _all_reduce(grad.clone(), ctx.tp), None


def enter(x: torch.Tensor, tp: TpGroup) -> torch.Tensor:
    """x as the column-parallel projections of the layer take it (whole sequence)."""
    return x if tp.size == 1 else _Enter.apply(x, tp)


def leave(y: torch.Tensor, tp: TpGroup) -> torch.Tensor:
    """A row-parallel projection's partial sum y, summed over the group, as the pipeline
    carries it (this rank's sequence slice with sp)."""
    return y if tp.size == 1 else _Leave.apply(y, tp)


def all_reduce(y: torch.Tensor, tp: TpGroup) -> torch.Tensor:
    """Partial sums y summed over the group, each rank then using the sum with its own shard
    (inside a layer; not for a result the ranks go on with alike, which is `leave`)."""
    return y if tp.size == 1 else _AllReduce.apply(y, tp)


def seq_slice(x: torch.Tensor, tp: TpGroup) -> torch.Tensor:
    """This rank's slice of the sequence of a whole activation (no communication; its
    gradient is the slice's, zero elsewhere: for inputs every rank already holds whole)."""
    if tp.size == 1 or not tp.sp:
        return x
    return x[:, tp.shard(x.shape[SEQ_DIM])]
