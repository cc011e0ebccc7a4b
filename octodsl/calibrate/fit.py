"""Fit what a per-layer profile cannot see from measured runs of plans (their traces).

Inputs: the profile's cost table (uncalibrated), and runs: (plan, measured trace) pairs,
optionally with the link probe of the calibration launch (worker.py). Each parameter is fitted
from the observations that isolate it, in this order:

1. Processor sharing and per-op costs. Each measured op is an interval on its device's
   compute thread; during it, k(t) devices compute at once (read off the same step of the
   trace). Under the simulator's sharing model (octodsl/sim/sharing.py) the work the op did is
   A = integral of rate(k(t)) dt, and the model says A = scale[kind] * base + overhead[kind],
   base being the profiled seconds of the op's layers (F: f, B: b, W: w, fused BW: b + w). Since
   A is linear in the time spent at each k, every (cores, contention) on a grid costs one
   matrix product and a small least-squares fit per kind (relative residuals, Huber weights so
   that ops slowed by other load count less); the grid point with the least loss wins.
2. Dispatch: the gap between consecutive ops of a device when the second one's inputs had
   arrived before the first ended (the executor's instructions between ops) is added to every
   op's overhead (its work at the rate the device had meanwhile).
3. Link: bandwidth from the probe's send/recv round trips (least squares over the sizes);
   latency from the hand-offs the trace shows: a consumer that waited for its message starts
   after producer end + latency + bytes / bandwidth + dispatch. Without a probe the bandwidth
   is the built-in loopback link's.
4. Overlap slowdown: fitted with 1 when the messages in flight overlap enough compute (the
   fraction of op time under a transfer) to tell; otherwise left at 0 and said so.
5. Optimizer step: the optimizer spans of calibration runs, as work shared between the
   devices updating at once, per parameter of the device (through the origin).
6. Step overhead: the time from a step's last op to the next step's first op, less the
   optimizer's update (median over the timed steps).
7. Memory: per layer kind, the bytes a split backward's weight-gradient state holds after B
   beyond what the profile's act_w says (the gradients at the weight-side restart points),
   from the measured memory just before and after each B (runs whose trace has memory).
8. Oversubscription: step 1 also fits the slowdown per process computing beyond the cores
   (alternating with the grid). But time-slicing makes single ops erratic (on 4 processes and
   2 cores the same op takes 0.7x to 1.7x what fair sharing predicts), so the robust per-op fit
   does not see what it costs on average; it is settled late, as the value whose simulated
   iteration times match the runs best (least squares of the relative errors).
9. Timeline: one factor on every op's cost whose simulated iteration times match the runs best
   (then the oversubscription again): the simulator's timeline runs tighter than a real one,
   so the op-fitted costs alone simulated the runs 2-3% short on average.
"""

from __future__ import annotations

import bisect
import math
import os
import statistics
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime, timezone
from itertools import pairwise

import numpy as np

from ..costs.devices import get_link
from ..costs.profile import FittedLink, ProfileCalibration
from ..costs.table import CostTable
from ..dag import Message, build_graph
from ..errors import OctoError
from ..plan import Op, OpKind, Plan
from ..sim import SimCosts, compile, simulate
from ..sim.sharing import Sharing
from ..version import version
from .measured import MeasuredStep, MeasuredTrace, check_against


@dataclass
class Run:
    """One measured run of a plan."""

    plan: Plan
    trace: MeasuredTrace
    name: str = ""

    def __post_init__(self) -> None:
        check_against(self.trace, self.plan)
        self.name = self.name or self.plan.header.name


@dataclass
class FitReport:
    """What the fit saw and how well it matches (kept in the profile's calibration.fit)."""

    ops: int = 0
    residual: float = 0.0
    """Mean Huber loss of the op-work fit (relative residuals)."""
    dispatch: float = 0.0
    handoffs: int = 0
    probe: list[tuple[int, float]] = field(default_factory=list)
    probe_latency: float | None = None
    overlap_fraction: float = 0.0
    notes: list[str] = field(default_factory=list)
    runs: list[dict] = field(default_factory=list)
    """Per calibration run: measured and simulated iteration time after the fit."""
    memory: dict = field(default_factory=dict)
    timeline: float = 1.0
    """The factor step 9 put on every op's cost."""


Progress = Callable[[str], None]


# Per-op observations.
def stage_bases(table: CostTable, plan: Plan) -> dict[tuple[str, int], float]:
    """Per (kind, stage): the profiled seconds of the stage's layers (fused BW: B + W)."""
    out = {}
    for s, st in enumerate(plan.stages):
        first, last = st.bounds
        ls = table.layers[first : last + 1]
        f, b, w = sum(l.f for l in ls), sum(l.b for l in ls), sum(l.w for l in ls)
        out.update({("F", s): f, ("B", s): b, ("W", s): w, ("BW", s): b + w})
    return out


def _occupancy(
    intervals: dict[int, list[tuple[float, float]]], device: int, a: float, b: float, P: int
) -> np.ndarray:
    """Seconds of [a, b] spent with k = 1..P devices busy, `device` counted busy throughout."""
    hist = np.zeros(P + 1)
    if b <= a:
        return hist
    points = {a, b}
    others = []
    for d, spans in intervals.items():
        if d == device:
            continue
        i = bisect.bisect_left(spans, (a, -math.inf)) - 1
        i = max(i, 0)
        while i < len(spans) and spans[i][0] < b:
            s, e = spans[i]
            if e > a:
                others.append((max(s, a), min(e, b)))
                points.update((max(s, a), min(e, b)))
            i += 1
    cuts = sorted(points)
    for lo, hi in pairwise(cuts):
        k = 1 + sum(1 for s, e in others if s <= lo and e >= hi)
        hist[min(k, P)] += hi - lo
    return hist


def _rates(P: int, sharing: Sharing) -> np.ndarray:
    return np.array([0.0] + [sharing.rate(k) for k in range(1, P + 1)])


@dataclass
class _OpObs:
    kind: str
    base: float
    span: float
    hist: np.ndarray
    """Seconds at k = 0..Pmax devices busy (index k)."""
    comm: float = 0.0
    """Fraction of the span under a transfer of its device's messages (estimated)."""
    start: float = 0.0
    end: float = 0.0
    sends: list = field(default_factory=list)
    """(producer end, bytes) of the messages its device sent or received in its step."""


def _step_intervals(step: MeasuredStep) -> dict[int, list[tuple[float, float]]]:
    out: dict[int, list[tuple[float, float]]] = defaultdict(list)
    for op in step.ops:
        out[op.device].append((op.start, op.end))
    for spans in out.values():
        spans.sort()
    return out


def _collect(table: CostTable, runs: Sequence[Run], Pmax: int):
    """Op observations, dispatch gaps (with their occupancy) and message hand-offs."""
    ops: list[_OpObs] = []
    gaps: list[tuple[float, np.ndarray]] = []
    handoffs: list[tuple[float, float]] = []  # (seconds from producer end to consumer start, bytes)
    for run in runs:
        plan = run.plan
        bases = stage_bases(table, plan)
        stage_bytes = [table.layers[st.bounds[1]].message_bytes for st in plan.stages]
        messages = build_graph(plan).messages
        inputs: dict[Op, list[Message]] = defaultdict(list)  # each op's messages in
        for msg in messages:
            inputs[msg.consumer].append(msg)
        for step in run.trace.timed:
            intervals = _step_intervals(step)
            end_of = {op.op: op.end for op in step.ops}
            transfers: dict[int, list] = defaultdict(list)
            for msg in messages:
                t = end_of.get(msg.producer)
                if t is not None:
                    for d in (msg.src, msg.dst):
                        transfers[d].append((t, stage_bytes[msg.boundary]))
            by_dev: dict[int, list] = defaultdict(list)
            for op in step.ops:
                by_dev[op.device].append(op)
                ops.append(
                    _OpObs(
                        op.kind,
                        bases[(op.kind, op.stage)],
                        op.end - op.start,
                        _pad(_occupancy(intervals, op.device, op.start, op.end, Pmax), Pmax),
                        start=op.start,
                        end=op.end,
                        sends=transfers[op.device],
                    )
                )
            for d, seq in by_dev.items():
                seq.sort(key=lambda o: o.start)
                for prev, nxt in pairwise(seq):
                    waits = inputs.get(nxt.op, ())
                    ready = max((end_of[m.producer] for m in waits), default=-math.inf)
                    if ready <= prev.end:
                        gaps.append(
                            (
                                nxt.start - prev.end,
                                _pad(_occupancy(intervals, d, prev.end, nxt.start, Pmax), Pmax),
                            )
                        )
                    else:
                        # waited for a message: the latest producer's
                        last = max(waits, key=lambda m: end_of[m.producer])
                        handoffs.append((nxt.start - ready, stage_bytes[last.boundary]))
    return ops, gaps, handoffs


def _pad(h: np.ndarray, P: int) -> np.ndarray:
    out = np.zeros(P + 1)
    out[: len(h)] = h[: P + 1]
    return out


HUBER = 0.05
"""Relative residual beyond which an op counts less (Huber weights): an op slowed by a burst of
someone else's work on a shared machine should not move the fit much."""


def _fit_kinds(ops: list[_OpObs], rates: np.ndarray, slowdown: float = 0.0):
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
        for _ in range(4):
            wgt = rel * np.sqrt(robust)
            s, o = _weighted_line(x, y, wgt, two)
            r = (s * x + o - y) * rel
            robust = np.minimum(1.0, HUBER / np.maximum(np.abs(r), 1e-12))
        params[kind] = (s, o)
        resid[sel] = r
    a = np.abs(resid)
    loss = np.where(a <= HUBER, 0.5 * a**2, HUBER * (a - 0.5 * HUBER))
    return params, float(loss.mean()) if len(ops) else 0.0


def _weighted_line(x, y, wgt, two: bool) -> tuple[float, float]:
    """y ~ s x + o by weighted least squares; through the origin when the sizes cannot tell the
    overhead from the scale, or when either would come out negative."""
    if two:
        A = np.stack([x * wgt, wgt], axis=1)
        (s, o), *_ = np.linalg.lstsq(A, y * wgt, rcond=None)
        if o >= 0 and s > 0:
            return float(s), float(o)
    return float((x * y * wgt**2).sum() / max((x * x * wgt**2).sum(), 1e-30)), 0.0


def _grid(cpus: int, Pmax: int):
    """Cores from 1 to the machine's (no more than the processes: beyond, no one waits for a
    core), in steps of 0.05 (other load leaves a fraction free), or a core each (None) unless
    the processes outnumber the machine's cores; contention 0 to 0.3."""
    top = min(cpus, Pmax)
    limited = [round(c, 2) for c in np.arange(1.0, top + 0.001, 0.05)] if Pmax > 1 else []
    cores = ([None] if Pmax <= cpus else []) + limited
    contention = [round(c, 3) for c in np.arange(0.0, 0.301, 0.01)]
    return cores, contention


def _best_sharing(
    ops: list[_OpObs], cpus: int, Pmax: int, slowdown: float = 0.0, oversubscription: float = 0.0
):
    """(residual, Sharing, per-kind params) of the grid point that fits the ops best."""
    best = None
    cores_grid, cont_grid = _grid(cpus, Pmax)
    for cores in cores_grid:
        for cont in cont_grid:
            sharing = Sharing(cores, cont, oversubscription=oversubscription)
            params, res = _fit_kinds(ops, _rates(Pmax, sharing), slowdown)
            if best is None or res < best[0] - 1e-12:
                best = (res, sharing, params)
    assert best is not None, "both grids have a value or more"
    res, sharing, params = best
    if sharing.cores is not None and sharing.cores >= Pmax:  # the same as no limit
        sharing = Sharing(None, sharing.contention)
    return res, sharing, params


def _oversubscribed_sharing(ops: list[_OpObs], cpus: int, Pmax: int, found):
    """_best_sharing's (residual, Sharing, params) with the oversubscription slowdown fitted
    to the ops too, alternating with the sharing twice, when some op ran while more devices
    computed than there are cores."""
    res, sharing, params = found
    for _ in range(2):
        if sharing.cores is None or not any(o.hist[int(sharing.cores) + 1 :].any() for o in ops):
            break
        x = min(
            OVERSUBSCRIPTION,
            key=lambda x: _fit_kinds(ops, _rates(Pmax, replace(sharing, oversubscription=x)))[1],
        )
        res, sharing, params = _best_sharing(ops, cpus, Pmax, 0.0, x)
    return res, sharing, params


def fit_link(probe: Sequence[tuple[int, float]]) -> tuple[float, float] | None:
    """(latency, bandwidth) by least squares over the probe's sizes (the smallest, which pays
    for connection warm-up, left out when there are enough); None without a usable probe."""
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


def fit(
    table: CostTable,
    runs: Sequence[Run],
    *,
    probe: Sequence[tuple[int, float]] = (),
    cpus: int | None = None,
    source: str = "",
    progress: Progress | None = None,
) -> ProfileCalibration:
    """The calibration of `table` (a profile's, uncalibrated) from measured runs: the module's
    steps, in order, each fitted on what the steps before it found."""
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

    say("collecting ops")
    ops, gaps, handoffs = _collect(table, runs, Pmax)
    report.ops = len(ops)
    say("fitting compute")
    compute = _fit_compute(ops, cpus, Pmax, report)
    dispatch = _fit_dispatch(gaps, compute.rates(Pmax), report)
    link = _fit_link_latency(probe, gaps, handoffs, report)
    compute = _fit_overlap(ops, link, compute, cpus, Pmax, report)
    scale, overhead = _op_costs(compute.params, dispatch)
    say("fitting the optimizer step")
    per_param = _fit_update(table, runs, compute.rates(Pmax), Pmax, report)
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
        step_overhead=0.0,
        cores=compute.sharing.cores,
        contention=compute.sharing.contention,
        overlap_slowdown=compute.overlap,
        oversubscription=compute.sharing.oversubscription,
    )
    say("fitting the step overhead")
    cal = _fit_step_overhead(runs, cal, report)
    cal = _fit_memory_after_b(table, runs, cal, report)
    programs = [compile(r.plan) for r in runs]
    if cal.cores is not None and Pmax > cal.cores:
        say("fitting the oversubscription slowdown")
        cal = _fit_oversubscription(table, runs, programs, cal)
    say("matching the iteration times")
    cal = _fit_timeline(table, runs, programs, cal, report)
    if cal.cores is not None and Pmax > cal.cores:
        cal = _fit_oversubscription(table, runs, programs, cal)
    report.runs = _reproduction(table, runs, programs, cal)
    return cal.model_copy(update={"fit": _report_json(report)})


@dataclass
class _Compute:
    """What the op-work fit found: the sharing model, per-kind (scale, overhead), its loss and
    the overlap slowdown it assumed."""

    residual: float
    sharing: Sharing
    params: dict[str, tuple[float, float]]
    overlap: float = 0.0

    def rates(self, Pmax: int) -> np.ndarray:
        return _rates(Pmax, self.sharing)


def _fit_compute(ops: list[_OpObs], cpus: int, Pmax: int, report: FitReport) -> _Compute:
    """Step 1: processor sharing and per-op costs, the oversubscription fitted to the ops too
    (step 8 settles it)."""
    res, sharing, params = _oversubscribed_sharing(ops, cpus, Pmax, _best_sharing(ops, cpus, Pmax))
    report.residual = res
    return _Compute(res, sharing, params)


def _fit_dispatch(
    gaps: list[tuple[float, np.ndarray]], rates: np.ndarray, report: FitReport
) -> float:
    """Step 2: the dispatch between ops, as work at the rate the device had meanwhile."""
    report.dispatch = statistics.median(float(h @ rates) for _, h in gaps) if gaps else 0.0
    return report.dispatch


def _fit_link_latency(
    probe: Sequence[tuple[int, float]],
    gaps: list[tuple[float, np.ndarray]],
    handoffs: list[tuple[float, float]],
    report: FitReport,
) -> FittedLink:
    """Step 3: the link's bandwidth from the probe (else loopback's), its latency from the
    hand-offs less the dispatch (else the probe's, else loopback's)."""
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


def _fit_overlap(
    ops: list[_OpObs], link: FittedLink, compute: _Compute, cpus: int, Pmax: int, report: FitReport
) -> _Compute:
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
        rates = compute.rates(Pmax)
        overlap = float(
            min((_fit_kinds(ops, rates, b)[1], b) for b in np.arange(0, 1.001, 0.02))[1]
        )
        res, sharing, params = _best_sharing(
            ops, cpus, Pmax, overlap, compute.sharing.oversubscription
        )
        report.residual = res
        compute = _Compute(res, sharing, params, overlap)
    return compute


def _op_costs(
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


def _fit_update(
    table: CostTable, runs: Sequence[Run], rates: np.ndarray, Pmax: int, report: FitReport
) -> float:
    """Step 5: the optimizer step's seconds per parameter, from the optimizer spans as work
    shared between the devices updating at once (least squares through the origin)."""
    xs, ys = [], []
    for run in runs:
        params_dev = _device_params(table, run.plan)
        for step in run.trace.timed:
            if not step.updates:
                continue
            spans = {d: [(a, b)] for d, (a, b) in step.updates.items()}
            for d, (a, b) in step.updates.items():
                h = _pad(_occupancy(spans, d, a, b, Pmax), Pmax)
                xs.append(params_dev[d])
                ys.append(float(h @ rates))
    if not xs:
        report.notes.append(
            "no optimizer spans in the traces: the optimizer step is part of the step overhead"
        )
        return 0.0
    x, y = np.array(xs, float), np.array(ys)
    return float((x * y).sum() / (x * x).sum())


def _fit_step_overhead(
    runs: Sequence[Run], cal: ProfileCalibration, report: FitReport
) -> ProfileCalibration:
    """Step 6: the median time from a step's last op to the next step's first, less the
    optimizer's update in it."""
    tails = []
    for r in runs:
        for step in r.trace.timed:
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
        return cal
    return cal.model_copy(update={"step_overhead": max(0.0, statistics.median(tails))})


def _fit_memory_after_b(
    table: CostTable, runs: Sequence[Run], cal: ProfileCalibration, report: FitReport
) -> ProfileCalibration:
    """Step 7: the bytes a split backward holds after B beyond the profile's act_w (fit_memory),
    when the traces have memory."""
    extra = fit_memory(table, runs)
    if extra is None:
        return cal
    report.memory = {"act_w_extra": extra}
    return cal.model_copy(update={"act_w_extra": extra})


def _fit_oversubscription(
    table: CostTable, runs: Sequence[Run], programs: Sequence, cal: ProfileCalibration
) -> ProfileCalibration:
    """Step 8: the oversubscription slowdown whose simulated iteration times match the runs
    best; `programs`: the runs' plans, compiled."""
    x = min(OVERSUBSCRIPTION, key=lambda x: (_iteration_loss(table, runs, programs, cal, x), x))
    return cal.model_copy(update={"oversubscription": float(x)})


def _fit_timeline(
    table: CostTable,
    runs: Sequence[Run],
    programs: Sequence,
    cal: ProfileCalibration,
    report: FitReport,
) -> ProfileCalibration:
    """Step 9: one factor on every op's cost (scale and overhead, all kinds) whose simulated
    iteration times match the runs best. The op fit turns each measured duration into work at
    the concurrency the trace shows; the simulator turns work back into durations at the
    concurrency of its own timeline, which runs tighter than a real one (ops that vary, a
    process waiting for a core), so op-fitted costs alone simulated the calibration's own runs
    2-3% short on average (docs/calibration.md, "Why held-out plans were off")."""

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
            _iteration_loss(table, runs, programs, scaled(c), cal.oversubscription),
            abs(c - 1),
        ),
    )
    report.timeline = float(c)
    return scaled(c)


TIMELINE = [round(x, 3) for x in np.arange(0.85, 1.1501, 0.005)]
"""Factors on the op costs the iteration match tries: within 15% of the op fit."""


def _reproduction(
    table: CostTable, runs: Sequence[Run], programs: Sequence, cal: ProfileCalibration
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
        for r, sim_t in zip(runs, _simulated(table, runs, programs, cal), strict=True)
    ]


OVERSUBSCRIPTION = [round(x, 2) for x in np.arange(0.0, 1.001, 0.02)]
"""Values of the oversubscription slowdown the fit tries."""


def _simulated(
    table: CostTable, runs: Sequence[Run], programs: Sequence, cal: ProfileCalibration
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


def _iteration_loss(
    table: CostTable,
    runs: Sequence[Run],
    programs: Sequence,
    cal: ProfileCalibration,
    oversubscription: float,
) -> float:
    """Mean squared relative error of the runs' simulated iteration times."""
    cal = cal.model_copy(update={"oversubscription": oversubscription})
    return float(
        np.mean(
            [
                ((t - r.trace.iteration_time) / r.trace.iteration_time) ** 2
                for r, t in zip(runs, _simulated(table, runs, programs, cal), strict=True)
            ]
        )
    )


def _device_params(table: CostTable, plan: Plan) -> np.ndarray:
    out = np.zeros(plan.devices)
    for s, d in enumerate(plan.stage_device()):
        first, last = plan.stages[s].bounds
        out[d] += sum(l.params for l in table.layers[first : last + 1])
    return out


def fit_memory(table: CostTable, runs: Sequence[Run]) -> dict[str, float] | None:
    """Per layer kind: bytes held from B until W beyond the profiled act_w, by non-negative
    least squares over the split stages' measured rise at B (None: no memory in the traces)."""
    rows, ys = [], []
    kinds = sorted({l.kind for l in table.layers})
    for run in runs:
        trace = run.trace
        if not trace.memory:
            continue
        plan = run.plan
        step = trace.steps[0]  # the worker samples memory in the first step
        for d in range(plan.devices):
            samples = sorted(trace.memory.get(d, []))[1:]  # the first is the static bytes
            ops = sorted((o for o in step.ops if o.device == d), key=lambda o: o.start)
            if len(samples) != len(ops):
                continue
            levels = [b for _, b in samples]
            for i, op in enumerate(ops):
                if op.kind != "B" or i == 0:
                    continue
                first, last = plan.stages[op.stage].bounds
                ls = table.layers[first : last + 1]
                act = sum(l.act for l in ls)
                act_w = sum(l.act_w for l in ls)
                rise = levels[i] - levels[i - 1]  # the model: -(act - act_w)
                rows.append([sum(1 for l in ls if l.kind == k) for k in kinds])
                ys.append(rise + (act - act_w))
    if not rows:
        return None
    A, y = np.array(rows, float), np.array(ys, float)
    coef = _nnls(A, y)
    return {k: float(c) for k, c in zip(kinds, coef, strict=True) if A[:, kinds.index(k)].any()}


def _nnls(A: np.ndarray, y: np.ndarray, iters: int = 200) -> np.ndarray:
    """Non-negative least squares (active set, Lawson-Hanson; small problems)."""
    n = A.shape[1]
    x = np.zeros(n)
    passive = np.zeros(n, bool)
    for _ in range(iters):
        grad = A.T @ (y - A @ x)
        cand = (~passive) & (grad > 1e-9 * max(1.0, float(np.abs(grad).max())))
        if not cand.any():
            break
        passive[int(np.argmax(np.where(cand, grad, -np.inf)))] = True
        while True:
            z = np.zeros(n)
            z[passive] = np.linalg.lstsq(A[:, passive], y, rcond=None)[0]
            if (z[passive] > 0).all():
                x = z
                break
            neg = passive & (z <= 0)
            alpha = np.min(x[neg] / (x[neg] - z[neg]))
            x = x + alpha * (z - x)
            passive &= x > 1e-12
    return x


def _report_json(r: FitReport) -> dict:
    return {
        "ops": r.ops,
        "op_residual": r.residual,
        "dispatch": r.dispatch,
        "handoffs": r.handoffs,
        "probe": [list(p) for p in r.probe],
        "probe_latency": r.probe_latency,
        "overlap_fraction": r.overlap_fraction,
        "notes": r.notes,
        "runs": r.runs,
        "memory": r.memory,
        "timeline": r.timeline,
    }
