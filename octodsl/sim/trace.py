"""A simulated iteration as a Chrome / Perfetto trace, in the executor's format
(octodsl/trace.py) so measured and simulated traces open side by side, plus what only a
simulation knows: flow arrows from each send to its receive, a "memory" counter track per
device (bytes), and the data-parallel collectives on a thread of their own (thread 2: a
stream beside the messages', dpcomm.py)."""

from __future__ import annotations

import json
from pathlib import Path

from ..fileio import write_atomic
from ..trace import COMM, TimedSpan, comm_span, op_span
from ..trace import chrome_trace as spans_trace
from .result import SimResult

DP_COMM = 2
"""Thread id of the data-parallel collectives."""


def chrome_trace(result: SimResult) -> dict:
    spans = [op_span(op.device, op.kind, op.stage, op.mb, op.start, op.end) for op in result.ops()]
    # A free message (--link none) has nothing to show.
    messages = [m for m in result.messages() if m.end > m.start]
    for m in messages:
        spans.append(comm_span(m.src, "send", m.kind, m.stage, m.mb, m.dst, m.start, m.end))
        spans.append(comm_span(m.dst, "recv", m.kind, m.stage, m.mb, m.src, m.start, m.end))
    for c in result.collectives():
        if c.end > c.start:
            spans.append(TimedSpan(c.device, DP_COMM, c.label, c.start, c.end, {"kind": c.kind}))
    trace = spans_trace(spans)
    # spans_trace counts time from the earliest span, and a simulation's first op starts at 0,
    # so the events below can use the simulation's own clock.
    events = trace["traceEvents"]
    for d in sorted({s.pid for s in spans if s.tid == DP_COMM}):
        events.append(
            {
                "ph": "M",
                "pid": d,
                "tid": DP_COMM,
                "name": "thread_name",
                "args": {"name": "data-parallel"},
            }
        )
    for m in messages:
        for ph, pid in (("s", m.src), ("f", m.dst)):
            events.append(
                {
                    "ph": ph,
                    "id": m.id,
                    "pid": pid,
                    "tid": COMM,
                    "ts": m.start * 1e6,
                    "name": m.label,
                    "cat": "message",
                    **({"bp": "e"} if ph == "f" else {}),
                }
            )
    for d in range(result.devices):
        for t, nbytes in result.memory_events(d):
            events.append(
                {"ph": "C", "pid": d, "name": "memory", "ts": t * 1e6, "args": {"bytes": nbytes}}
            )
    return trace


def write_trace(result: SimResult, path: str | Path) -> None:
    write_atomic(path, json.dumps(chrome_trace(result), separators=(",", ":"), allow_nan=False))
