"""Synthetic profiles and measured traces with known parameters, for the fit and compare tests.

A "measured" trace here is what the simulator predicts with a known calibration, laid out as the
executor writes traces (octodsl/trace.py) plus what calibration runs add (optimizer spans,
memory counters), repeated for several steps; so a fit of it must give the known parameters back.
"""

from __future__ import annotations

import json
from datetime import datetime, timezone
from pathlib import Path

import numpy as np

from octodsl.costs.profile import FittedLink, MeasuredLayer, Profile, ProfileCalibration
from octodsl.gen import generate
from octodsl.models import load_model
from octodsl.plan import Plan
from octodsl.sim import SimCosts, compile, simulate
from octodsl.trace import COMPUTE, TimedSpan, chrome_trace, comm_span, op_span

MODEL = "nemotron-h-tiny"
# Per kind: F, B, W seconds, act, act_w bytes (CPU-like magnitudes).
KIND_COSTS = {
    "embedding": (0.0005, 0.0001, 0.004, 1e3, 1e3),
    "mamba2": (0.017, 0.024, 0.009, 27e6, 27e6),
    "mlp": (0.009, 0.010, 0.0096, 7e6, 7e6),
    "attention": (0.0046, 0.008, 0.0025, 3e6, 3e6),
    "lm_head_loss": (0.032, 0.036, 0.027, 17e6, 17e6),
}

TRUE = ProfileCalibration(
    created="2026-01-01T00:00:00+00:00",
    source="synthetic",
    processes=[2, 4],
    link=FittedLink(latency=3e-4, bandwidth=2.5e9),
    op_scale={"F": 0.9, "B": 1.1, "W": 1.05, "BW": 0.95},
    op_overhead={"F": 0.002, "B": 0.003, "W": 0.001, "BW": 0.004},
    update_per_param=4e-9,
    step_overhead=0.03,
    cores=2.0,
    contention=0.05,
    act_w_extra={
        "mamba2": 3e6,
        "mlp": 3.2e6,
        "attention": 1e6,
        "lm_head_loss": 16e6,
        "embedding": 5e5,
    },
)


def profile(calibration: ProfileCalibration | None = None) -> Profile:
    spec = load_model(MODEL)
    groups: dict[object, list[int]] = {}
    for i, layer in enumerate(spec.layers):
        groups.setdefault(layer, []).append(i)
    layers = []
    for idx in groups.values():
        kind = spec.layers[idx[0]].kind
        f, b, w, act, act_w = KIND_COSTS[kind]
        layers.append(
            MeasuredLayer(
                layers=idx,
                kind=kind,
                f=f,
                b=b,
                w=w,
                act=act,
                act_w=act_w,
                params=spec.layer_params(idx[0]),
                out_bytes=float(spec.tokens * spec.hidden * 4),
            )
        )
    return Profile(
        model=spec,
        device="cpu",
        device_name="synthetic CPU",
        threads=1,
        memory_method="synthetic",
        warmup=0,
        repeats=1,
        bytes_per_param=16,
        torch_version="none",
        created=datetime.now(timezone.utc).isoformat(),
        layers=layers,
        calibration=calibration,
    )


def write_profile_file(path: Path, calibration: ProfileCalibration | None = None) -> Path:
    path.write_text(profile(calibration).model_dump_json(indent=1))
    return path


def plan(schedule: str, devices: int, microbatches: int, tmp: Path | None = None) -> Plan:
    """A classic plan over the model, balanced by the synthetic profile's time."""
    prof_path = (tmp or Path("/tmp")) / f"synthetic-{schedule}-{devices}.profile.json"
    write_profile_file(prof_path)
    return generate(schedule, devices, microbatches, model=MODEL, profile=str(prof_path))


def measured_trace(
    plan: Plan,
    calibration: ProfileCalibration = TRUE,
    steps: int = 4,
    slowdown: float = 1.0,
    noise: float = 0.0,
    seed: int = 0,
    memory: bool = True,
) -> dict:
    """The Chrome trace a run of `plan` would record if the simulator with `calibration` were
    exact (times stretched by `slowdown`, op durations jittered by `noise`)."""
    prof = profile(calibration)
    table = prof.cost_table("<synthetic>")
    result = simulate(compile(plan), SimCosts.from_table(table, plan), table.calibration.link)
    rng = np.random.default_rng(seed)
    T = result.iteration_time * slowdown
    spans: list[TimedSpan] = []
    for k in range(steps):
        t0 = 1.0 + k * T
        for op in result.ops():
            jitter = 1 + noise * rng.standard_normal() if noise else 1.0
            a = t0 + op.start * slowdown
            spans.append(
                op_span(
                    op.device,
                    op.kind,
                    op.stage,
                    op.mb,
                    a,
                    a + (op.end - op.start) * slowdown * jitter,
                )
            )
        for m in result.messages():
            spans.append(
                comm_span(
                    m.src,
                    "send",
                    m.kind,
                    m.stage,
                    m.mb,
                    m.dst,
                    t0 + m.start * slowdown,
                    t0 + m.end * slowdown,
                )
            )
            spans.append(
                comm_span(
                    m.dst,
                    "recv",
                    m.kind,
                    m.stage,
                    m.mb,
                    m.src,
                    t0 + m.start * slowdown,
                    t0 + m.end * slowdown,
                )
            )
        for d, u in enumerate(result.update):
            a = t0 + result.update_start * slowdown
            spans.append(
                TimedSpan(
                    d, COMPUTE, "optimizer", a, a + float(u) * slowdown, {"kind": "optimizer"}
                )
            )
    trace = chrome_trace(spans)
    origin = min(s.start for s in spans)
    if memory:
        for d in range(plan.devices):
            static = float(result.memory.static[d])
            events = trace["traceEvents"]
            events.append(
                {"ph": "C", "pid": d, "name": "memory", "ts": 0.0, "args": {"bytes": static}}
            )
            p = result.program
            for n in p.order_nodes[p.order_ptr[d] : p.order_ptr[d + 1]]:
                # the worker samples after each op of the first step
                events.append(
                    {
                        "ph": "C",
                        "pid": d,
                        "name": "memory",
                        "ts": (1.0 + result.end[n] * slowdown - origin) * 1e6,
                        "args": {"bytes": float(result.memory.at_end[n])},
                    }
                )
    trace["otherData"] = {"octodsl": "synthetic"}
    return trace


def write_trace(path: Path, trace: dict) -> Path:
    path.write_text(json.dumps(trace))
    return path


def probe(calibration: ProfileCalibration = TRUE) -> list[tuple[int, float]]:
    link = calibration.link
    return [
        (n, link.latency + n / link.bandwidth)
        for n in (1 << 10, 1 << 14, 1 << 17, 1 << 20, 1 << 22)
    ]
