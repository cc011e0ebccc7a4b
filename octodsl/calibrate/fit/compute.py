"""Steps 1 and 4 (and step 8's first pass): the processor sharing and each op kind's scale and
overhead that turn the measured ops' work into their profiled seconds, and the overlap
slowdown.

Each op's work is A = occupancy @ rates (observations.py), linear in the rates, so each
candidate sharing model costs one matrix product and a small least-squares fit per kind. The
candidates are grids, searched point by point rather than by a scipy optimiser: cores and
contention are a discrete model space (a core each, or a count in steps of 0.05 core; contention
in steps of 0.01, with the oversubscription and overlap slowdowns in steps of 0.02) whose points
are what the calibration prints and stores, and the loss over it is not smooth (each point
re-weights the ops).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from ...costs.profile import FittedLink
from ...plan import OpKind
from ...sim.sharing import Sharing
from .observations import OpObs, rates
from .report import FitReport

HUBER = 0.05
"""Relative residual beyond which an op counts less (Huber weights): an op slowed by a burst of
someone else's work on a shared machine should not move the fit much."""
HUBER_ROUNDS = 4
"""Reweighting rounds of the per-kind fit: a fixed number, not iterated to the Huber minimum.
scipy's least_squares(loss="huber"), which goes there, moved the printed calibration on 2 of the
4 synthetic scenarios tried (op scales and overheads in the third digit)."""
OVERSUBSCRIPTION = [round(x, 2) for x in np.arange(0.0, 1.001, 0.02)]
"""Values of the oversubscription slowdown the fit tries."""
OVERLAP = list(np.arange(0, 1.001, 0.02))
"""Values of the overlap slowdown the fit tries."""


def fit_kinds(ops: list[OpObs], rates: np.ndarray, slowdown: float = 0.0):
    """Per kind (scale, overhead) for given rates, by iteratively reweighted least squares on
    relative residuals with Huber weights; and the mean Huber loss over all ops."""
    H = np.stack([o.hist for o in ops])
    work = H @ rates / (1 + slowdown * np.array([o.comm for o in ops]))
    base = np.array([o.base for o in ops])
    kinds = np.array([o.kind for o in ops])
    params: dict[str, tuple[float, float]] = {}
    resid = np.zeros(len(ops))
    for kind in (k.value for k in OpKind):
        sel = kinds == kind
        if not sel.any():
            continue
        x, y = base[sel], work[sel]
        rel = 1.0 / np.maximum(y, 1e-12)  # relative residuals
        # an overhead apart from the scale needs ops of clearly different sizes
        two = np.ptp(x) > 0.3 * max(float(x.mean()), 1e-12) and sel.sum() >= 3
        robust = np.ones_like(x)
        for _ in range(HUBER_ROUNDS):
            wgt = rel * np.sqrt(robust)
            s, o = weighted_line(x, y, wgt, two)
            r = (s * x + o - y) * rel
            robust = np.minimum(1.0, HUBER / np.maximum(np.abs(r), 1e-12))
        params[kind] = (s, o)
        resid[sel] = r
    a = np.abs(resid)
    loss = np.where(a <= HUBER, 0.5 * a**2, HUBER * (a - 0.5 * HUBER))
    return params, float(loss.mean()) if len(ops) else 0.0


def weighted_line(x, y, wgt, two: bool) -> tuple[float, float]:
    """y ~ s x + o by weighted least squares; through the origin when the sizes cannot tell the
    overhead from the scale (not `two`), or when either would come out negative."""
    if two:
        A = np.stack([x * wgt, wgt], axis=1)
        (s, o), *_ = np.linalg.lstsq(A, y * wgt, rcond=None)
        if o >= 0 and s > 0:
            return float(s), float(o)
    return float((x * y * wgt**2).sum() / max((x * x * wgt**2).sum(), 1e-30)), 0.0


def grid(cpus: int, Pmax: int):
    """Cores from 1 to the machine's (no more than the processes: beyond, no one waits for a
    core), in steps of 0.05 (other load leaves a fraction free), or a core each (None) unless
    the processes outnumber the machine's cores; contention 0 to 0.3."""
    top = min(cpus, Pmax)
    limited = [round(c, 2) for c in np.arange(1.0, top + 0.001, 0.05)] if Pmax > 1 else []
    cores = ([None] if Pmax <= cpus else []) + limited
    contention = [round(c, 3) for c in np.arange(0.0, 0.301, 0.01)]
    return cores, contention


@dataclass
class Compute:
    """What the op-work fit found: the sharing model, per-kind (scale, overhead), its loss and
    the overlap slowdown it assumed."""

    residual: float
    sharing: Sharing
    params: dict[str, tuple[float, float]]
    overlap: float = 0.0

    def rates(self, Pmax: int) -> np.ndarray:
        return rates(Pmax, self.sharing)


def best_sharing(
    ops: list[OpObs], cpus: int, Pmax: int, slowdown: float = 0.0, oversubscription: float = 0.0
) -> Compute:
    """The grid point (grid()) that fits the ops best; the first of those within 1e-12 of the
    least loss, so that a rounding difference does not pick a point further down the grid."""
    best = None
    cores_grid, cont_grid = grid(cpus, Pmax)
    for cores in cores_grid:
        for cont in cont_grid:
            sharing = Sharing(cores, cont, oversubscription=oversubscription)
            params, res = fit_kinds(ops, rates(Pmax, sharing), slowdown)
            if best is None or res < best.residual - 1e-12:
                best = Compute(res, sharing, params, slowdown)
    assert best is not None, "both grids have a value or more"
    if best.sharing.cores is not None and best.sharing.cores >= Pmax:  # the same as no limit
        best.sharing = Sharing(None, best.sharing.contention)
    return best


def fit_compute(ops: list[OpObs], cpus: int, Pmax: int, report: FitReport) -> Compute:
    """Step 1: processor sharing and per-op costs; with the oversubscription slowdown fitted to
    the ops too (alternating with the sharing twice) when some op ran while more devices
    computed than there are cores (step 8 settles it)."""
    found = best_sharing(ops, cpus, Pmax)
    for _ in range(2):
        cores = found.sharing.cores
        if cores is None or not any(o.hist[int(cores) + 1 :].any() for o in ops):
            break
        x = min(
            OVERSUBSCRIPTION,
            key=lambda x: fit_kinds(ops, rates(Pmax, replace(found.sharing, oversubscription=x)))[
                1
            ],
        )
        found = best_sharing(ops, cpus, Pmax, 0.0, x)
    report.residual = found.residual
    return found


def fit_overlap(
    ops: list[OpObs], link: FittedLink, compute: Compute, cpus: int, Pmax: int, report: FitReport
) -> Compute:
    """Step 4: each op's fraction under the transfers of its device's messages; when they
    overlap enough compute to tell, the overlap slowdown, alternating with the sharing."""
    for o in ops:
        under = 0.0
        for t, nbytes in o.sends:
            lo, hi = max(o.start, t), min(o.end, t + link.latency + nbytes / link.bandwidth)
            under += max(hi - lo, 0.0)
        o.comm = min(under / o.span, 1.0) if o.span > 0 else 0.0
    op_time = sum(o.span for o in ops)
    frac = sum(o.comm * o.span for o in ops) / op_time if op_time > 0 else 0.0
    report.overlap_fraction = frac
    if frac < 0.02:
        report.notes.append(
            f"overlap slowdown not identifiable: transfers overlap about "
            f"{frac:.2%} of compute time; left at 0"
        )
        return compute
    for _ in range(2):  # the slowdown for the sharing, the sharing for the slowdown
        r = compute.rates(Pmax)
        overlap = float(min((fit_kinds(ops, r, b)[1], b) for b in OVERLAP)[1])
        compute = best_sharing(ops, cpus, Pmax, overlap, compute.sharing.oversubscription)
        report.residual = compute.residual
    return compute


def op_costs(
    params: dict[str, tuple[float, float]], dispatch: float
) -> tuple[dict[str, float], dict[str, float]]:
    """Per kind: scale, and overhead with the dispatch; a kind no run used gets the average
    scale and the dispatch."""
    scale = {k: params[k][0] for k in params}
    overhead = {k: params[k][1] + dispatch for k in params}
    if scale:
        mean_scale = float(np.mean(list(scale.values())))
        for k in (k.value for k in OpKind):
            scale.setdefault(k, mean_scale)
            overhead.setdefault(k, dispatch)
    return scale, overhead
