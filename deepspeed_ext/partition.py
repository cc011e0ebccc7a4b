"""Which layers each stage of a plan runs: `octodsl.partition.plan_partition`, the split the
simulator costs too (for a plan that names no layers, the model's layers balanced over its
stages by per-layer costs), and the line per stage the executor prints about it."""

from __future__ import annotations

from collections.abc import Sequence

from ..partition import plan_partition
from ..plan import Plan, PlanError
from .errors import PlanLaunchError


def stage_layers(
    plan: Plan, num_layers: int, layer_costs: Sequence[float] | None = None
) -> list[range]:
    """Layer indices of each stage. Raises PlanLaunchError when the partition does not fit the
    model, or when the plan names no layers and no costs are given to balance them."""
    try:
        return [range(a, b + 1) for a, b in plan_partition(plan, num_layers, layer_costs)]
    except PlanError as e:
        raise PlanLaunchError(e.message) from None


def default_layer_costs(spec) -> list[float]:
    """Per-layer F + B + W seconds of a model spec at its micro-batch shape, to split a plan
    whose stages name no layers: the costs `octodsl simulate --device cpu` (H100 with a GPU)
    takes for the same plan and model, so the executor runs the split it simulates. (A trace
    records the split that ran, which `octodsl compare` simulates whatever the costs.)"""
    import torch

    from ..costs.analytical import analytical_costs
    from ..costs.devices import get_device

    device = "H100" if torch.cuda.is_available() else "cpu"
    return analytical_costs(spec, get_device(device)).layer_work()


def describe_split(ranges: Sequence[range], names: Sequence[str], costs: Sequence[float]) -> str:
    """One line per stage: its layers, their kinds and the stage's share of the cost."""
    total = sum(costs) or 1.0
    lines = []
    for s, r in enumerate(ranges):
        share = sum(costs[i] for i in r) / total
        lines.append(
            f"  stage {s}: layers {r.start}..{r.stop - 1} "
            f"({' '.join(names[i] for i in r)}) {100 * share:.1f}% of the cost"
        )
    return "\n".join(lines)
