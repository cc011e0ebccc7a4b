"""Expert parallelism for the MoE layer: the ep group a layer is built for, and the all-to-all
that carries token rows to the ranks owning their experts and back through autograd (Megatron's
alltoall token dispatcher, GShard / Switch Transformer's expert parallelism).

The ep group is carved out of the data-parallel group (as Megatron carves it): ep divides dp and
the expert count, and the `size` consecutive data-parallel copies of one tp rank and pipeline
stage form a group. Each rank holds experts [rank * E / ep, (rank + 1) * E / ep) and routes the
tokens of its own micro-batch (the ranks of an ep group see different data): the rows go to the
ranks owning their experts (`apply_experts`: counts exchanged first, then the rows with those
split sizes), each rank runs its local experts on what it received, and a second all-to-all
brings the outputs back. With tp, each tp rank dispatches its tp group's whole set of tokens to
the same tp rank of the other copies, whose local experts hold 1/tp of their inner size (expert
tensor parallelism, `moe`): the outputs come back as partial sums, which the layer's `leave`
sums as at ep 1. The all-to-alls are in the forward and in the backward of the input path only,
so a split backward's B does them and W none (`split_backward`).

Weights: the layer draws the ep 1 init of every expert and keeps its own
(`keep_local_experts`), so an ep run starts from exactly the weights of the ep 1 run with the
same seed.

Gradients (what the engine must do): a local expert's gradient is the sum over the ep group's
tokens routed to it, so its data-parallel reduction is over the dp / ep copies that hold the same
experts (the expert-data-parallel group: the same ep rank in every ep group), not over the whole
dp group like the other parameters. The expert parameters are marked as DeepSpeed's MoE marks
its own (`deepspeed.moe.utils.is_moe_param`, Megatron's attribute too): `allreduce = False`,
with `group_name` naming DeepSpeed's expert-data-parallel group of this ep size. The rank's
experts differ from its ep peers', so a gradient norm sums them over the ep group (as it does a
tp shard over the tp group). A rank no token reached leaves its experts' `.grad` None
(DeepSpeed's reduction fills it with zeros).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from ..models.ep import dispatch_bytes  # noqa: F401  (the rule lives there, torch-free)
from ..models.load import SpecError
from .scope import BuildScope


@dataclass(frozen=True)
class EpGroup:
    """The expert-parallel group a MoE layer runs on: `size` ranks, this one `rank` of them."""

    size: int = 1
    rank: int = 0
    group: Any = None
    """The torch.distributed process group (None at size 1)."""

    def __post_init__(self) -> None:
        if self.size < 1 or not 0 <= self.rank < self.size:
            raise ValueError(
                f"an ep group needs a size of at least 1 and a rank in [0, size): "
                f"size {self.size}, rank {self.rank}"
            )

    def local_experts(self, experts: int) -> slice:
        """The experts this rank holds; a SpecError when ep does not divide their number."""
        if experts % self.size:
            raise SpecError(f"ep {self.size} cannot split {experts} experts: ep must divide them")
        part = experts // self.size
        return slice(self.rank * part, (self.rank + 1) * part)

    @property
    def group_name(self) -> str:
        """The name of DeepSpeed's expert-data-parallel group for this ep size."""
        return f"ep_size_{self.size}"


_SCOPE = BuildScope(EpGroup())
current = _SCOPE.current
"""The ep group MoE layers built now are for (size 1 outside `building`)."""
building = _SCOPE.building
"""Build MoE layers for an ep group inside the block (with `tensor_parallel.building` for tp)."""


Wait = Callable[[dist.Work], None]
"""How a layer waits for one of its all-to-alls (issued asynchronously)."""


def _wait(work: dist.Work) -> None:
    work.wait()


_WAIT = BuildScope[Wait](_wait)
waiting = _WAIT.building
"""Wait for the all-to-alls run inside the block with `wait(work)` (the executor's watchdog,
which stops a wait that outlasts its timeout or whose peer died, naming the op); outside one,
`work.wait()`."""


class _Lane(threading.local):
    """What the all-to-alls issued on this thread use instead of the layer's group and of
    `waiting`'s wait (unset: those)."""

    group: Any = None
    wait: Wait | None = None


_LANE = _Lane()


@contextmanager
def lane(group: Any, wait: Wait) -> Iterator[None]:
    """On this thread, inside the block: issue the all-to-alls on `group` (a process group of
    the same ranks as the layers' ep group) and wait for each with `wait(work)`. The executor
    runs one op of an overlap group on a second thread with a group of its own, so that the two
    ops' all-to-alls never share a group: collectives on one group must be issued in the same
    order on every rank, which two threads sharing it would not guarantee. Thread-local on
    purpose: a backward that autograd runs on its own worker thread (CUDA) keeps the layer's
    group, so only forwards run in a lane (deepspeed_ext/lanes.py)."""
    before = _LANE.group, _LANE.wait
    _LANE.group, _LANE.wait = group, wait
    try:
        yield
    finally:
        _LANE.group, _LANE.wait = before


def _issue(out: torch.Tensor, x: torch.Tensor, ep: EpGroup, **splits: Any) -> None:
    """all_to_all_single of x into out over this thread's lane group (else the layer's), waited
    for as the lane (else `waiting`) says."""
    group = ep.group if _LANE.group is None else _LANE.group
    wait = _LANE.wait or _WAIT.current()
    wait(dist.all_to_all_single(out, x, group=group, async_op=True, **splits))


def keep_local_experts(module: nn.Module, name: str, ep: EpGroup) -> None:
    """Replace `module.<name>` (experts along dim 0) by this rank's experts (unmarked: tp may cut
    them next; `mark_expert` the final parameter)."""
    p = getattr(module, name)
    mine = nn.Parameter(p.detach()[ep.local_experts(p.shape[0])].clone())
    setattr(module, name, mine)


def mark_expert(p: nn.Parameter, ep: EpGroup) -> None:
    """Mark p as an expert parameter, reduced over the expert-data-parallel group (at ep 1 that
    is the whole dp group: nothing is marked)."""
    if ep.size > 1:
        p.allreduce = False  # type: ignore[attr-defined]
        p.group_name = ep.group_name  # type: ignore[attr-defined]


def _all_to_all(x: torch.Tensor, ep: EpGroup, send: list[int], recv: list[int]) -> torch.Tensor:
    """send[i] consecutive rows of x to rank i; the recv[i] rows from rank i, in rank order."""
    x = x.contiguous()
    out = x.new_empty((sum(recv), *x.shape[1:]))
    _issue(out, x, ep, output_split_sizes=recv, input_split_sizes=send)
    return out


class _AllToAll(torch.autograd.Function):
    """Rows to their ranks; backward sends each row's gradient back where the row came from."""

    @staticmethod
    def forward(ctx, x, ep: EpGroup, send: list[int], recv: list[int]):
        ctx.ep, ctx.send, ctx.recv = ep, send, recv
        return _all_to_all(x, ep, send, recv)

    @staticmethod
    def backward(ctx, grad):
        return _all_to_all(grad, ctx.ep, ctx.recv, ctx.send), None, None, None


def _transpose_chunks(x: torch.Tensor, sizes: Sequence[Sequence[int]]) -> torch.Tensor:
    """x as consecutive chunks of sizes[a][b] in (a, b) order, the chunks put in (b, a) order."""
    chunks = x.split([n for row in sizes for n in row])
    inner = len(sizes[0])
    return torch.cat([chunks[a * inner + b] for b in range(inner) for a in range(len(sizes))])


Experts = Callable[[torch.Tensor, list[int]], torch.Tensor]
"""The local experts: rows grouped by local expert, the row count of each -> each row's output."""


def apply_experts(
    experts: Experts, rows: torch.Tensor, counts: torch.Tensor, ep: EpGroup
) -> torch.Tensor:
    """Each row's expert output, in the order of `rows`: rows grouped by expert (`counts`, per
    expert of the whole layer), those of another rank's experts computed there."""
    if ep.size == 1:
        return experts(rows, counts.tolist())
    # counts[e] rows of expert e go to its owner: each owner learns how many rows of each of its
    # experts every rank sends (recv[src][e]) before the rows themselves
    received = torch.empty_like(counts)
    _issue(received, counts, ep)
    sent, recv = torch.stack((counts, received)).view(2, ep.size, -1).tolist()  # one host sync
    send_rows, recv_rows = [sum(s) for s in sent], [sum(r) for r in recv]
    by_expert = [list(col) for col in zip(*recv, strict=True)]  # by_expert[e][src]
    # the rows arrive grouped by sender; each expert runs once on its rows from every rank
    mine = _transpose_chunks(_AllToAll.apply(rows, ep, send_rows, recv_rows), recv)
    out = _transpose_chunks(experts(mine, [sum(e) for e in by_expert]), by_expert)
    return _AllToAll.apply(out, ep, recv_rows, send_rows)
