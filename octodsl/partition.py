"""Cutting a model's layers into consecutive stages.

Each function returns the stages as (first, last) layer index pairs, inclusive, covering
layers 0..n-1 in order, no stage empty (so there must be at least as many layers as stages).
`plan_partition` is the one place a plan's stages get their layers, for the simulator's costs
and the executor alike.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from itertools import accumulate, pairwise

import numpy as np

from .errors import OctoError
from .models.pattern import transformer_layers
from .plan import Plan, PlanError

Range = tuple[int, int]
"""A stage's first and last layer, inclusive."""


def plan_partition(
    plan: Plan, num_layers: int, work: Sequence[float] | None = None
) -> list[tuple[int, int]]:
    """The (first, last) layers of each stage of `plan` on a model of `num_layers` layers.

    A plan that names its layers must cover exactly the model's, in order. A plan whose stages
    name none (`stages N`, an imported PyTorch schedule) gets the model's layers split by
    `balance_time(work)`, `work` being each layer's F + B + W seconds: `octodsl simulate` costs
    and the executor runs this same split. Raises PlanError when the partition does not fit the
    model, or when an abstract plan comes without `work`."""
    stages = plan.stages
    if all(st.abstract for st in stages):
        if work is None:
            raise PlanError(
                f"the plan names no layers for its {len(stages)} stages; give a model "
                "so that its layers can be split over the stages by cost"
            )
        if len(work) != num_layers:
            raise PlanError(f"{len(work)} layer costs for a model of {num_layers} layers")
        if num_layers < len(stages):
            raise PlanError(
                f"the plan's {len(stages)} stages need at least {len(stages)} layers, "
                f"but the model has {num_layers}"
            )
        return balance_time(work, len(stages))
    if any(st.abstract for st in stages):
        raise PlanError("the plan's partition names layers for some stages but not all")
    expect = 0
    for i, st in enumerate(stages):
        first, last = st.bounds
        if first != expect or last < first:
            raise PlanError(
                f"stage {i} runs layers {first}..{last}, but the stages before "
                f"it end at layer {expect - 1}: a partition must cover the model's "
                "layers in order"
            )
        expect = last + 1
    if expect != num_layers:
        raise PlanError(
            f"the plan's partition covers {expect} layers (0..{expect - 1}), but the "
            f"model has {num_layers} (0..{num_layers - 1})"
        )
    return [st.bounds for st in stages]


def equal_layers(n_layers: int, n_stages: int) -> list[tuple[int, int]]:
    """The same number of layers per stage, the first `n_layers % n_stages` stages one more
    (DeepSpeed's 'uniform' method)."""
    _check(n_layers, n_stages)
    size, extra = divmod(n_layers, n_stages)
    bounds = list(accumulate((size + (s < extra) for s in range(n_stages)), initial=0))
    return _ranges(bounds)


def megatron_layers(pattern: str, n_stages: int, ends: bool = False) -> list[tuple[int, int]]:
    """Megatron-LM's default split of a model's layers (`pattern` with its `[` and `]`): its
    layers in equal counts per stage, the embedding on the first stage and the LM head on the
    last. A Megatron layer is a mixer + MLP pair of a GPT-style model and one symbol of any
    other (its hybrid models: `models.pattern.transformer_layers`). With `ends` the embedding
    and the LM head each count as one layer, so the first and last stages hold one layer fewer
    (Megatron's `--account-for-embedding-in-pipeline-split --account-for-loss-in-pipeline-split`,
    DeepSpeed's `type:transformer|embedding`, Llama 3's and ZeroBubble's layouts). Megatron asks
    the count to divide; when it does not, the first stages take one more, as `equal_layers`."""
    body = pattern[1:-1]
    unit = 2 if transformer_layers(body) else 1
    units = len(body) // unit + (2 if ends else 0)
    if units < n_stages:
        raise OctoError(
            f"{units} Megatron layers cannot fill {n_stages} stages (a stage needs a layer)"
        )
    # bounds in units; with `ends` unit 0 is the embedding and the last unit the LM head
    cuts = [a for a, _ in equal_layers(units, n_stages)] + [units]
    shift = 1 if ends else 0

    def layer(u: int) -> int:  # the first pattern index of unit u
        return min(max(1 + (u - shift) * unit, 0 if u == 0 else 1), len(pattern) - 1)

    ranges = [(layer(a), layer(b) - 1) for a, b in pairwise(cuts)]
    ranges[0] = (0, ranges[0][1])
    ranges[-1] = (ranges[-1][0], len(pattern) - 1)
    return ranges


def balance_parameters(params_per_layer: Sequence[int], n_stages: int) -> list[tuple[int, int]]:
    """DeepSpeed's 'parameters' method (deepspeed.runtime.utils.partition_balanced, 0.19.8):
    the cuts that minimise the spread (largest minus smallest) of the stages' parameter counts,
    ties broken as DeepSpeed breaks them."""
    _check(len(params_per_layer), n_stages)
    return list(_balance_parameters(tuple(params_per_layer), n_stages))


def balance_time(cost_per_layer: Sequence[float], n_stages: int) -> list[tuple[int, int]]:
    """The cuts that minimise the slowest stage's time (exact), and among those the sum of
    squared stage times, so the other stages are as even as the optimum allows.

    For a plan whose devices hold several stages (looped or V placement) pass each layer's
    F + B + W time: every stage is then balanced on its whole work."""
    _check(len(cost_per_layer), n_stages)
    return list(_balance_time(tuple(cost_per_layer), n_stages))


# Both balances are dynamic programs, each stage count's row of cells one numpy step over every
# (end layer, cut) pair, and pure: the cluster search asks for the same ones across its
# configurations (the layers' parameters and times depend on tp and the micro-batch, not on dp,
# ZeRO or the micro-batches), so they are kept.
@functools.lru_cache(maxsize=1024)
def _balance_parameters(params_per_layer: tuple[int, ...], n_stages: int) -> tuple[Range, ...]:
    n = len(params_per_layer)
    # float64 as DeepSpeed's: parameter counts and their sums are exact below 2**53
    prefix = np.array(list(accumulate(params_per_layer, initial=0)), dtype=np.float64)
    part = prefix[:, None] - prefix[None, :]  # part[i, k]: layers k..i-1
    ks = np.arange(n + 1)
    earlier = ks[None, :] < ks[:, None]  # k < i: DeepSpeed's `for k in range(i)`
    # hi[j][i], lo[j][i], cut[j][i]: the largest and smallest stage and the last cut of the best
    # split of layers 0..i-1 into j stages (spread = hi - lo)
    hi = np.full((n_stages + 1, n + 1), np.inf)
    lo = np.full((n_stages + 1, n + 1), np.inf)
    cut = np.zeros((n_stages + 1, n + 1), dtype=np.int64)
    hi[0, 0] = 0.0
    for j in range(1, n_stages + 1):
        top = np.maximum(hi[j - 1][None, :], part)
        bottom = np.minimum(lo[j - 1][None, :], part)
        spread = np.where(earlier, top - bottom, np.inf)
        least = spread.min(axis=1, keepdims=True)
        # DeepSpeed keeps the last k of equal spread (an infinite one too, when all are)
        k = n - np.argmax((earlier & (spread == least))[:, ::-1], axis=1)
        rows = np.arange(j, n + 1)  # DeepSpeed fills the cells of j <= i only
        hi[j, rows] = top[rows, k[rows]]
        lo[j, rows] = bottom[rows, k[rows]]
        cut[j, rows] = k[rows]
    bounds = [n]
    for j in range(n_stages, 0, -1):
        bounds.append(int(cut[j, bounds[-1]]))
    return tuple(_ranges(bounds[::-1]))


@functools.lru_cache(maxsize=1024)
def _balance_time(cost_per_layer: tuple[float, ...], n_stages: int) -> tuple[Range, ...]:
    n = len(cost_per_layer)
    prefix = list(accumulate(cost_per_layer, initial=0.0))
    span = np.array(prefix)[:, None] - np.array(prefix)[None, :]  # span[i, k]: layers k..i-1
    cap = _min_bottleneck(span, prefix, n_stages)
    ks = np.arange(n + 1)
    earlier = ks[None, :] < ks[:, None]
    # a stage ends at i and starts after its cut k, scanning k down from i - 1 while the stage
    # stays within `cap`: the cuts above the highest k < i whose stage exceeds it
    over = np.where(earlier & (span > cap), ks[None, :], -1).max(axis=1)
    within = earlier & (ks[None, :] > over[:, None])
    square = span**2
    # cost[j][i]: least sum of squares for layers 0..i-1 in j stages, none above `cap`
    cost = np.full((n_stages + 1, n + 1), np.inf)
    cut = np.zeros((n_stages + 1, n + 1), dtype=np.int64)
    cost[0, 0] = 0.0
    for j in range(1, n_stages + 1):
        c = np.where(within & (ks[None, :] >= j - 1), cost[j - 1][None, :] + square, np.inf)
        least = c.min(axis=1)
        # the largest k of the least cost (the scan keeps the first it meets going down)
        k = n - np.argmax((c == least[:, None])[:, ::-1], axis=1)
        rows = np.arange(j, n - (n_stages - j) + 1)
        rows = rows[np.isfinite(least[rows])]
        cost[j, rows] = least[rows]
        cut[j, rows] = k[rows]
    bounds = [n]
    for j in range(n_stages, 0, -1):
        bounds.append(int(cut[j, bounds[-1]]))
    return tuple(_ranges(bounds[::-1]))


def _min_bottleneck(span: np.ndarray, prefix: list[float], n_stages: int) -> float:
    """The least possible slowest-stage time: binary search over the sums of consecutive
    layers (`span`; one of them is the optimum), each candidate checked by greedy packing."""
    n = len(prefix) - 1
    sums = span[np.tril_indices(n + 1, -1)]
    candidates = np.unique(sums[sums >= np.diag(span, -1).max()]).tolist()
    lo, hi = 0, len(candidates) - 1
    while lo < hi:
        mid = (lo + hi) // 2
        if _stages_needed(prefix, candidates[mid]) <= n_stages:
            hi = mid
        else:
            lo = mid + 1
    return float(candidates[lo])


def _stages_needed(prefix: list[float], cap: float) -> int:
    """Stages a greedy left-to-right packing needs when no stage may exceed `cap`."""
    count, start = 1, 0
    for i in range(1, len(prefix)):
        if prefix[i] - prefix[start] > cap:
            count, start = count + 1, i - 1
    return count


def _check(n_layers: int, n_stages: int) -> None:
    if n_stages < 1:
        raise OctoError("a partition needs at least one stage")
    if n_layers < n_stages:
        raise OctoError(f"{n_layers} layers cannot fill {n_stages} stages (a stage needs a layer)")


def _ranges(bounds: list[int]) -> list[tuple[int, int]]:
    return [(a, b - 1) for a, b in pairwise(bounds)]
