"""fit(): the package's steps in order, each on what the steps before it found, into the
profile's calibration."""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from datetime import datetime, timezone

from ...costs.profile import ProfileCalibration
from ...costs.table import CostTable
from ...errors import OctoError
from ...sim import compile
from ...version import version
from .compute import fit_compute, fit_overlap, op_costs
from .iteration import fit_oversubscription, fit_timeline, reproduction
from .link import fit_dispatch, fit_link_latency
from .memory import fit_memory
from .observations import Run, collect
from .report import FitReport
from .step import device_params, fit_step_overhead, fit_update

Progress = Callable[[str], None]


def fit(
    table: CostTable,
    runs: Sequence[Run],
    *,
    probe: Sequence[tuple[int, float]] = (),
    cpus: int | None = None,
    source: str = "",
    progress: Progress | None = None,
) -> ProfileCalibration:
    """The calibration of `table` (a profile's, uncalibrated) from measured runs, with the
    link probe of the calibration launch when there was one; `cpus`: the machine's cores
    (default: this one's)."""
    if table.calibration is not None:
        raise OctoError(
            "fit the calibration on the profile's own costs (the profile without "
            "its calibration section)"
        )
    if not runs:
        raise OctoError("calibration needs at least one measured run")
    report = FitReport()
    say = progress or (lambda _msg: None)
    Pmax = max(r.plan.devices for r in runs)
    cpus = cpus or os.cpu_count() or 1
    timed = [(r, step) for r in runs for step in r.trace.timed]

    say("collecting ops")
    obs = collect(table, runs, Pmax)
    report.ops = len(obs.ops)
    say("fitting compute")
    compute = fit_compute(obs.ops, cpus, Pmax, report)
    dispatch = fit_dispatch(obs.gaps, compute.rates(Pmax), report)
    link = fit_link_latency(probe, obs.gaps, obs.handoffs, report)
    compute = fit_overlap(obs.ops, link, compute, cpus, Pmax, report)
    scale, overhead = op_costs(compute.params, dispatch)
    say("fitting the optimizer step")
    params = {id(r): device_params(table, r.plan) for r in runs}
    per_param = fit_update(
        [(params[id(r)], step) for r, step in timed], compute.rates(Pmax), Pmax, report
    )
    say("fitting the step overhead")
    step_overhead = fit_step_overhead([step for _, step in timed], report)
    act_w_extra = fit_memory(table, runs)
    if act_w_extra is not None:
        report.memory = {"act_w_extra": act_w_extra}
    cal = ProfileCalibration(
        created=datetime.now(timezone.utc).isoformat(),
        source=source,
        octodsl_version=version(),
        processes=sorted({r.plan.devices for r in runs}),
        link=link,
        # str keys, each an OpKind's value: pydantic checks them against the fields' Literal
        op_scale=scale,  # type: ignore[arg-type]
        op_overhead=overhead,  # type: ignore[arg-type]
        update_per_param=per_param,
        step_overhead=step_overhead,
        cores=compute.sharing.cores,
        contention=compute.sharing.contention,
        overlap_slowdown=compute.overlap,
        oversubscription=compute.sharing.oversubscription,
        act_w_extra=act_w_extra or {},
    )
    programs = [compile(r.plan) for r in runs]
    oversubscribed = cal.cores is not None and Pmax > cal.cores
    if oversubscribed:
        say("fitting the oversubscription slowdown")
        cal = fit_oversubscription(table, runs, programs, cal)
    say("matching the iteration times")
    cal = fit_timeline(table, runs, programs, cal, report)
    if oversubscribed:
        cal = fit_oversubscription(table, runs, programs, cal)
    report.runs = reproduction(table, runs, programs, cal)
    return cal.model_copy(update={"fit": report.as_json()})
