"""A lower bound on the makespan, and the data-parallel collectives' times (ring algorithms)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from ..costs.levers import Zero
from ..costs.table import Link, StageCost
from .program import SimProgram


def lower_bound(
    program: SimProgram,
    costs: Sequence[StageCost],
    total_work: float,
    cut_time: np.ndarray,
    layer_work: float | None = None,
) -> float:
    """The largest of: all compute spread evenly over the devices; the heaviest single layer
    (F + B + W, or the heaviest stage when layers are unknown) times the micro-batches, since a
    layer cannot be split; one micro-batch's longest path through the stages, messages between
    this plan's devices included."""
    heaviest = layer_work if layer_work is not None else max(map(_work, costs, program.split))
    return max(
        total_work / program.devices,
        heaviest * program.microbatches,
        single_microbatch_path(program, costs, cut_time),
    )


# The path follows the dependency rule: it mirrors octodsl.dag.producers (F after the F before
# it, B after its F and the B after it, W after its B); tests/sim/test_bounds.py checks it equal.
def single_microbatch_path(
    program: SimProgram, costs: Sequence[StageCost], cut_time: np.ndarray
) -> float:
    """Forwards down the stages, input-gradient backwards up, then the last W (or the fused BW
    of each stage on the way up)."""
    S = program.num_stages
    sd = program.stage_device
    hop = [cut_time[s] if sd[s] != sd[s + 1] else 0.0 for s in range(S - 1)]
    t = sum(c.f for c in costs) + sum(hop)
    longest = 0.0
    for s in range(S - 1, -1, -1):
        c = costs[s]
        t += c.b if program.split[s] else c.fused_backward
        longest = max(longest, t + (c.w if program.split[s] else 0.0))
        if s > 0:
            t += hop[s - 1]
    return longest


def _work(c: StageCost, split: bool) -> float:
    """A stage's seconds per micro-batch, its backward as it runs (split or fused)."""
    return c.f + (c.b + c.w if split else c.fused_backward)


def ring_time(
    nbytes: np.ndarray, ranks: int, link: Link | Sequence[Link], passes: int
) -> np.ndarray:
    """`passes` times round a ring of `ranks` copies: each pass is ranks - 1 steps, each step
    moving nbytes / ranks to the next copy (so a pass moves (ranks - 1) / ranks x nbytes per
    copy, and costs (ranks - 1) latencies). `link`: one for all, or one per element (each
    device's group on its own link, links.py). Each element is `Link.ring`'s, float for float:
    the same operations in the same order, over arrays (a simulation takes a few of these per
    stage, where calling `Link.ring` for each element was a tenth of its Python)."""
    b = np.asarray(nbytes, float)
    if ranks <= 1:
        return np.zeros(len(b))
    if isinstance(link, Link):
        latency, bandwidth = np.full(len(b), link.latency), np.full(len(b), link.bandwidth)
    else:
        if len(link) != len(b):
            raise ValueError(f"{len(link)} links for {len(b)} byte counts")
        latency = np.array([k.latency for k in link], float)
        bandwidth = np.array([k.bandwidth for k in link], float)
    t = latency.copy()  # Link.time: the latency alone without a bandwidth
    moving = ~(bandwidth <= 0)
    t[moving] = latency[moving] + (b[moving] / ranks) / bandwidth[moving]
    return passes * (ranks - 1) * t


def ring_allreduce_time(nbytes: np.ndarray, ranks: int, link: Link | Sequence[Link]) -> np.ndarray:
    """A ring all-reduce: a reduce-scatter pass, then an all-gather pass."""
    return ring_time(nbytes, ranks, link, 2)


def ring_all_gather_time(nbytes: np.ndarray, ranks: int, link: Link | Sequence[Link]) -> np.ndarray:
    """A ring all-gather: each copy sends its 1 / ranks shard round the ring (the other half of
    an all-reduce, the same time as a reduce-scatter)."""
    return ring_time(nbytes, ranks, link, 1)


def ring_reduction_time(
    nbytes: np.ndarray,
    ranks: int,
    link: Link | Sequence[Link],
    zero: int,
    reduce_scatter: bool = True,
) -> np.ndarray:
    """The gradient reduction ZeRO stage `zero` runs (`Zero.reduction`): a ring all-reduce, or
    under a sharded optimizer whose runtime reduce-scatters (`reduce_scatter`) a ring
    reduce-scatter."""
    return ring_time(nbytes, ranks, link, Zero(zero).reduction_passes(reduce_scatter))
