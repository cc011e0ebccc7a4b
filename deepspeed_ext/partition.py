"""Which layers each stage of a plan runs: the plan's explicit partition, or, for a plan that
names no layers (one imported from a PyTorch CSV), a split of the model's layers over its
stages balanced by per-layer costs."""

from __future__ import annotations

from collections.abc import Sequence

from ..plan import Plan
from .errors import PlanLaunchError


def stage_layers(plan: Plan, num_layers: int,
                 layer_costs: Sequence[float] | None = None) -> list[range]:
    """Layer indices of each stage. Raises PlanLaunchError when the partition does not fit the
    model, or when the plan names no layers and no costs are given to balance them."""
    stages = plan.stages
    if all(st.abstract for st in stages):
        if layer_costs is None:
            raise PlanLaunchError(
                f"the plan names no layers for its {len(stages)} stages; give a model "
                "(--model) so that its layers can be split over the stages by cost")
        if len(layer_costs) != num_layers:
            raise PlanLaunchError(f"{len(layer_costs)} layer costs for a model of {num_layers} layers")
        return balanced_split(layer_costs, len(stages))
    if any(st.abstract for st in stages):
        raise PlanLaunchError("the plan's partition names layers for some stages but not all")
    out, expect = [], 0
    for i, st in enumerate(stages):
        if st.first != expect or st.last < st.first:
            raise PlanLaunchError(
                f"stage {i} runs layers {st.first}..{st.last}, but the stages before it end at "
                f"layer {expect - 1}: a partition must cover the model's layers in order")
        out.append(range(st.first, st.last + 1))
        expect = st.last + 1
    if expect != num_layers:
        raise PlanLaunchError(f"the plan's partition covers layers 0..{expect - 1}, but the model "
                              f"has {num_layers} layers (0..{num_layers - 1})")
    return out


def balanced_split(costs: Sequence[float], parts: int) -> list[range]:
    """Consecutive non-empty ranges minimising the most expensive one (exact DP)."""
    n = len(costs)
    if parts > n:
        raise PlanLaunchError(f"cannot split {n} layers over {parts} stages")
    prefix = [0.0]
    for c in costs:
        prefix.append(prefix[-1] + c)
    # best[k][i]: the least possible maximum over k parts of the first i layers; cut: where
    # the k-th part starts
    best = [[float("inf")] * (n + 1) for _ in range(parts + 1)]
    cut = [[0] * (n + 1) for _ in range(parts + 1)]
    best[0][0] = 0.0
    for k in range(1, parts + 1):
        for i in range(k, n - (parts - k) + 1):
            for j in range(k - 1, i):
                v = max(best[k - 1][j], prefix[i] - prefix[j])
                if v < best[k][i]:
                    best[k][i], cut[k][i] = v, j
    out, i = [], n
    for k in range(parts, 0, -1):
        out.append(range(cut[k][i], i))
        i = cut[k][i]
    return out[::-1]


def describe_split(ranges: Sequence[range], names: Sequence[str], costs: Sequence[float]) -> str:
    """One line per stage: its layers, their kinds and the stage's share of the cost."""
    total = sum(costs) or 1.0
    lines = []
    for s, r in enumerate(ranges):
        share = sum(costs[i] for i in r) / total
        lines.append(f"  stage {s}: layers {r.start}..{r.stop - 1} "
                     f"({' '.join(names[i] for i in r)}) {100 * share:.1f}% of the cost")
    return "\n".join(lines)
