"""The memory levers' arithmetic, once: what each ZeRO stage shards and which collective reduces
the gradients under it, what each recompute mode keeps from F to B and runs again in B, and
what each op allocates and releases. `CostTable.range_costs`, the simulator (sim/memory.py,
sim/dpcomm.py) and the tuner's bounds (tune/bounds.py) call these; the tuner's compiled kernels
(tune/pipeline/estimate.py, tune/pipeline/construct.py) mirror them, each mirror held equal to
its rule by a property test (tests/tune/test_mirrors.py)."""

from __future__ import annotations

from enum import IntEnum
from typing import TypeVar

import numpy as np

from ..plan import Recompute


class Zero(IntEnum):
    """A ZeRO stage over a pipeline's data-parallel copies (a plan header's `zero`)."""

    NONE = 0
    """Every copy holds all of its stages' parameters, gradients and optimizer state; the
    gradients are all-reduced after the last backward."""
    OPTIMIZER = 1
    """The optimizer state is sharded over the copies: the gradients are reduce-scattered to
    their shards, each copy updates its shard, and the updated parameters are all-gathered."""
    GRADIENTS = 2
    """The gradients are sharded too, while they accumulate: each W (or fused BW) is followed
    by a reduce-scatter of its stage's gradients (DeepSpeed's stage 2)."""

    @property
    def shards_optimizer(self) -> bool:
        """Each copy holds 1/dp of the optimizer state and updates only its shard."""
        return self >= Zero.OPTIMIZER

    @property
    def shards_gradients(self) -> bool:
        """Each copy holds 1/dp of the gradients, reduce-scattered after each W."""
        return self >= Zero.GRADIENTS

    @property
    def gathers_parameters(self) -> bool:
        """After the optimizer step, each copy all-gathers the parameters the others updated."""
        return self.shards_optimizer

    def reduction(self, reduce_scatter: bool = True) -> str:
        """The collective that reduces the gradients: 'reduce-scatter' (to their shards) when
        the optimizer state is sharded and the runtime reduce-scatters (the header's
        `reduce_scatter`: DeepSpeed's `zero_optimization.reduce_scatter`, Megatron's distributed
        optimizer), else 'allreduce' (every copy gets all of them; under ZeRO it then updates
        its shard, as DeepSpeed's BF16 optimizer does in the pipeline engine)."""
        return "reduce-scatter" if self.shards_optimizer and reduce_scatter else "allreduce"

    def reduction_passes(self, reduce_scatter: bool = True) -> int:
        """Passes round the ring of that collective: an all-reduce is a reduce-scatter and an
        all-gather (2), a reduce-scatter 1 (octodsl.costs.table.Link.ring)."""
        return 1 if self.reduction(reduce_scatter) == "reduce-scatter" else 2


Layers = TypeVar("Layers", float, np.ndarray)
"""One layer's (or stage's) figure, or an array of them, one per layer."""

RECOMPUTE_NONE, RECOMPUTE_SELECTIVE, RECOMPUTE_FULL = 0, 1, 2
"""Recompute modes as the compiled kernels read them (`RECOMPUTE_CODE`)."""

RECOMPUTE_CODE = {
    Recompute.NONE: RECOMPUTE_NONE,
    Recompute.SELECTIVE: RECOMPUTE_SELECTIVE,
    Recompute.FULL: RECOMPUTE_FULL,
}


def recomputed(
    mode: Recompute, f: Layers, act: Layers, sel_f: Layers, sel_act: Layers, input_bytes: float
) -> tuple[Layers | float, Layers]:
    """(seconds B runs again, bytes F keeps until B) of layers of forward seconds `f` and
    activation bytes `act` recomputing `mode`: full runs the whole forward again and keeps only
    the input (`input_bytes`, at most `act`); selective runs again the parts it drops
    (`sel_f` seconds, `sel_act` bytes); none keeps everything. What F does not keep, B brings
    back when it starts (`StageCost.act_b = act - kept`). Elementwise on arrays of layers too."""
    if mode is Recompute.FULL:
        return f, np.minimum(act, input_bytes)
    if mode is Recompute.SELECTIVE:
        return sel_f, act - sel_act
    return 0.0, act


def op_bytes(
    act: np.ndarray, act_w: np.ndarray, act_b: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """(allocated when an op starts, released when it ends), per stage (rows) and kind code
    (columns: F, B, W, BW), of stages whose F keeps `act`, whose W needs `act_w` of it and whose
    B brings back `act_b` by recompute: F allocates what it keeps; B allocates what it brings
    back and releases all but the part for W; W releases that; a fused BW releases all."""
    none = np.zeros_like(act)
    alloc = np.stack([act, act_b, none, act_b], axis=1)
    release = np.stack([none, act + act_b - act_w, act_w, act + act_b], axis=1)
    return alloc, release


def held_change(kind: int, act: float, act_w: float) -> float:
    """Bytes an op of kind code `kind` (F, B, W, BW) leaves held when it ends, net of what it
    released: `op_bytes`' allocation less its release (what B brings back by recompute comes
    and goes within it)."""
    return (act, -(act - act_w), -act_w, -act)[kind]
