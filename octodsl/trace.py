"""Chrome-trace JSON for pipeline timelines, measured (the executor) or simulated.

The format, shared with the simulator so both open side by side in chrome://tracing or Perfetto:
one process per device (pid = device, or global rank when DP > 1), thread 0 = compute,
thread 1 = communication; every span is a complete ("X") event. A compute span is named after
its op ("F3:5") with args {"kind", "stage", "mb"}; a communication span is named after the op
whose result the message carries ("F3:5": the activation of F3:5, "B4:5": the gradient of B4:5)
with args {"kind": "send" | "recv", "stage", "mb", "peer"}.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

from .fileio import write_atomic
from .plan import Op, OpKind
from .version import FIELD, version

COMPUTE, COMM = 0, 1
"""Thread ids."""


@dataclass(frozen=True, slots=True)
class TimedSpan:
    """An interval of one thread of the trace (`plan.Span` is a place in a plan's text)."""

    pid: int
    tid: int
    name: str
    start: float
    """Seconds, on a clock shared by every span of the trace."""
    end: float
    args: dict = field(default_factory=dict)


def op_span(pid: int, kind: str, stage: int, mb: int, start: float, end: float) -> TimedSpan:
    return TimedSpan(
        pid,
        COMPUTE,
        Op(OpKind(kind), stage, mb).label,
        start,
        end,
        {"kind": kind, "stage": stage, "mb": mb},
    )


def comm_span(
    pid: int, direction: str, kind: str, stage: int, mb: int, peer: int, start: float, end: float
) -> TimedSpan:
    """A message carrying the result of op `kind stage:mb`, sent to or received from `peer`."""
    return TimedSpan(
        pid,
        COMM,
        Op(OpKind(kind), stage, mb).label,
        start,
        end,
        {"kind": direction, "stage": stage, "mb": mb, "peer": peer},
    )


def chrome_trace(spans: Iterable[TimedSpan], process_names: dict[int, str] | None = None) -> dict:
    """{"traceEvents": [...], "otherData": {"octodsl_version": ...}} with times in microseconds
    from the earliest span."""
    spans = list(spans)
    t0 = min((s.start for s in spans), default=0.0)
    pids = sorted({s.pid for s in spans} | set(process_names or {}))
    events: list[dict] = []
    for pid in pids:
        name = (process_names or {}).get(pid, f"device {pid}")
        events.append({"ph": "M", "pid": pid, "name": "process_name", "args": {"name": name}})
        events.append(
            {"ph": "M", "pid": pid, "name": "process_sort_index", "args": {"sort_index": pid}}
        )
        for tid, tname in ((COMPUTE, "compute"), (COMM, "communication")):
            events.append(
                {"ph": "M", "pid": pid, "tid": tid, "name": "thread_name", "args": {"name": tname}}
            )
    for s in sorted(spans, key=lambda s: (s.pid, s.tid, s.start)):
        events.append(
            {
                "ph": "X",
                "pid": s.pid,
                "tid": s.tid,
                "name": s.name,
                "ts": (s.start - t0) * 1e6,
                "dur": max(s.end - s.start, 0.0) * 1e6,
                "args": s.args,
            }
        )
    # otherData: the format's free-form metadata (chrome://tracing shows it); callers add theirs
    return {"traceEvents": events, "displayTimeUnit": "ms", "otherData": {FIELD: version()}}


def write_trace(
    path: str | Path,
    spans: Iterable[TimedSpan],
    process_names: dict[int, str] | None = None,
    counters: Callable[[float], list[dict]] | None = None,
    info: dict | None = None,
) -> None:
    """chrome_trace's trace, written atomically; `counters(t0)` gives counter events on its
    clock (t0: the earliest span's start, in seconds) and `info` joins its otherData."""
    spans = list(spans)
    trace = chrome_trace(spans, process_names)
    if counters is not None:
        trace["traceEvents"] += counters(min((s.start for s in spans), default=0.0))
    trace["otherData"].update(info or {})
    write_atomic(path, json.dumps(trace, allow_nan=False))
