"""A SimResult for people (a short rich summary) and for scripts (the JSON contract)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from rich.console import Group
from rich.table import Table
from rich.text import Text

from ..costs.param_bytes import StaticBytes
from ..mesh import Mesh
from ..plan import RUNTIME_FIELDS, RUNTIME_NAMES, Recompute
from ..units import size
from .result import SimResult, Step


@dataclass(frozen=True)
class Segment:
    """Consecutive critical-path steps of one kind on one device (or one message)."""

    kind: str
    device: int
    first: str
    last: str
    steps: int
    start: float
    end: float
    peer: int | None = None

    def to_json(self) -> dict:
        out = {
            "kind": self.kind,
            "device": self.device,
            "first": self.first,
            "last": self.last,
            "steps": self.steps,
            "start": self.start,
            "end": self.end,
        }
        if self.peer is not None:
            out["to"] = self.peer
        return out

    def __str__(self) -> str:
        if self.kind == "message":
            return f"{self.first} {self.device}->{self.peer}"
        ops = self.first if self.steps == 1 else f"{self.first}..{self.last} ({self.steps} ops)"
        if self.kind == "compute":
            return f"device {self.device}: {ops}"
        if self.kind == "reduce-scatter" and self.first != self.kind:  # zero 2: after each W
            return f"reduce-scatter after {ops} on device {self.device}"
        return f"{_PATH_KINDS[self.kind]} on device {self.device}"


_PATH_KINDS = {
    "compute": "compute",
    "message": "messages",
    "allreduce": "all-reduce",
    "reduce-scatter": "reduce-scatter",
    "slowed": "compute slowed by the collectives under it",
    "update": "optimizer step",
    "all-gather": "all-gather",
    "tied-allreduce": "tied embeddings' all-reduce",
}
"""Critical-path step kinds, as the summary names them."""
_MERGED = ("compute", "reduce-scatter")
"""Step kinds whose runs on one device make one segment."""


def path_segments(steps: list[Step]) -> list[Segment]:
    """Merge runs of compute steps (and of zero 2's reduce-scatters) on the same device;
    messages stay one segment each, free ones (no time) are left out."""
    out: list[Segment] = []
    for s in steps:
        if s.kind == "message" and s.end == s.start:
            continue
        prev = out[-1] if out else None
        if prev and s.kind in _MERGED and prev.kind == s.kind and prev.device == s.device:
            out[-1] = Segment(
                s.kind, s.device, prev.first, s.label, prev.steps + 1, prev.start, s.end
            )
        else:
            out.append(Segment(s.kind, s.device, s.label, s.label, 1, s.start, s.end, s.peer))
    return out


def to_json(
    result: SimResult,
    *,
    link: str,
    memory_limit: int | None = None,
    simulate_seconds: float | None = None,
) -> dict:
    """The `octodsl simulate --json` object: times in seconds, memory in bytes, one entry per
    device in the per-device lists."""
    p = result.program
    h = p.plan.header
    stage_device = p.stage_device.tolist()
    costs = result.costs
    pb = costs.param_bytes
    recompute = p.plan.recompute()
    return {
        "plan": h.name,
        "devices": p.devices,
        "microbatches": p.microbatches,
        "dp": result.dp,
        "zero": result.zero,
        "tp": h.tp,
        "sequence_parallel": h.sp,
        "ep": h.ep,
        "mesh": _mesh_json(result),
        "costs": result.costs.source,
        "link": link,
        "links": {
            kind: {"link": x.link, "busy": x.busy.tolist(), "total": x.total}
            for kind, x in result.link_busy().items()
        },
        "iteration_time": result.iteration_time,
        "pipeline_time": result.pipeline_time,
        "throughput": result.throughput,
        "bubble_ratio": result.bubble_ratio,
        "bubble_ratios": result.bubble_ratios.tolist(),
        "overlap_rate": result.overlap_rate,
        "lower_bound": result.lower_bound,
        "efficiency": result.efficiency,
        "busy": result.busy.tolist(),
        "idle": result.idle.tolist(),
        "comm": result.comm.tolist(),
        "comm_exposed": result.comm_exposed.tolist(),
        "allreduce_time": result.allreduce.tolist(),
        "reduce_scatter_time": result.reduce_scatter.tolist(),
        "all_gather_time": result.all_gather.tolist(),
        "all_to_all_time": result.all_to_all.tolist(),
        "dp_comm_exposed": result.dp_exposed.tolist(),
        "dp_slowed": result.dp_comm.slowed.tolist(),
        "runtime": {name: getattr(h, name) for name in RUNTIME_FIELDS},
        "exposed": {kind: seconds.tolist() for kind, seconds in result.exposed().items()},
        "update_time": result.update.tolist(),
        "param_bytes": None if pb is None else _param_bytes_json(pb, costs.zero, costs.dp),
        "static": [_static_json(result, d) for d in range(p.devices)],
        "peak_memory": result.peak_memory.tolist(),
        "peak_ops": result.peak_ops(),
        "memory_limit": memory_limit,
        "stages": [
            {
                "stage": s,
                "device": stage_device[s],
                "F": c.f,
                "B": c.b,
                "W": c.w,
                "send_bytes": c.send_bytes,
                "act": c.act,
                "act_b": c.act_b,
                "act_w": c.act_w,
                "static": c.static,
                "recompute": recompute[s].value,
            }
            for s, c in enumerate(costs.stages)
        ],
        "critical_path": [seg.to_json() for seg in path_segments(result.critical_path())],
        "simulate_seconds": result.seconds if simulate_seconds is None else simulate_seconds,
    }


def _mesh(result: SimResult) -> Mesh:
    h = result.program.plan.header
    return Mesh(h.tp, result.devices, result.dp, h.gpus_per_node, h.ep)


def _mesh_json(result: SimResult) -> dict:
    """tp x pp x dp GPUs on nodes (the dp of the simulation, which may override the plan's)."""
    m = _mesh(result)
    return {
        "tp": m.tp,
        "pp": m.pp,
        "dp": m.dp,
        "world": m.world,
        "nodes": m.nodes,
        "gpus_per_node": m.gpus_per_node,
    }


def _links_line(result: SimResult) -> str:
    """'tp nvlink 3.1 ms, pipeline nvlink 1.2 ms + ib-ndr 0.4 ms, dp ib-ndr 20 ms' (the busiest
    device's seconds of each), leaving out what moves nothing."""
    busy = result.link_busy()
    parts = []
    for label, kinds in (
        ("tp", ("tp",)),
        ("pipeline", ("pipeline_intra_node", "pipeline_inter_node")),
        ("dp", ("dp_intra_node", "dp_inter_node")),
        ("tied embeddings", ("tied",)),
    ):
        shown = [
            f"{busy[k].link} {_time(float(busy[k].busy.max(initial=0.0)))}"
            for k in kinds
            if k in busy and busy[k].busy.any()
        ]
        if shown:
            parts.append(f"{label} " + " + ".join(shown))
    return ", ".join(parts)


def _param_bytes_json(pb: StaticBytes, zero: int, dp: int) -> dict:
    """The runtime's bytes per parameter by part on one copy (dp 1), and on each of dp; the
    dtype it accumulates the gradients in and the bytes per gradient its reduction moves."""
    one = pb.sharded(zero, 1)
    return {
        "runtime": pb.runtime,
        "grad_accum_dtype": pb.accum_dtype,
        "grad_reduce_bytes": pb.reduce_bytes,
        "weights": one.weights,
        "grads": one.grads,
        "optimizer": one.optimizer,
        "total": one.total,
        "per_device": pb.per_device(zero, dp),
    }


def _static_json(result: SimResult, device: int) -> dict:
    """A device's static bytes, split by part after sharding when the per-parameter bytes are
    known (else the parts are null)."""
    stages = np.flatnonzero(result.program.stage_device == device).tolist()
    parts = [result.costs.static_parts(s) for s in stages]
    total = float(result.memory.static[device])
    if any(x is None for x in parts):
        return {"weights": None, "grads": None, "optimizer": None, "total": total}
    known = [x for x in parts if x is not None]
    return {
        "weights": sum(x.weights for x in known),
        "grads": sum(x.grads for x in known),
        "optimizer": sum(x.optimizer for x in known),
        "total": total,
    }


def summary(
    result: SimResult,
    *,
    link: str,
    memory_limit: int | None = None,
    simulate_seconds: float | None = None,
    path_shown: int = 8,
) -> Group:
    """A short summary: the headline numbers, a row per device, the critical path."""
    p = result.program
    h = p.plan.header
    t = result.iteration_time
    head = Text()
    head.append(f"{h.name}", style="bold")
    head.append(
        f": {p.devices} devices x {p.microbatches} micro-batches"
        + (f", TP {h.tp}" + ("" if h.sp else " without sequence parallelism") if h.tp > 1 else "")
        + (f", DP {result.dp}" if result.dp > 1 else "")
        + (f", EP {h.ep}" if h.ep > 1 else "")
        + (f", ZeRO {result.zero}" if result.zero else "")
        + "\n"
    )
    head.append(f"{result.costs.source or 'given costs'}; link {link}\n", style="dim")
    mesh = _mesh(result)
    if mesh.world > 1:
        head.append(
            f"mesh            tp {mesh.tp} x pp {mesh.pp} x dp {mesh.dp} = {mesh.world:,} "
            f"GPUs on {mesh.nodes:,} node{'s' * (mesh.nodes > 1)} of {mesh.gpus_per_node}"
            + (
                f"; ep {mesh.ep} of the dp copies, "
                + ("across nodes" if mesh.ep_spans_nodes else "inside a node")
                if mesh.ep > 1
                else ""
            )
            + "\n"
        )
    links = _links_line(result)
    if links:
        head.append(f"links           {links} (the busiest device)\n")
    head.append(
        f"iteration time  {_time(t)}   lower bound {_time(result.lower_bound)} "
        f"(efficiency {result.efficiency:.1%})\n"
    )
    if result.throughput is not None:
        head.append(f"throughput      {result.throughput:,.0f} tokens per GPU per second\n")
    head.append(
        f"bubble ratio    {result.bubble_ratio:.1%}   communication overlap "
        f"{result.overlap_rate:.1%}"
    )
    if result.allreduce.any():
        head.append(f"   DP all-reduce {_time(float(result.allreduce.max()))}")
    if result.reduce_scatter.any() or result.all_gather.any():
        dpc = (
            result.dp_comm
        )  # the reduction: a reduce-scatter, or with reduce_scatter false an all-reduce
        head.append(
            f"\nZeRO {result.zero}          {_PATH_KINDS[dpc.reduction_kind]} "
            f"{_time(float(dpc.reduction.max()))}, all-gather "
            f"{_time(float(result.all_gather.max()))}, exposed "
            f"{_time(float(result.dp_exposed.max()))} (the busiest device)"
        )
    exposed = _exposed_line(result)
    if exposed:
        head.append(f"\nexposed         {exposed}")
    static = _static_json(result, int(np.argmax(result.memory.static))) if p.devices else None
    if static is not None and static["weights"] is not None:
        pb = result.costs.param_bytes
        head.append(
            f"\nstatic memory   {size(static['total'], 2)} on the fullest device: weights "
            f"{size(static['weights'], 2)}, gradients {size(static['grads'], 2)}, "
            f"optimizer state {size(static['optimizer'], 2)}"
            + (
                f" ({pb.per_device(result.costs.zero, result.costs.dp):g} of "
                f"{pb.per_device(result.costs.zero, 1):g} bytes per parameter, "
                f"{RUNTIME_NAMES[pb.runtime]}'s)"
                if pb is not None and result.costs.ep == 1  # with ep the experts' differ
                else ""
            )
        )
    recompute = _recompute_line(p.plan.recompute())
    if recompute:
        head.append(f"\nrecompute       {recompute}")
    if memory_limit is not None:
        over = [d for d in range(p.devices) if result.peak_memory[d] > memory_limit]
        head.append(f"\nmemory limit    {size(memory_limit, 2)}")
        if over:
            head.append(
                f", exceeded on device{'s' * (len(over) > 1)} {', '.join(map(str, over))}",
                style="bold red",
            )

    table = Table(box=None, pad_edge=False, header_style="bold")
    for col in ("device", "stages", "busy", "bubble", "comm", "exposed", "peak memory", "at"):
        table.add_column(col, justify="left" if col in ("stages", "at") else "right")
    stages = p.plan.device_stages()
    peak_ops = result.peak_ops()
    for d in range(p.devices):
        peak = float(result.peak_memory[d])
        table.add_row(
            str(d),
            ",".join(map(str, stages[d])),
            _time(float(result.busy[d])),
            f"{result.bubble_ratios[d]:.1%}",
            _time(float(result.comm[d])),
            _time(float(result.comm_exposed[d])),
            Text(
                size(peak, 2),
                style="bold red" if memory_limit is not None and peak > memory_limit else "",
            ),
            peak_ops[d] or "",
        )

    segs = path_segments(result.critical_path())
    kinds = {k: sum(s.end - s.start for s in segs if s.kind == k) for k in _PATH_KINDS}
    path = Text("critical path: ", style="bold")
    path.append(
        f"{len(segs)} segments, "
        + ", ".join(
            f"{name} {_time(kinds[k])}"
            for k, name in _PATH_KINDS.items()
            if kinds[k] or k in ("compute", "message")
        )
        + "\n  "
    )
    shown = (
        [str(s) for s in segs]
        if len(segs) <= path_shown
        else (
            [str(s) for s in segs[: path_shown // 2]]
            + [f"... {len(segs) - path_shown} more ..."]
            + [str(s) for s in segs[-(path_shown // 2) :]]
        )
    )
    path.append("\n  -> ".join(shown))
    seconds = result.seconds if simulate_seconds is None else simulate_seconds
    foot = Text(f"simulated in {seconds * 1e3:.1f} ms", style="dim")
    return Group(head, Text(""), table, Text(""), path, foot)


_EXPOSED = {
    "tp": ("tp collectives", "overlap_tp_comm"),
    "all_to_all": ("expert all-to-all", None),
    "pipeline": ("pipeline messages", "overlap_p2p_comm"),
    "grad_reduce": ("gradient reduction", "overlap_grad_reduce"),
    "param_gather": ("parameter all-gather", "overlap_param_gather"),
    "tied": ("tied embeddings' all-reduce", None),
}


def _exposed_line(result: SimResult) -> str:
    """'tp collectives 3.1 ms (in line), pipeline messages 0.2 ms (overlapped), ...': each
    kind's exposed seconds on the device that has the most, and whether the plan overlaps it;
    kinds with nothing to move are left out."""
    h = result.program.plan.header
    parts = []
    for kind, seconds in result.exposed().items():
        name, field = _EXPOSED[kind]
        if kind == "pipeline" and not result.program.num_messages:
            continue
        if (
            kind == "tp"
            and h.tp == 1
            or kind == "all_to_all"
            and h.ep == 1
            or kind in ("grad_reduce", "param_gather")
            and (result.dp == 1 or kind == "param_gather" and result.zero == 0)
            or kind == "tied"
            and not seconds.any()
        ):
            continue
        parts.append(
            f"{name} {_time(float(seconds.max(initial=0.0)))} "
            f"({'overlapped' if field and getattr(h, field) else 'in line'})"
        )
    return ", ".join(parts)


def _recompute_line(modes: list[Recompute]) -> str:
    """'full: stages 3, 7; selective: stage 2', or '' when no stage recomputes."""
    parts = []
    for mode in (Recompute.FULL, Recompute.SELECTIVE):
        stages = [str(s) for s, m in enumerate(modes) if m is mode]
        if stages:
            parts.append(f"{mode}: stage{'s' * (len(stages) > 1)} {', '.join(stages)}")
    return "; ".join(parts)


def _time(seconds: float) -> str:
    if seconds == 0:
        return "0"
    if seconds >= 1:
        return f"{seconds:.3f} s"
    if seconds >= 1e-3:
        return f"{seconds * 1e3:.2f} ms"
    return f"{seconds * 1e6:.1f} µs"


def comparison(rows: list[tuple[str, SimResult]]) -> Table:
    """Several plans side by side, one row each; speed-up is against the first row."""
    table = Table(header_style="bold", box=None, pad_edge=False)
    for col in (
        "plan",
        "stages",
        "iteration",
        "tokens/GPU/s",
        "bubble",
        "overlap",
        "efficiency",
        "peak memory",
        "speed-up",
    ):
        table.add_column(col, justify="left" if col == "plan" else "right")
    base = rows[0][1].iteration_time
    for path, r in rows:
        p = r.program
        table.add_row(
            p.plan.header.name or path,
            str(p.plan.num_stages),
            _time(r.iteration_time),
            f"{r.throughput:,.0f}" if r.throughput is not None else "-",
            f"{r.bubble_ratio:.1%}",
            f"{r.overlap_rate:.1%}",
            f"{r.efficiency:.1%}",
            size(float(r.peak_memory.max()), 2),
            f"{base / r.iteration_time:.2f}x",
        )
    return table
