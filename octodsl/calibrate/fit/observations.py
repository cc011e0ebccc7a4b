"""What the steps fit on, read off the measured runs: each op's work as seconds spent at each
concurrency, the dispatch gaps between a device's ops and the message hand-offs; and the
profiled costs of each stage."""

from __future__ import annotations

import bisect
import math
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from itertools import pairwise

import numpy as np

from ...costs.table import CostTable, LayerCost
from ...dag import Message, build_graph
from ...plan import Op, Plan
from ...sim.sharing import Sharing
from ..measured import MeasuredStep, MeasuredTrace, check_against


@dataclass
class Run:
    """One measured run of a plan."""

    plan: Plan
    trace: MeasuredTrace
    name: str = ""

    def __post_init__(self) -> None:
        check_against(self.trace, self.plan)
        self.name = self.name or self.plan.header.name


def stage_layers(table: CostTable, plan: Plan) -> list[list[LayerCost]]:
    """The layers of each of the plan's stages."""
    out = []
    for st in plan.stages:
        first, last = st.bounds
        out.append(table.layers[first : last + 1])
    return out


def stage_bases(table: CostTable, plan: Plan) -> dict[tuple[str, int], float]:
    """Per (kind, stage): the profiled seconds of the stage's layers (fused BW: B + W)."""
    out = {}
    for s, ls in enumerate(stage_layers(table, plan)):
        f, b, w = sum(l.f for l in ls), sum(l.b for l in ls), sum(l.w for l in ls)
        out.update({("F", s): f, ("B", s): b, ("W", s): w, ("BW", s): b + w})
    return out


def occupancy(
    intervals: dict[int, list[tuple[float, float]]], device: int, a: float, b: float, P: int
) -> np.ndarray:
    """Seconds of [a, b] spent with k = 1..P devices busy (index k; more than P count as P),
    `device` counted busy throughout; `intervals`: each device's busy spans, sorted."""
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


def rates(P: int, sharing: Sharing) -> np.ndarray:
    """Each device's speed with k = 0..P devices busy (index k): `occupancy(...) @ rates` is
    the work done, in seconds alone."""
    return np.array([0.0] + [sharing.rate(k) for k in range(1, P + 1)])


@dataclass
class OpObs:
    """One measured op."""

    kind: str
    base: float
    """The profiled seconds of its stage's layers (stage_bases)."""
    span: float
    hist: np.ndarray
    """Seconds at k = 0..Pmax devices busy (index k)."""
    comm: float = 0.0
    """Fraction of the span under a transfer of its device's messages (step 4 sets it)."""
    start: float = 0.0
    end: float = 0.0
    sends: list = field(default_factory=list)
    """(producer end, bytes) of the messages its device sent or received in its step."""


@dataclass
class Observations:
    ops: list[OpObs] = field(default_factory=list)
    gaps: list[tuple[float, np.ndarray]] = field(default_factory=list)
    """Between consecutive ops of a device whose second did not wait for a message: (seconds,
    their occupancy)."""
    handoffs: list[tuple[float, float]] = field(default_factory=list)
    """Ops that waited for a message: (seconds from the latest producer's end to the op's
    start, that message's bytes)."""


def collect(table: CostTable, runs: Sequence[Run], Pmax: int) -> Observations:
    """The timed steps' ops, dispatch gaps and hand-offs, over all runs."""
    obs = Observations()
    for run in runs:
        plan = run.plan
        bases = stage_bases(table, plan)
        stage_bytes = [ls[-1].message_bytes for ls in stage_layers(table, plan)]
        messages = build_graph(plan).messages
        inputs: dict[Op, list[Message]] = defaultdict(list)  # each op's messages in
        for msg in messages:
            inputs[msg.consumer].append(msg)
        for step in run.trace.timed:
            _collect_step(obs, step, bases, stage_bytes, messages, inputs, Pmax)
    return obs


def _collect_step(
    obs: Observations,
    step: MeasuredStep,
    bases: dict[tuple[str, int], float],
    stage_bytes: list[float],
    messages: list[Message],
    inputs: dict[Op, list[Message]],
    Pmax: int,
) -> None:
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
        obs.ops.append(
            OpObs(
                op.kind,
                bases[(op.kind, op.stage)],
                op.end - op.start,
                occupancy(intervals, op.device, op.start, op.end, Pmax),
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
                obs.gaps.append(
                    (nxt.start - prev.end, occupancy(intervals, d, prev.end, nxt.start, Pmax))
                )
            else:
                # waited for a message: the latest producer's
                last = max(waits, key=lambda m: end_of[m.producer])
                obs.handoffs.append((nxt.start - ready, stage_bytes[last.boundary]))


def _step_intervals(step: MeasuredStep) -> dict[int, list[tuple[float, float]]]:
    out: dict[int, list[tuple[float, float]]] = defaultdict(list)
    for op in step.ops:
        out[op.device].append((op.start, op.end))
    for spans in out.values():
        spans.sort()
    return out
