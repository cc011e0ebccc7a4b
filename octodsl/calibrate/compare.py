"""Simulated against measured: one plan, its simulation and a measured trace of it.

`compare(plan, costs, link, trace)` simulates the plan with the given costs (the one simulator)
and sets each figure next to the trace's (measured.py): iteration time, per device busy and idle
time, per op kind the time all devices spend in it per step, peak memory per device when the
trace has it. Error = (simulated - measured) / measured. The plan is the one the trace ran
(`measured.as_ran`: with the executor's split when it names no layers), its costs built for it.
`side_by_side(...)` is both timelines in one Chrome trace; `write_png(...)` in one picture.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..costs.table import Link
from ..fileio import open_atomic, write_atomic
from ..plan import OpKind, Plan
from ..sim import SimCosts, SimResult, compile, simulate
from ..trace import COMM, COMPUTE, TimedSpan, chrome_trace, comm_span, op_span
from .measured import MeasuredTrace, as_ran, check_against


@dataclass(frozen=True, slots=True)
class Metric:
    name: str
    """'iteration', 'busy', 'idle', 'F ops' (B, W, BW: the time all devices spend in ops of
    the kind per step) or 'peak memory'."""
    device: int | None
    simulated: float
    measured: float

    @property
    def error(self) -> float:
        """(simulated - measured) / measured; nan when nothing was measured."""
        if not math.isfinite(self.measured) or self.measured == 0:
            return math.nan
        return (self.simulated - self.measured) / self.measured

    def to_json(self) -> dict:
        return {
            "metric": self.name,
            "device": self.device,
            "simulated": _finite(self.simulated),
            "measured": _finite(self.measured),
            "error": _finite(self.error),
        }


def _finite(x: float) -> float | None:
    """JSON has no nan: an undefined figure is null."""
    return x if math.isfinite(x) else None


@dataclass
class Comparison:
    plan: Plan
    result: SimResult
    measured: MeasuredTrace
    link: Link
    iteration: Metric
    busy: list[Metric]
    idle: list[Metric]
    kinds: list[Metric]
    peak: list[Metric] | None
    notes: list[str]

    def metrics(self) -> list[Metric]:
        return [self.iteration, *self.busy, *self.idle, *self.kinds, *(self.peak or [])]

    @property
    def memory_error(self) -> float | None:
        """Mean absolute peak-memory error over the devices (None: not measured)."""
        if not self.peak:
            return None
        return float(np.mean([abs(m.error) for m in self.peak]))

    def to_json(self) -> dict:
        """The `octodsl compare --json` object; an error is null where nothing was measured
        (see Metric.error)."""
        return {
            "plan": self.plan.header.name,
            "devices": self.plan.devices,
            "microbatches": self.plan.microbatches,
            "costs": self.result.costs.source,
            "link": {
                "name": self.link.name,
                "latency": self.link.latency,
                "bandwidth": self.link.bandwidth,
            },
            "trace": self.measured.path,
            "steps": len(self.measured.steps),
            "timed_steps": len(self.measured.timed),
            "step_spread": self.measured.spread,
            "iteration_error": _finite(self.iteration.error),
            "memory_error": None if self.memory_error is None else _finite(self.memory_error),
            "metrics": [m.to_json() for m in self.metrics()],
            "notes": self.notes,
        }


def compare(plan: Plan, costs: SimCosts, link: Link, trace: MeasuredTrace) -> Comparison:
    """Raises TraceError when the trace is not a run of the plan, PlanError (SimDeadlock) when
    the plan cannot be simulated. `plan` is the one that ran (`as_ran(plan, trace)`)."""
    if as_ran(plan, trace) is not plan:
        raise ValueError("compare the plan as it ran, as_ran(plan, trace), with costs for it")
    check_against(trace, plan)
    result = simulate(compile(plan), costs, link)
    notes = list(trace.notes)
    if trace.has_period:
        sim_iteration = result.iteration_time
    else:
        sim_iteration = result.pipeline_time
        notes.append(
            "compared without the optimizer step: simulated pipeline time vs the span "
            "of the measured ops"
        )
    meas_iteration = trace.iteration_time
    P = plan.devices
    busy_m = trace.busy
    busy = [Metric("busy", d, float(result.busy[d]), float(busy_m[d])) for d in range(P)]
    idle = [
        Metric("idle", d, sim_iteration - float(result.busy[d]), meas_iteration - float(busy_m[d]))
        for d in range(P)
    ]
    per_kind: dict[str, float] = {}
    for op in result.ops():
        per_kind[op.kind] = per_kind.get(op.kind, 0.0) + (op.end - op.start)
    kinds = [
        Metric(f"{k.value} ops", None, per_kind[k.value], trace.kind_time(k.value))
        for k in OpKind
        if k.value in per_kind
    ]
    peak = None
    measured_peak = trace.peak_memory
    if measured_peak is not None:
        peak = [
            Metric("peak memory", d, float(result.peak_memory[d]), float(measured_peak[d]))
            for d in range(P)
        ]
    return Comparison(
        plan,
        result,
        trace,
        link,
        Metric("iteration", None, sim_iteration, meas_iteration),
        busy,
        idle,
        kinds,
        peak,
        notes,
    )


# Side by side.
def _sim_spans(result: SimResult, pid_of) -> list[TimedSpan]:
    spans = [
        op_span(pid_of(op.device), op.kind, op.stage, op.mb, op.start, op.end)
        for op in result.ops()
    ]
    for m in result.messages():
        if m.end > m.start:
            spans.append(
                comm_span(pid_of(m.src), "send", m.kind, m.stage, m.mb, m.dst, m.start, m.end)
            )
            spans.append(
                comm_span(pid_of(m.dst), "recv", m.kind, m.stage, m.mb, m.src, m.start, m.end)
            )
    if result.update is not None:
        for d, u in enumerate(result.update):
            if u > 0:
                spans.append(
                    TimedSpan(
                        pid_of(d),
                        COMPUTE,
                        "optimizer",
                        result.update_start,
                        result.update_start + float(u),
                        {"kind": "optimizer"},
                    )
                )
    return spans


def _measured_spans(trace: MeasuredTrace, pid_of) -> tuple[list[TimedSpan], float]:
    """The representative step's spans, on a clock that starts at the step's first op."""
    step = trace.representative()
    t0 = step.start
    spans = [
        op_span(pid_of(op.device), op.kind, op.stage, op.mb, op.start - t0, op.end - t0)
        for op in step.ops
    ]
    for m in step.messages:  # a receive posted before the step's first op: clipped to it
        spans.append(
            comm_span(
                pid_of(m.device),
                m.direction,
                m.kind,
                m.stage,
                m.mb,
                m.peer,
                max(m.start - t0, 0.0),
                max(m.end - t0, 0.0),
            )
        )
    for d, (a, b) in step.updates.items():
        spans.append(
            TimedSpan(pid_of(d), COMPUTE, "optimizer", a - t0, b - t0, {"kind": "optimizer"})
        )
    return spans, t0


def side_by_side(c: Comparison) -> dict:
    """One Chrome trace: each device's simulated timeline above its measured one (the
    representative measured step, shifted to start at 0), memory counters for both."""
    P = c.plan.devices
    sim_pid, meas_pid = (lambda d: 2 * d), (lambda d: 2 * d + 1)
    spans = _sim_spans(c.result, sim_pid)
    measured, t0 = _measured_spans(c.measured, meas_pid)
    spans += measured
    # Both clocks start at 0: anchor the trace's origin there.
    spans.append(TimedSpan(sim_pid(0), COMPUTE, "iteration start", 0.0, 0.0, {"kind": "marker"}))
    step = c.measured.representative()
    names = {}
    for d in range(P):
        names[sim_pid(d)] = f"simulated: device {d}"
        names[meas_pid(d)] = f"measured: device {d} (step {step.index})"
    trace = chrome_trace(spans, names)
    events = trace["traceEvents"]
    for d in range(P):
        for t, nbytes in c.result.memory_events(d):
            events.append(
                {
                    "ph": "C",
                    "pid": sim_pid(d),
                    "name": "memory",
                    "ts": t * 1e6,
                    "args": {"bytes": nbytes},
                }
            )
        for t, nbytes in c.measured.memory.get(d, []):
            # memory was sampled in the first step: shown on that step's clock
            first = c.measured.steps[0].start
            events.append(
                {
                    "ph": "C",
                    "pid": meas_pid(d),
                    "name": "memory (first step)",
                    "ts": max(t - first, 0.0) * 1e6,
                    "args": {"bytes": nbytes},
                }
            )
    trace["otherData"].update({"octodsl": "compare", **c.to_json()})
    return trace


def write_side_by_side(c: Comparison, path: str | Path) -> None:
    write_atomic(path, json.dumps(side_by_side(c), separators=(",", ":"), allow_nan=False))


def write_png(c: Comparison, path: str | Path) -> None:
    """Each device's simulated row above its measured row, one time axis. Raises ImportError
    without matplotlib."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.colors import to_rgb
    from matplotlib.patches import Patch

    from ..sim.gantt import COLOURS, COMM_COLOUR

    P = c.plan.devices
    sim_spans = _sim_spans(c.result, lambda d: d)
    meas_spans, _ = _measured_spans(c.measured, lambda d: d)
    horizon = max(
        c.iteration.simulated,
        c.iteration.measured,
        max((s.end for s in sim_spans + meas_spans), default=0.0),
    )
    scale, unit = (1e3, "ms") if horizon < 10 else (1.0, "s")
    width = min(60.0, max(12.0, 0.25 * max(len(s) for s in c.plan.schedule)))
    height = 1.2 + 1.0 * P
    fig, ax = plt.subplots(figsize=(width, height))
    fig.subplots_adjust(
        left=1.6 / width, right=1 - 1.3 / width, bottom=0.7 / height, top=1 - 0.6 / height
    )
    update_colour = "#C44E52"
    rows: list[str] = []
    for d in range(P):
        for which, spans in (("simulated", sim_spans), ("measured", meas_spans)):
            y = len(rows)
            rows.append(f"device {d} {which}")
            mine = [s for s in spans if s.pid == d]
            for s in mine:
                kind = s.args.get("kind")
                if s.tid == COMPUTE and kind in COLOURS:
                    colour: tuple[float, ...] = to_rgb(COLOURS[kind])
                    if which == "measured":
                        colour = tuple(0.15 + 0.85 * x for x in colour)
                    ax.broken_barh(
                        [(s.start * scale, (s.end - s.start) * scale)],
                        (y - 0.38, 0.6),
                        facecolors=colour,
                        edgecolor="white",
                        linewidth=0.3,
                    )
                elif s.tid == COMPUTE and kind == "optimizer":
                    ax.broken_barh(
                        [(s.start * scale, (s.end - s.start) * scale)],
                        (y - 0.38, 0.6),
                        facecolors=update_colour,
                        linewidth=0,
                    )
                elif s.tid == COMM and which == "simulated":
                    # (a measured span runs from posting to noticing completion, not a transfer)
                    ax.broken_barh(
                        [(s.start * scale, (s.end - s.start) * scale)],
                        (y + 0.25, 0.1),
                        facecolors=COMM_COLOUR,
                        linewidth=0,
                    )
    for x, style in ((c.iteration.simulated, "-"), (c.iteration.measured, "--")):
        ax.axvline(x * scale, color="black", linestyle=style, linewidth=0.8)
    ax.set_ylim(len(rows) - 0.4, -0.6)
    ax.set_yticks(range(len(rows)), rows, fontsize=8)
    ax.set_xlim(0, horizon * scale * 1.01)
    ax.set_xlabel(f"time ({unit}); solid line: simulated iteration, dashed: measured")
    kinds = sorted(
        set(COLOURS).intersection(s.args.get("kind") for s in sim_spans + meas_spans),
        key=list(COLOURS).index,
    )
    ax.legend(
        handles=[Patch(color=COLOURS[k], label=k) for k in kinds]
        + [
            Patch(color=update_colour, label="optimizer"),
            Patch(color=COMM_COLOUR, label="message (simulated)"),
        ],
        loc="upper left",
        bbox_to_anchor=(1.0, 1.0),
        fontsize=8,
    )
    mem = "" if c.memory_error is None else f"; peak memory mean |error| {c.memory_error:.1%}"
    ax.set_title(
        f"{c.plan.header.name}: simulated {c.iteration.simulated * scale:.1f} {unit} vs measured "
        f"{c.iteration.measured * scale:.1f} {unit} ({c.iteration.error:+.1%}{mem})",
        loc="left",
        fontsize=10,
    )
    try:
        with open_atomic(path, "wb") as f:
            fig.savefig(f, format="png", dpi=100)
    finally:
        plt.close(fig)
