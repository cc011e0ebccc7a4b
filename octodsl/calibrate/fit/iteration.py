"""Steps 8 and 9: what only whole iterations show. Each candidate is scored by simulating the
calibration runs and comparing their iteration times with the measured ones.

Both search a fixed grid rather than call scipy's minimize_scalar: the fitted values are
printed and stored as grid points (an oversubscription of 0 prints as none), and bounded Brent,
tried in their place, moved the printed calibration on all 7 synthetic scenarios tried
(timeline: off-grid factors) and on 5 of them (oversubscription: never exactly 0)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

import numpy as np

from ...costs.profile import ProfileCalibration
from ...costs.table import CostTable
from ...sim import SimCosts, SimProgram, simulate
from .compute import OVERSUBSCRIPTION
from .observations import Run
from .report import FitReport

TIMELINE = [round(x, 3) for x in np.arange(0.85, 1.1501, 0.005)]
"""Factors on the op costs the iteration match tries: within 15% of the op fit."""


def fit_oversubscription(
    table: CostTable, runs: Sequence[Run], programs: Sequence[SimProgram], cal: ProfileCalibration
) -> ProfileCalibration:
    """Step 8: the oversubscription slowdown whose simulated iteration times match the runs
    best (the least of those that tie); `programs`: the runs' plans, compiled."""
    x = min(OVERSUBSCRIPTION, key=lambda x: (iteration_loss(table, runs, programs, cal, x), x))
    return cal.model_copy(update={"oversubscription": float(x)})


def fit_timeline(
    table: CostTable,
    runs: Sequence[Run],
    programs: Sequence[SimProgram],
    cal: ProfileCalibration,
    report: FitReport,
) -> ProfileCalibration:
    """Step 9: one factor on every op's cost (scale and overhead, all kinds) whose simulated
    iteration times match the runs best (the nearest 1 of those that tie). The op fit turns
    each measured duration into work at the concurrency the trace shows; the simulator turns
    work back into durations at the concurrency of its own timeline, which runs tighter than a
    real one (ops that vary, a process waiting for a core), so op-fitted costs alone simulated
    the calibration's own runs 2-3% short on average (docs/calibration.md, "Why held-out plans
    were off")."""

    def scaled(c: float) -> ProfileCalibration:
        return cal.model_copy(
            update={
                "op_scale": {k: v * c for k, v in cal.op_scale.items()},
                "op_overhead": {k: v * c for k, v in cal.op_overhead.items()},
            }
        )

    c = min(
        TIMELINE,
        key=lambda c: (
            iteration_loss(table, runs, programs, scaled(c), cal.oversubscription),
            abs(c - 1),
        ),
    )
    report.timeline = float(c)
    return scaled(c)


def reproduction(
    table: CostTable, runs: Sequence[Run], programs: Sequence[SimProgram], cal: ProfileCalibration
) -> list[dict]:
    """How well the calibration reproduces its own runs: measured and simulated iteration
    time of each."""
    return [
        {
            "plan": r.name,
            "devices": r.plan.devices,
            "microbatches": r.plan.microbatches,
            "measured": r.trace.iteration_time,
            "simulated": sim_t,
            "error": (sim_t - r.trace.iteration_time) / r.trace.iteration_time,
        }
        for r, sim_t in zip(runs, simulated(table, runs, programs, cal), strict=True)
    ]


def simulated(
    table: CostTable, runs: Sequence[Run], programs: Sequence[SimProgram], cal: ProfileCalibration
) -> list[float]:
    """Each run's simulated iteration time (the span of its ops, when its trace has no period);
    `programs`: the runs' plans, compiled."""
    tc = cal.table_calibration()
    assert tc.link is not None, "a profile's calibration has its fitted link"
    calibrated = replace(table, calibration=tc)
    out = []
    for r, program in zip(runs, programs, strict=True):
        sim = simulate(program, SimCosts.from_table(calibrated, r.plan), tc.link)
        out.append(sim.iteration_time if r.trace.has_period else sim.pipeline_time)
    return out


def iteration_loss(
    table: CostTable,
    runs: Sequence[Run],
    programs: Sequence[SimProgram],
    cal: ProfileCalibration,
    oversubscription: float,
) -> float:
    """Mean squared relative error of the runs' simulated iteration times."""
    cal = cal.model_copy(update={"oversubscription": oversubscription})
    return float(
        np.mean(
            [
                ((t - r.trace.iteration_time) / r.trace.iteration_time) ** 2
                for r, t in zip(runs, simulated(table, runs, programs, cal), strict=True)
            ]
        )
    )
