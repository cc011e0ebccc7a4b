"""Classic pipeline schedules as .octo plans (`octodsl gen`).

Each schedule algorithm computes every device's order, phase by phase (phases.py); the plan is
written as .octo text through the template (render.py), one comment per phase, and `generate`
returns what the real parser makes of that text.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from pydantic import ValidationError

from ..errors import OctoError
from ..lang import parse_plan
from ..plan import RUNTIME_FIELDS, Header, Plan, Stage
from ..version import made_by
from .classic import gpipe, interleaved, one_f_one_b
from .dualpipe import dualpipe_v
from .model_partition import METHODS as PARTITIONS
from .model_partition import model_stages
from .phases import PhasedSchedule, ScheduleError
from .render import render_plan
from .zero_bubble import EQUAL_TIMES, Times, zb_h1, zb_h2, zb_v, zb_v_handcrafted

__all__ = [
    "PARTITIONS",
    "SCHEDULES",
    "PhasedSchedule",
    "ScheduleError",
    "Times",
    "generate",
    "generate_text",
    "phased_schedule",
    "render_plan",
]

_SINGLE: dict[str, Callable[[int, int], PhasedSchedule]] = {
    "gpipe": gpipe,
    "1f1b": one_f_one_b,
    "zb-h1": zb_h1,
    "zb-h2": zb_h2,
}
"""Schedules with one stage per device."""
MESH_FIELDS = (
    "tp",
    "sequence_parallel",
    "gpus_per_node",
    "dp",
    "zero",
    "ep",
    *RUNTIME_FIELDS,
    "runtime",
    "grad_accum_dtype",
)
"""Header fields of the cluster a generated plan runs on (`generate_text(mesh=...)`)."""
_V_SHAPE = ("zb-v", "dualpipev")
"""Schedules with two stages per device in a V."""

SCHEDULES: tuple[str, ...] = ("gpipe", "1f1b", "interleaved", "zb-h1", "zb-h2", "zb-v", "dualpipev")

_TITLES = {
    "gpipe": "GPipe: every forward, then every backward",
    "1f1b": "1F1B: one forward, one backward in the steady phase",
    "interleaved": "Interleaved 1F1B (Megatron-LM), {chunks} chunks per device, looped placement",
    "zb-h1": "ZB-H1 (ZeroBubble): 1F1B's memory, weight gradients fill the drain",
    "zb-h2": "ZB-H2 (ZeroBubble): extra warm-up forwards, no bubble when F = B = W",
    "zb-v": "ZB-V (ZeroBubble): two chunks per device in a V",
    "dualpipev": "DualPipeV (DeepSeek / DeepSpeed): V placement, forward and backward overlapped",
}


def phased_schedule(
    name: str,
    devices: int,
    microbatches: int,
    chunks: int | None = None,
    times: Times | None = None,
) -> PhasedSchedule:
    """The schedule's stages, placement and phased orders; ScheduleError if the request does
    not suit it. `times` (F, B, W of one stage, default equal) is what zb-v below 2P-1
    micro-batches places its weight gradients for; the other orders do not depend on times."""
    if name not in SCHEDULES:
        raise ScheduleError(f"unknown schedule '{name}'; schedules are {', '.join(SCHEDULES)}")
    if devices < 1 or microbatches < 1:
        raise ScheduleError("devices and micro-batches must be at least 1")
    if times is not None and (len(times) != 3 or min(times) <= 0):
        raise ScheduleError(f"times are F, B and W, three positive numbers, not {times}")
    if name == "interleaved":
        return interleaved(devices, microbatches, 2 if chunks is None else chunks)
    if name in _V_SHAPE:
        if chunks not in (None, 2):
            raise ScheduleError(f"{name} places exactly 2 chunks per device, not {chunks}")
        if name == "zb-v":
            return zb_v(devices, microbatches, times or EQUAL_TIMES)
        return dualpipe_v(devices, microbatches)
    if chunks not in (None, 1):
        raise ScheduleError(f"{name} places one stage per device; --chunks is for interleaved")
    return _SINGLE[name](devices, microbatches)


def generate_text(
    name: str,
    devices: int,
    microbatches: int,
    chunks: int | None = None,
    model: str | None = None,
    partition: str = "time",
    times: Times | None = None,
    *,
    mesh: Mapping[str, int | bool | str] | None = None,
    **costs,
) -> str:
    """The schedule as .octo text, each phase introduced by a comment (`times`: see phased_schedule).

    Without `model` the plan is abstract (`stages N`). With one (built-in name or spec path)
    the header names it and its layers are cut into the stages by `partition`: "time"
    (balanced F+B+W time, the default), "parameters" or "equal"; `costs` go to the cost table
    (device, profile, microbatch_size, seq_len; the last two also into the header). `mesh`
    holds header fields of the cluster the plan runs on (tp, sequence_parallel,
    gpus_per_node, dp, zero, ep, the runtime fields), written into the header as given."""
    phased = phased_schedule(name, devices, microbatches, chunks, times)
    v = chunks or 2
    plan_name = f"{name}-p{devices}-m{microbatches}" + (f"-v{v}" if name == "interleaved" else "")
    title = [_TITLES[name].format(chunks=v) + f"; {devices} devices, {microbatches} micro-batches."]
    stages = [Stage() for _ in range(phased.num_stages)]
    unknown = set(mesh or {}) - set(MESH_FIELDS)
    if unknown:
        raise ScheduleError(
            f"mesh fields are {', '.join(MESH_FIELDS)}, not {', '.join(sorted(unknown))}"
        )
    try:
        header = Header.model_validate(
            {"name": plan_name, "devices": devices, "microbatches": microbatches, **(mesh or {})}
        )
    except ValidationError as e:
        raise ScheduleError(
            f"cannot write the header: {e.errors()[0]['loc'][0]} {e.errors()[0]['msg'].lower()}"
        ) from None
    if model is not None:
        try:
            stages, note = model_stages(
                model,
                phased.num_stages,
                partition,
                **costs,
                tp=header.tp,
                sp=header.sp,
                ep=header.ep,
            )
        except OctoError as e:
            raise ScheduleError(str(e)) from None
        shape = {k: costs[k] for k in ("microbatch_size", "seq_len") if costs.get(k) is not None}
        header = header.model_copy(update={"model": model, **shape})
        title.append(f"Layers of {model}: {note}.")
    if name == "zb-v" and not zb_v_handcrafted(devices, microbatches):
        f, b, w = times or EQUAL_TIMES
        title.append(f"Weight gradients placed for op times F={f:g}, B={b:g}, W={w:g}.")
    schedule, comments = phased.orders()
    title.append(f"Written by {made_by('gen')}.")
    return render_plan(Plan(header, stages, phased.placement, schedule), comments, "\n".join(title))


def generate(
    name: str,
    devices: int,
    microbatches: int,
    chunks: int | None = None,
    model: str | None = None,
    partition: str = "time",
    times: Times | None = None,
    *,
    mesh: Mapping[str, int | bool | str] | None = None,
    **costs,
) -> Plan:
    """The schedule as a Plan, parsed from `generate_text` (same arguments)."""
    text = generate_text(
        name, devices, microbatches, chunks, model, partition, times, mesh=mesh, **costs
    )
    return parse_plan(text, path="<gen>")
