"""A measured Chrome trace (the executor's `--trace`, octodsl/trace.py) read back as steps.

The executor records every training step of a run in one trace: per rank, a compute span per op
("F3:5", args kind/stage/mb) and a communication span per message (args kind send|recv, peer).
Step k is the k-th occurrence of each span on its rank. Measured figures, per step, then the
median over the steps after the warm-up (by default the first step, whose shape exchanges and
first allocations make it slower; on a CPU the next ones are often slower too):

- iteration time: from the step's first op start (on any device) to the next step's (the
  optimizer step and the synchronisation between steps included), so the last step has none;
  a trace with no such interval after the warm-up falls back to the span of its ops (flagged);
- per device: busy = the sum of its op spans, idle = iteration - busy;
- memory, when the trace has "memory" counter tracks (the executor's traces have them, taken
  in the first step: deepspeed_ext/memory.py): the peak per device.
The executor also records an "optimizer" span per rank and step (`optimizer.step()`) and, in
the otherData, the layers each stage ran (`partition`: [first, last] per stage): `as_ran` gives
the plan with that split, so a plan that names no layers is simulated as it ran.
"""

from __future__ import annotations

import math
import re
import statistics
from collections import defaultdict
from dataclasses import dataclass, field, replace
from itertools import pairwise
from pathlib import Path

import numpy as np

from .. import limits
from ..errors import OctoError
from ..inputs import kind_of, read_data
from ..plan import Op, OpKind, Plan, PlanError
from ..sim.result import OpSpan

OP_KINDS = {k.value for k in OpKind}


class TraceError(OctoError):
    """A trace that cannot be read or does not fit the plan; the message is for the user."""


@dataclass(frozen=True, slots=True)
class MeasuredMessage:
    device: int
    direction: str
    """'send' or 'recv'."""
    kind: str
    """Kind of the producing op."""
    stage: int
    mb: int
    peer: int
    start: float
    end: float


@dataclass
class MeasuredStep:
    index: int
    ops: list[OpSpan]
    """Times in seconds from the trace's origin."""
    messages: list[MeasuredMessage]
    updates: dict[int, tuple[float, float]]
    """Per device: its optimizer span."""
    start: float = 0.0
    end: float = 0.0
    period: float | None = None
    """Until the next step's start (None for the last step)."""

    def busy(self, devices: int) -> np.ndarray:
        out = np.zeros(devices)
        for op in self.ops:
            out[op.device] += op.end - op.start
        return out


@dataclass
class MeasuredTrace:
    path: str
    devices: int
    steps: list[MeasuredStep]
    memory: dict[int, list[tuple[float, float]]] = field(default_factory=dict)
    """Per device: (seconds, bytes) samples of the "memory" counter."""
    info: dict = field(default_factory=dict)
    """The trace's otherData (calibration runs: plan, model, processes, memory method)."""
    notes: list[str] = field(default_factory=list)
    warmup: int = 1
    """Steps at the start that are not timed (shapes exchanged, memory first allocated)."""

    @property
    def timed(self) -> list[MeasuredStep]:
        """The steps that count: those after the warm-up, or the last one when there are no
        more."""
        return self.steps[self.warmup :] if len(self.steps) > self.warmup else self.steps[-1:]

    @property
    def has_period(self) -> bool:
        return any(s.period is not None for s in self.timed)

    @property
    def iteration_time(self) -> float:
        periods = [s.period for s in self.timed if s.period is not None]
        if periods:
            return statistics.median(periods)
        return statistics.median(s.end - s.start for s in self.timed)

    @property
    def spread(self) -> float | None:
        """(slowest - fastest) / median of the timed steps' iteration times: how much the
        machine let the same step vary (None with fewer than two)."""
        periods = [s.period for s in self.timed if s.period is not None]
        if len(periods) < 2:
            return None
        return (max(periods) - min(periods)) / statistics.median(periods)

    def representative(self) -> MeasuredStep:
        """The timed step whose period (or span) is closest to the median."""
        t = self.iteration_time
        return min(
            self.timed,
            key=lambda s: abs((s.period if s.period is not None else s.end - s.start) - t),
        )

    @property
    def busy(self) -> np.ndarray:
        return np.median(np.stack([s.busy(self.devices) for s in self.timed]), axis=0)

    @property
    def idle(self) -> np.ndarray:
        return self.iteration_time - self.busy

    @property
    def peak_memory(self) -> np.ndarray | None:
        if not self.memory:
            return None
        return np.array(
            [
                max((b for _, b in self.memory.get(d, [])), default=np.nan)
                for d in range(self.devices)
            ]
        )

    def kind_time(self, kind: str) -> float:
        """Median over the timed steps of the seconds all devices spent in ops of `kind`."""
        return statistics.median(
            sum(op.end - op.start for op in s.ops if op.kind == kind) for s in self.timed
        )

    @property
    def update_times(self) -> np.ndarray | None:
        """Per device: median optimizer-step seconds (None: the trace has no optimizer spans)."""
        spans = [s.updates for s in self.timed if s.updates]
        if not spans:
            return None
        return np.array(
            [
                statistics.median(u[d][1] - u[d][0] for u in spans if d in u)
                if any(d in u for u in spans)
                else 0.0
                for d in range(self.devices)
            ]
        )


_NAME = re.compile(r"device (\d+)(?: \(dp (\d+)\))?")


def read_trace(path: str | Path, warmup: int = 1) -> MeasuredTrace:
    """Read a measured trace whose first `warmup` steps are not timed; TraceError says what is
    wrong with it."""
    data = read_data(path, "trace", error=TraceError, json_file=True)
    events = data.get("traceEvents") if isinstance(data, dict) else data
    if not isinstance(events, list):
        raise TraceError(f"{path}: not a Chrome trace (no traceEvents list)")
    info = data.get("otherData", {}) if isinstance(data, dict) else {}
    if not isinstance(info, dict):
        raise TraceError(f"{path}: otherData must be an object, not {kind_of(info)}")
    return parse_trace(events, str(path), info, warmup)


def _check_events(events: list, path: str) -> None:
    """TraceError unless every event is an object whose args (if any) are an object, and every
    span and counter sample has a finite, non-negative time (and a span a duration, a memory
    sample its bytes): what the rest of the reader relies on."""
    for i, e in enumerate(events):
        if not isinstance(e, dict):
            raise TraceError(f"{path}: event {i} is not a JSON object")
        if not isinstance(e.get("pid", 0), (int, str)):
            raise TraceError(f"{path}: event {i} ({e.get('name')!r}): its pid is not a number")
        if not isinstance(e.get("name", ""), str) or not isinstance(e.get("tid", 0), (int, str)):
            raise TraceError(f"{path}: event {i}: its name is not a string or its tid not a number")
        if not isinstance(e.get("args", {}), dict):
            raise TraceError(f"{path}: event {i} ({e.get('name')!r}): its args are not an object")
        if not isinstance(e.get("args", {}).get("kind", ""), str):
            raise TraceError(f"{path}: event {i} ({e.get('name')!r}): its kind is not a string")
        timed: dict[object, tuple[str, ...]] = {"X": ("ts", "dur"), "C": ("ts",)}
        fields = timed.get(e.get("ph"), ())
        if e.get("ph") == "C" and e.get("name") == "memory":
            fields += ("bytes",)
        for key in fields:
            value = e.get("args", {}).get(key) if key == "bytes" else e.get(key, 0.0)
            if (
                isinstance(value, bool)
                or not isinstance(value, (int, float))
                or not math.isfinite(value)
                or value < 0
            ):
                raise TraceError(
                    f"{path}: event {i} ({e.get('name')!r}): {key} is {value!r}, "
                    "not a finite number of at least 0"
                )


def _whole(e: dict, key: str, path: str) -> int:
    """The span's args[key], a whole number of at least 0 (a stage, micro-batch or peer)."""
    value = e["args"].get(key) if isinstance(e.get("args"), dict) else None
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise TraceError(
            f"{path}: span {e.get('name')!r} lacks its {key} (a whole number of "
            f"at least 0, not {value!r})"
        )
    return value


def _check_overlaps(steps: list[MeasuredStep], path: str) -> None:
    """TraceError where two compute spans of one device overlap by more than half the shorter
    one: a device computes one op at a time, so only its clock's jitter can make them touch
    (a trace of two runs, or edited by hand, overlaps by whole spans)."""
    ops = sorted((op for s in steps for op in s.ops), key=lambda op: (op.device, op.start))
    for a, b in pairwise(ops):
        if a.device == b.device and a.end - b.start > min(a.end - a.start, b.end - b.start) / 2:
            raise TraceError(
                f"{path}: device {a.device} runs {a.kind}{a.stage}:{a.mb} and "
                f"{b.kind}{b.stage}:{b.mb} at the same time ({a.start:.6f}-"
                f"{a.end:.6f} s and {b.start:.6f}-{b.end:.6f} s), which one device "
                "cannot: is this one run's trace?"
            )


def _pipeline_devices(events: list[dict]) -> tuple[dict[object, int], list[str]]:
    """Which pids are which pipeline device (data-parallel copy 0 only), and the note a
    data-parallel trace gets."""
    device_of: dict[object, int] = {}  # keyed by the trace's pids, numbers or strings
    names = {
        e.get("pid"): e.get("args", {}).get("name", "")
        for e in events
        if e.get("ph") == "M" and e.get("name") == "process_name"
    }
    for pid, name in names.items():
        m = _NAME.fullmatch(str(name))
        if m and int(m.group(2) or 0) == 0:
            device_of[pid] = int(m.group(1))
    notes = []
    if any((m := _NAME.fullmatch(str(n))) and m.group(2) for n in names.values()):
        notes.append("data-parallel trace: figures are those of copy 0")
    return device_of, notes


def _device(pid, device_of: dict[object, int], path: str) -> int | None:
    """The pipeline device of a pid (the pid itself when no process is named); None for a
    process that is not one."""
    d = device_of.get(pid) if device_of else (pid if isinstance(pid, int) else None)
    if d is not None and not 0 <= d < limits.MAX_DEVICES:
        raise TraceError(
            f"{path}: device {d} (pid {pid!r}) is past octodsl's limit of "
            f"{limits.MAX_DEVICES} devices"
        )
    return d


def _span_steps(
    spans: list[dict], device_of: dict[object, int], path: str
) -> dict[int, MeasuredStep]:
    """The spans grouped into steps: the k-th span of a name on a device is in step k."""
    counts: dict[tuple, int] = defaultdict(int)
    per_step: dict[int, MeasuredStep] = {}

    def step(key: tuple) -> MeasuredStep:
        k = counts[key]
        counts[key] += 1
        if k not in per_step:
            per_step[k] = MeasuredStep(k, [], [], {})
        return per_step[k]

    for e in sorted(spans, key=lambda e: e.get("ts", 0.0)):
        d = _device(e.get("pid"), device_of, path)
        if d is None:
            continue
        args = e.get("args") or {}
        kind = args.get("kind")
        start = float(e.get("ts", 0.0)) / 1e6
        end = start + float(e.get("dur", 0.0)) / 1e6
        if e.get("tid") == 0 and kind in OP_KINDS:
            step((d, "op", e.get("name"))).ops.append(
                OpSpan(d, kind, _whole(e, "stage", path), _whole(e, "mb", path), start, end)
            )
        elif e.get("tid") == 0 and kind == "optimizer":
            step((d, "optimizer")).updates[d] = (start, end)
        elif e.get("tid") == 1 and kind in ("send", "recv"):
            at = step((d, kind, e.get("name")))
            try:
                op = Op.parse(str(e.get("name")))
            except PlanError as err:  # a message not named after its producing op
                raise TraceError(f"{path}: {err.message}") from None
            peer = _whole(e, "peer", path) if "peer" in args else -1
            at.messages.append(
                MeasuredMessage(d, kind, op.kind.value, op.stage, op.mb, peer, start, end)
            )
    return per_step


def _memory_samples(
    events: list[dict], device_of: dict[object, int], path: str
) -> dict[int, list[tuple[float, float]]]:
    """(time, bytes) of each device's memory counter."""
    memory: dict[int, list[tuple[float, float]]] = defaultdict(list)
    for e in events:
        if e.get("ph") == "C" and e.get("name") == "memory":
            d = _device(e.get("pid"), device_of, path)
            if d is not None:
                memory[d].append(
                    (float(e.get("ts", 0.0)) / 1e6, float(e.get("args", {}).get("bytes", 0.0)))
                )
    return dict(memory)


def parse_trace(
    events: list[dict], path: str = "<trace>", info: dict | None = None, warmup: int = 1
) -> MeasuredTrace:
    """The steps of a trace's events; TraceError when they are not a measured run's."""
    _check_events(events, path)
    device_of, notes = _pipeline_devices(events)
    spans = [e for e in events if e.get("ph") == "X"]
    if not spans:
        raise TraceError(f"{path}: the trace has no spans")
    per_step = _span_steps(spans, device_of, path)
    steps = [per_step[k] for k in sorted(per_step) if per_step[k].ops]
    if not steps:
        raise TraceError(f"{path}: the trace has no compute ops (F, B, W, BW spans on thread 0)")
    _check_overlaps(steps, path)
    devices = 1 + max(op.device for s in steps for op in s.ops)
    for s in steps:
        s.start = min(op.start for op in s.ops)
        s.end = max(op.end for op in s.ops)
    for a, b in pairwise(steps):
        a.period = b.start - a.start
    if len(steps) < warmup + 2:
        notes.append(
            f"{len(steps)} step(s) in the trace, {warmup} not timed: the iteration time is "
            "the span of the ops (the optimizer step and the time between steps are not "
            f"seen); record {warmup + 2} or more"
        )
    memory = _memory_samples(events, device_of, path)
    return MeasuredTrace(path, devices, steps, memory, dict(info or {}), notes, warmup)


def check_against(trace: MeasuredTrace, plan: Plan) -> None:
    """Raise TraceError unless every step of the trace ran exactly the plan's ops per device (an
    incomplete last step is dropped)."""
    if trace.devices != plan.devices:
        raise TraceError(f"{trace.path} has {trace.devices} devices, the plan {plan.devices}")
    want = sorted((d, op.kind.value, op.stage, op.mb) for d, _, op in plan.ops())
    good = []
    for s in trace.steps:
        got = sorted((op.device, op.kind, op.stage, op.mb) for op in s.ops)
        if got == want:
            good.append(s)
            continue
        if s is trace.steps[-1] and good and len(got) < len(want):
            trace.notes.append(f"step {s.index} is incomplete and left out")
            continue
        missing = sorted(set(want) - set(got))
        extra = sorted(set(got) - set(want))
        what = (
            (f"missing {_ops(missing)}" if missing else "")
            + ("; " if missing and extra else "")
            + (f"not in the plan: {_ops(extra)}" if extra else "")
        )
        raise TraceError(
            f"{trace.path}: step {s.index} did not run the plan's ops ({what or 'duplicates'}); "
            "was it recorded with this plan?"
        )
    trace.steps = good


def as_ran(plan: Plan, trace: MeasuredTrace) -> Plan:
    """The plan with the layers its stages ran, as the trace records them (otherData
    `partition`): a plan that names no layers gets the executor's split; one that names them
    must have run them (TraceError otherwise). Unchanged when the trace records no split."""
    ran = trace.info.get("partition")
    if ran is None:
        return plan
    if (
        not isinstance(ran, list)
        or len(ran) != plan.num_stages
        or not all(
            isinstance(r, list)
            and len(r) == 2
            and all(
                isinstance(x, int) and not isinstance(x, bool) and 0 <= x < limits.MAX_LAYERS
                for x in r
            )
            and r[0] <= r[1]
            for r in ran
        )
    ):
        raise TraceError(
            f"{trace.path}: its partition is not [first, last] layers for each of the "
            f"plan's {plan.num_stages} stages: {str(ran)[:80]}"
        )
    if all(st.abstract for st in plan.stages):
        return replace(
            plan,
            stages=[
                replace(st, first=a, last=b) for st, (a, b) in zip(plan.stages, ran, strict=True)
            ],
        )
    for s, (st, (a, b)) in enumerate(zip(plan.stages, ran, strict=True)):
        if st.abstract or st.bounds != (a, b):
            got = "no layers" if st.abstract else f"layers {st.first}..{st.last}"
            raise TraceError(
                f"{trace.path}: stage {s} ran layers {a}..{b}, but the plan gives it "
                f"{got}: was it recorded with this plan?"
            )
    return plan


def _ops(items) -> str:
    shown = [f"{Op(OpKind(k), s, m)} on device {d}" for d, k, s, m in items[:3]]
    return ", ".join(shown) + (f" and {len(items) - 3} more" if len(items) > 3 else "")
