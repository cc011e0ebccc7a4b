"""The plan's tp x pp x dp mesh in DeepSpeed: its topology, the tp group layers are built for, and
what the gradients need across the tp group (sequence-parallel sums, a norm that counts each
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
"""

from __future__ import annotations

import torch
from deepspeed.runtime.pipe.topology import (
    PipeDataParallelTopology,
    PipeModelDataParallelTopology,
    ProcessTopology,
)
from torch import nn

from ..layers import tensor_parallel
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
    params: list[nn.Parameter], grid, tp: TpGroup, tied_copies: set[int], device: torch.device
) -> torch.Tensor:
    """The 2-norm of the whole model's gradient, on every rank of the data-parallel copy: each
    parameter counted once, a shard (`tensor_model_parallel`) on every tp rank, a replicated
    parameter on tp rank 0, a tied weight on the first rank that holds it (`tied_copies`: the
    ids of the other ranks' copies held here), summed over pipe x tp in float64."""
    total = torch.zeros((), dtype=torch.float64, device=device)
    for p in params:
        if p.grad is None or id(p) in tied_copies:
            continue
        if tp.rank == 0 or getattr(p, "tensor_model_parallel", False):
            total += p.grad.detach().double().square().sum()
    torch.distributed.all_reduce(total, group=grid.get_model_parallel_group())
    return total.sqrt()
