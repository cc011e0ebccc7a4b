"""The plan's tp x pp x dp mesh in DeepSpeed: its topology, the tp and ep groups layers are built
for, and what the gradients need across them (sequence-parallel sums, a norm that counts each
parameter once).

DeepSpeed's `PipeModelDataParallelTopology(num_pp, num_mp, num_dp)` has the axes
['pipe', 'data', 'model'], laid out row-major, so the model (tp) axis is the fastest, then data,
then pipe: rank = (pipe x dp + data) x tp + model, which is Megatron-LM's order and
`octodsl.mesh.Mesh.rank` (tests/deepspeed_ext/test_mesh.py checks every coordinate). At tp 1 the
executor keeps DeepSpeed's `PipeDataParallelTopology` (the same ranks; its checkpoint file names
have no model axis), so tp 1 runs exactly as before.

The mpu DeepSpeed is given is the PipelineModule's own grid (`PipelineParallelGrid`), which
already has what DeepSpeed asks of one: `get_data_parallel_*`, `get_pipe_parallel_*`,
`get_tensor_model_parallel_*` (= `get_slice_parallel_*`: the tp group of this rank's pipe and
data coordinate, which the grid creates for every coordinate) and `get_model_parallel_*`, which in
DeepSpeed's meaning is every rank of this data-parallel copy (pipe x tp), the group over which
gradient norms are summed. ZeRO-1's and the bf16 optimizer's norms count a parameter on tp rank 0,
or on every tp rank when it is marked `tensor_model_parallel` (a shard), and skip the second
copies of tied weights (`ds_pipe_replicated`): with the layers' marks that counts each
parameter once. DeepSpeed's plain fp32 clipping (`clip_grad_norm_`) instead keeps the
unmarked parameters of the rank whose pipe x tp index is 0 only, which at tp > 1 drops every
replicated parameter but the first stage's; the engine then clips with `grad_norm` here.

Expert parallelism (`ep N`) is carved out of the data-parallel copies as `octodsl.mesh` lays it
out (Megatron-core's order): the ep group of a rank is the `ep` consecutive dp copies of its
pipeline device and tp rank that include it (copies b x ep .. b x ep + ep - 1), and its
expert-data-parallel group the dp / ep copies holding the same experts (copies i, i + ep, ...).
`expert_groups` creates both (every rank creates every group, in the same order) and registers
this rank's in DeepSpeed's own tables (`deepspeed.utils.groups`, under DeepSpeed MoE's name
`ep_size_N`), where DeepSpeed looks an expert parameter's group up by its `group_name`: the
engine's broadcast of the initial weights and its expert-gradient reduction then use them.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from deepspeed.runtime.pipe.topology import (
    PipeDataParallelTopology,
    PipeModelDataParallelTopology,
    ProcessTopology,
)
from torch import nn

from ..layers import tensor_parallel
from ..layers.expert_parallel import EpGroup
from ..layers.tensor_parallel import TpGroup
from ..plan import Plan


def topology(plan: Plan) -> ProcessTopology:
    """The plan's mesh as DeepSpeed's topology (Megatron's rank order)."""
    h = plan.header
    if h.tp == 1:
        return PipeDataParallelTopology(num_pp=plan.devices, num_dp=h.dp)
    return PipeModelDataParallelTopology(num_pp=plan.devices, num_mp=h.tp, num_dp=h.dp)


def global_rank(grid, pipe: int, data: int, tp: int) -> int:
    """The rank at (pipeline device, data-parallel copy, tp rank) of the grid."""
    if grid.get_slice_parallel_world_size() == 1:
        return grid.stage_to_global(stage_id=pipe, data=data)
    return grid.stage_to_global(stage_id=pipe, data=data, model=tp)


def tp_group(grid, sp: bool) -> TpGroup:
    """This rank's tp group in the grid (the grid's slice group of its pipe and data
    coordinate), with sequence parallelism as the plan says; size 1 without tp."""
    size = grid.get_slice_parallel_world_size()
    if size == 1:
        return TpGroup()
    return TpGroup(size, grid.get_slice_parallel_rank(), grid.get_slice_parallel_group(), sp)


def expert_rank_groups(
    pipe: int, dp: int, tp: int, ep: int, rank_of: Callable[[int, int, int], int]
) -> tuple[list[list[int]], list[list[int]]]:
    """The ranks of every ep group and of every expert-data-parallel group of a pipe x dp x tp
    mesh (`rank_of(pipe, data, tp)`: a coordinate's rank), in the order every rank creates them:
    per pipeline device and tp rank, the ep groups of consecutive copies (b x ep + i, i < ep),
    then the copies holding the same experts (i + b x ep, b < dp / ep)."""
    blocks = [
        [[rank_of(p, b * ep + i, t) for i in range(ep)] for b in range(dp // ep)]
        for p in range(pipe)
        for t in range(tp)
    ]
    return (
        [ranks for block in blocks for ranks in block],
        [list(ranks) for block in blocks for ranks in zip(*block, strict=True)],
    )


def expert_groups(grid, ep: int) -> EpGroup:
    """This rank's ep group (size 1 without ep), after creating every ep and expert-data-parallel
    group of the grid and registering this rank's in DeepSpeed's tables (see above)."""
    from deepspeed.utils import groups

    tables = (
        groups._EXPERT_PARALLEL_GROUP,
        groups._EXPERT_PARALLEL_GROUP_RANKS,
        groups._EXPERT_DATA_PARALLEL_GROUP,
        groups._EXPERT_DATA_PARALLEL_GROUP_RANKS,
    )
    for table in tables:  # an earlier engine's groups (released_groups destroys them)
        table.clear()
    if ep == 1:
        return EpGroup()
    ep_ranks, data_ranks = _grid_expert_rank_groups(grid, ep)
    me, name = torch.distributed.get_rank(), EpGroup(ep).group_name
    mine = EpGroup()
    for ranks in ep_ranks:
        group = torch.distributed.new_group(ranks)
        if me in ranks:
            mine = EpGroup(ep, ranks.index(me), group)
            groups._EXPERT_PARALLEL_GROUP[name] = group
            groups._EXPERT_PARALLEL_GROUP_RANKS[name] = ranks
    for ranks in data_ranks:
        group = torch.distributed.new_group(ranks)
        if me in ranks:
            groups._EXPERT_DATA_PARALLEL_GROUP[name] = group
            groups._EXPERT_DATA_PARALLEL_GROUP_RANKS[name] = ranks
    return mine


def _grid_expert_rank_groups(grid, ep: int) -> tuple[list[list[int]], list[list[int]]]:
    return expert_rank_groups(
        grid.get_pipe_parallel_world_size(),
        grid.get_data_parallel_world_size(),
        grid.get_slice_parallel_world_size(),
        ep,
        lambda p, d, t: global_rank(grid, p, d, t),
    )


def expert_lane_group(grid, ep: int) -> Any:
    """This rank's second ep group (the same ranks as its ep group), after creating one for every
    ep group of the grid in the same order on every rank: the group the forward lane of an
    overlap group issues its all-to-alls on (deepspeed_ext/lanes.py)."""
    me, mine = torch.distributed.get_rank(), None
    for ranks in _grid_expert_rank_groups(grid, ep)[0]:
        group = torch.distributed.new_group(ranks)
        if me in ranks:
            mine = group
    return mine


def expert_params(params) -> list[nn.Parameter]:
    """The routed-expert parameters (marked by the ep MoE layer as DeepSpeed MoE marks its own:
    `allreduce = False`), which differ between the ranks of an ep group."""
    return [p for p in params if getattr(p, "allreduce", True) is False]


def sequence_parallel_params(params) -> list[nn.Parameter]:
    """The replicated parameters that under sp see only this rank's sequence slice (marked
    `sequence_parallel` by the layers): their gradients are partial sums over the tp group."""
    return [p for p in params if getattr(p, "sequence_parallel", False)]


def reduce_sequence_parallel_grads(params: list[nn.Parameter], tp: TpGroup, bf16: bool) -> None:
    """Sum the gradients of `params` over the tp group (after the step's last W, before the
    data-parallel reduction and the optimizer): the fp32 gradients the bf16 optimizer keeps, or
    `.grad`. Every rank of the group holds the same stages, so they run the same all-reduces."""
    if not bf16:
        tensor_parallel.all_reduce_sequence_parallel_grads(params, tp)
        return
    for p in params:
        grad = getattr(p, "_hp_grad", None)
        if grad is not None:
            torch.distributed.all_reduce(grad, group=tp.group)


def grad_norm(
    params: list[nn.Parameter],
    grid,
    tp: TpGroup,
    tied_copies: set[int],
    device: torch.device,
    ep: EpGroup | None = None,
) -> torch.Tensor:
    """The 2-norm of the whole model's gradient, on every rank of the data-parallel copy: each
    parameter counted once, a shard (`tensor_model_parallel`) on every tp rank, a replicated
    parameter on tp rank 0, a tied weight on the first rank that holds it (`tied_copies`: the
    ids of the other ranks' copies held here), summed over pipe x tp in float64; with `ep`, the
    routed experts (`expert_params`) summed over the ep group first, whose ranks hold different
    experts (the copies of an ep group then agree, as every copy's gradients are reduced)."""
    total = torch.zeros((), dtype=torch.float64, device=device)
    experts = torch.zeros((), dtype=torch.float64, device=device)
    expert_ids = {id(p) for p in expert_params(params)} if ep is not None and ep.size > 1 else ()
    for p in params:
        if p.grad is None or id(p) in tied_copies:
            continue
        if tp.rank == 0 or getattr(p, "tensor_model_parallel", False):
            part = p.grad.detach().double().square().sum()
            if id(p) in expert_ids:
                experts += part
            else:
                total += part
    if expert_ids:
        assert ep is not None
        torch.distributed.all_reduce(experts, group=ep.group)
        total += experts
    torch.distributed.all_reduce(total, group=grid.get_model_parallel_group())
    return total.sqrt()
