"""Steps 5 and 6: what a training step costs beyond its ops, the optimizer's update and the
overhead between one step's last op and the next step's first."""

from __future__ import annotations

import statistics
from collections.abc import Sequence

import numpy as np

from ...costs.table import CostTable
from ...plan import Plan
from ..measured import MeasuredStep
from .observations import occupancy, stage_layers
from .report import FitReport


def device_params(table: CostTable, plan: Plan) -> np.ndarray:
    """Parameters each device holds (the layers of its stages)."""
    out = np.zeros(plan.devices)
    for d, ls in zip(plan.stage_device(), stage_layers(table, plan), strict=True):
        out[d] += sum(l.params for l in ls)
    return out


def fit_update(
    steps: Sequence[tuple[np.ndarray, MeasuredStep]],
    rates: np.ndarray,
    Pmax: int,
    report: FitReport,
) -> float:
    """Step 5: the optimizer step's seconds per parameter, from the optimizer spans of `steps`
    ((device_params of its plan, timed step) each) as work shared between the devices updating
    at once (least squares through the origin); 0 when no step has them."""
    xs, ys = [], []
    for params, step in steps:
        spans = {d: [(a, b)] for d, (a, b) in step.updates.items()}
        for d, (a, b) in step.updates.items():
            xs.append(params[d])
            ys.append(float(occupancy(spans, d, a, b, Pmax) @ rates))
    if not xs:
        report.notes.append(
            "no optimizer spans in the traces: the optimizer step is part of the step overhead"
        )
        return 0.0
    x, y = np.array(xs, float), np.array(ys)
    return float((x * y).sum() / (x * x).sum())


def fit_step_overhead(steps: Sequence[MeasuredStep], report: FitReport) -> float:
    """Step 6: the median time from a step's last op to the next step's first, less the
    optimizer's update in it (the longest device's); 0 when no step has a next one."""
    tails = []
    for step in steps:
        if step.period is None:
            continue
        tail = step.period - (step.end - step.start)
        if step.updates:
            tail -= max(b - a for a, b in step.updates.values())
        tails.append(tail)
    if not tails:
        report.notes.append(
            "no trace has a timed step followed by another: no step overhead fitted"
        )
        return 0.0
    return max(0.0, statistics.median(tails))
