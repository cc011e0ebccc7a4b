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

Weights: a layer builds its full-size parameters with the tp 1 init and keeps this rank's
shard (`shard_param`, `column_parallel`, `row_parallel`), so that a tp run starts from exactly
the weights of the tp 1 run with the same seed. Building the whole layer first is for that
equivalence on the small models the tests and CPU runs use; a GPU run of a 56B model would
initialise each shard directly (this rank's part of the random stream), which is not built.

How the engine treats the parameters (Megatron's attribute names, which DeepSpeed's gradient
norm also reads): a shard is marked `tensor_model_parallel = True` (with `partition_dim`), so a
norm over the group counts it on every rank; the others are replicated and counted once (on tp
rank 0). Replicated parameters get the same gradient on every rank, except those that see only
this rank's sequence slice under sequence parallelism (the norms before a tp region, the MoE
router): they are marked `sequence_parallel = True`, and their gradients must be summed over
the group (`all_reduce_sequence_parallel_grads`) before the optimizer step.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar, cast

import torch
import torch.distributed as dist
from torch import nn

from ..models.load import SpecError
from ..models.spec import LayerConfig
from ..models.tp import layer_problems, local_layer
from .scope import BuildScope

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


_Config = TypeVar("_Config", bound=LayerConfig)
_SCOPE = BuildScope(TpGroup())
current = _SCOPE.current
"""The tp group layers built now are for (size 1 outside `building`)."""
building = _SCOPE.building
"""Build layers for a tp group inside the block."""


def local_config(cfg: _Config, tp: TpGroup) -> _Config:
    """The part of layer `cfg` one rank of `tp` holds (`models.tp.local_layer`, the sizes the
    cost model uses too); a SpecError when tp cannot split the layer."""
    fatal = [p.message for p in layer_problems(cfg, tp.size) if p.fatal]
    if fatal:
        raise SpecError(f"tp {tp.size} cannot split a {cfg.kind} layer: " + "; ".join(fatal))
    return cast(_Config, local_layer(cfg, tp.size))


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


class _GatherSeq(torch.autograd.Function):
    """Into a sequence-parallel region: all-gather along the sequence, reduce-scatter back."""

    @staticmethod
    def forward(ctx, x, tp: TpGroup):
        ctx.tp = tp
        return _all_gather(x, tp)

    @staticmethod
    def backward(ctx, grad):
        return _reduce_scatter(grad, ctx.tp), None


class _ScatterSeq(torch.autograd.Function):
    """Out of a sequence-parallel region: reduce-scatter along the sequence, all-gather back."""

    @staticmethod
    def forward(ctx, y, tp: TpGroup):
        ctx.tp = tp
        return _reduce_scatter(y, tp)

    @staticmethod
    def backward(ctx, grad):
        return _all_gather(grad, ctx.tp), None


def enter(x: torch.Tensor, tp: TpGroup) -> torch.Tensor:
    """x as the column-parallel projections of the layer take it (whole sequence): Megatron's
    f (`copy`: identity / all-reduce), or with sp all-gather / reduce-scatter."""
    if tp.size == 1:
        return x
    return _GatherSeq.apply(x, tp) if tp.sp else _Copy.apply(x, tp)


def leave(y: torch.Tensor, tp: TpGroup) -> torch.Tensor:
    """A row-parallel projection's partial sum y, summed over the group, as the pipeline
    carries it (this rank's sequence slice with sp): Megatron's g (`reduce`: all-reduce /
    identity), or with sp reduce-scatter / all-gather."""
    if tp.size == 1:
        return y
    return _ScatterSeq.apply(y, tp) if tp.sp else _Reduce.apply(y, tp)


def seq_slice(x: torch.Tensor, tp: TpGroup) -> torch.Tensor:
    """This rank's slice of the sequence of a whole activation (no communication; its
    gradient is the slice's, zero elsewhere: for inputs every rank already holds whole)."""
    if tp.size == 1 or not tp.sp:
        return x
    return x[:, tp.shard(x.shape[SEQ_DIM])]


class _Copy(torch.autograd.Function):
    """Identity forward, all-reduce backward whatever sp is (Megatron's
    copy_to_tensor_model_parallel_region): a whole tensor every rank holds alike, used with
    each rank's shard, so each rank's gradient is a partial sum."""

    @staticmethod
    def forward(ctx, x, tp: TpGroup):
        ctx.tp = tp
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        return _all_reduce(grad.clone(), ctx.tp), None


class _Reduce(torch.autograd.Function):
    """All-reduce forward, identity backward whatever sp is (Megatron's
    reduce_from_tensor_model_parallel_region)."""

    @staticmethod
    def forward(ctx, y, tp: TpGroup):
        return _all_reduce(y.clone(), tp)

    @staticmethod
    def backward(ctx, grad):
        return grad, None


class _Gather(torch.autograd.Function):
    """With sp: all-gather along the sequence forward, this rank's slice of the gradient
    backward (every rank computes the same gradient of what it gathered)."""

    @staticmethod
    def forward(ctx, x, tp: TpGroup):
        ctx.tp = tp
        return _all_gather(x, tp)

    @staticmethod
    def backward(ctx, grad):
        tp = ctx.tp
        return grad[:, tp.shard(grad.shape[SEQ_DIM])], None


def copy(x: torch.Tensor, tp: TpGroup) -> torch.Tensor:
    """x, which every rank holds whole and goes on using with its own shard: the gradients
    the ranks compute are summed (identity forward, all-reduce backward)."""
    return x if tp.size == 1 else _Copy.apply(x, tp)


def reduce(y: torch.Tensor, tp: TpGroup) -> torch.Tensor:
    """Partial sums y summed over the group, the sum then used alike by every rank (whose
    gradients are then alike: identity backward)."""
    return y if tp.size == 1 else _Reduce.apply(y, tp)


def gather(x: torch.Tensor, tp: TpGroup) -> torch.Tensor:
    """x with the whole sequence, for a computation every rank repeats alike on it (the MoE
    routing): with sp all-gathered, its gradient this rank's slice; without sp, x."""
    return _Gather.apply(x, tp) if tp.size > 1 and tp.sp else x


class _ScaleGrad(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, factor: float):
        ctx.factor = factor
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        return grad * ctx.factor, None


def scale_grad(x: torch.Tensor, factor: float) -> torch.Tensor:
    """x, its gradient multiplied by `factor` (no communication)."""
    return _ScaleGrad.apply(x, factor)


class _CopyShared(torch.autograd.Function):
    """Identity forward; backward sums the gradient over the ranks that hold the same `slot`
    of `slots`: one all-reduce of every slot's gradient, each rank's placed in its slot."""

    @staticmethod
    def forward(ctx, x, tp: TpGroup, slot: int, slots: int):
        ctx.tp, ctx.slot, ctx.slots = tp, slot, slots
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        every = grad.new_zeros((ctx.slots, *grad.shape))
        every[ctx.slot] = grad
        dist.all_reduce(every, group=ctx.tp.group)
        return every[ctx.slot], None, None, None


def copy_shared(x: torch.Tensor, tp: TpGroup, slot: int, slots: int) -> torch.Tensor:
    """x, which the ranks holding `slot` (of `slots`, each held by a whole number of ranks)
    hold alike and use each with its own shard: their gradients are summed (a replicated KV
    head's keys and values, used by each rank's query heads)."""
    return x if tp.size == 1 else _CopyShared.apply(x, tp, slot, slots)


def keep_parts(t: torch.Tensor, dim: int, parts: Sequence[tuple[int, slice]]) -> torch.Tensor:
    """Of t cut along `dim` into consecutive blocks of the given sizes, the given slice of each
    block, concatenated (a fused projection's shard: each part's share)."""
    blocks = t.split([n for n, _ in parts], dim)
    return torch.cat(
        [b.narrow(dim, s.start, s.stop - s.start) for b, (_, s) in zip(blocks, parts, strict=True)],
        dim,
    )


def shard_param(
    module: nn.Module,
    name: str,
    dim: int,
    tp: TpGroup,
    parts: Sequence[int] | None = None,
    keep: Sequence[slice] | None = None,
) -> None:
    """Replace `module.<name>` by this rank's shard along `dim`: of each of `parts` (consecutive
    blocks, default the whole dim) the `keep` slice (default this rank's 1/tp); marked as a
    shard (`tensor_model_parallel`, `partition_dim`)."""
    p = getattr(module, name)
    sizes = list(parts) if parts is not None else [p.shape[dim]]
    slices = list(keep) if keep is not None else [tp.shard(n) for n in sizes]
    shard = nn.Parameter(
        keep_parts(p.detach(), dim, list(zip(sizes, slices, strict=True))).clone(),
        requires_grad=p.requires_grad,
    )
    mark_shard(shard, dim)
    setattr(module, name, shard)


def mark_shard(p: nn.Parameter, dim: int) -> None:
    """Mark p as this rank's shard along `dim` of a tensor-parallel parameter."""
    p.tensor_model_parallel = True  # type: ignore[attr-defined]
    p.partition_dim = dim  # type: ignore[attr-defined]


def column_parallel(linear: nn.Linear, tp: TpGroup, parts: Sequence[int] | None = None) -> None:
    """Keep this rank's output rows of `linear` (and bias): of each of `parts`, as for a fused
    projection such as SwiGLU's [gate | up]."""
    shard_param(linear, "weight", 0, tp, parts)
    if linear.bias is not None:
        shard_param(linear, "bias", 0, tp, parts)
    linear.out_features = linear.weight.shape[0]


def row_parallel(linear: nn.Linear, tp: TpGroup) -> None:
    """Keep this rank's input columns of `linear` (its output is then a partial sum)."""
    assert linear.bias is None, "a row-parallel bias would be summed tp times"
    shard_param(linear, "weight", 1, tp)
    linear.in_features = linear.weight.shape[1]


def depthwise_parallel(conv: nn.Conv1d, tp: TpGroup, parts: Sequence[int] | None = None) -> None:
    """Keep this rank's channels of a depthwise convolution (of each of `parts`)."""
    shard_param(conv, "weight", 0, tp, parts)
    if conv.bias is not None:
        shard_param(conv, "bias", 0, tp, parts)
    conv.in_channels = conv.out_channels = conv.groups = conv.weight.shape[0]


def mark_sequence_parallel(module: nn.Module, tp: TpGroup) -> None:
    """Under sp, mark the parameters of `module` (replicated, run on this rank's sequence slice)
    as needing their gradients summed over the group."""
    if tp.size > 1 and tp.sp:
        for p in module.parameters():
            p.sequence_parallel = True  # type: ignore[attr-defined]


def all_reduce_sequence_parallel_grads(params: Iterable[nn.Parameter], tp: TpGroup) -> None:
    """Sum over the group the gradients of the parameters marked `sequence_parallel` (after the
    backward, before clipping and the optimizer step)."""
    if tp.size == 1:
        return
    for p in params:
        if getattr(p, "sequence_parallel", False) and p.grad is not None:
            dist.all_reduce(p.grad, group=tp.group)
