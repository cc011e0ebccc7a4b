"""Steps 2 and 3: the dispatch between a device's ops, and the link's latency and bandwidth."""

from __future__ import annotations

import statistics
from collections.abc import Sequence

import numpy as np

from ...costs.devices import get_link
from ...costs.profile import FittedLink
from .report import FitReport


def fit_dispatch(
    gaps: list[tuple[float, np.ndarray]], rates: np.ndarray, report: FitReport
) -> float:
    """Step 2: the dispatch between ops (observations.Observations.gaps), as work at the rate
    the device had meanwhile: the median."""
    report.dispatch = statistics.median(float(h @ rates) for _, h in gaps) if gaps else 0.0
    return report.dispatch


def fit_link(probe: Sequence[tuple[int, float]]) -> tuple[float, float] | None:
    """(latency, bandwidth) by least squares over the probe's (bytes, seconds) (the smallest
    size, which pays for connection warm-up, left out when there are enough); None without a
    usable probe."""
    pts = sorted(probe)
    if len(pts) >= 4:
        pts = pts[1:]
    if len(pts) < 2:
        return None
    x = np.array([p[0] for p in pts], float)
    y = np.array([p[1] for p in pts], float)
    slope, icpt = np.polyfit(x, y, 1)
    if slope <= 0:
        return None
    return max(float(icpt), 0.0), float(1.0 / slope)


def fit_link_latency(
    probe: Sequence[tuple[int, float]],
    gaps: list[tuple[float, np.ndarray]],
    handoffs: list[tuple[float, float]],
    report: FitReport,
) -> FittedLink:
    """Step 3: the link's bandwidth from the probe (else loopback's), its latency from the
    hand-offs less the median dispatch gap (else the probe's, else loopback's)."""
    lb = fit_link(probe)
    report.probe = [(n, t) for n, t in probe]
    bandwidth = lb[1] if lb else get_link("loopback").bandwidth
    if lb:
        report.probe_latency = lb[0]
    dispatch_wall = statistics.median(g for g, _ in gaps) if gaps else 0.0
    if handoffs:
        latency = max(
            0.0, statistics.median(t - b / bandwidth for t, b in handoffs) - dispatch_wall
        )
    elif lb:
        latency = lb[0]
    else:
        latency = get_link("loopback").latency
        report.notes.append("no message hand-off seen and no probe: the loopback link's latency")
    report.handoffs = len(handoffs)
    return FittedLink(latency=latency, bandwidth=bandwidth)
