"""Placement moves: which stages live on which device, against fill and drain bubbles.

- `families`: the regular placements worth starting from (looped with 1-4 chunks, V);
- `disperse`: split a stage and place its second part on another device, so that a device that
  waits at the start gets early work (and, since backwards run in reverse, late work too);
- `exchange`: a device's early stage takes a layer from its neighbour while its late stage
  gives one back, or the reverse: device loads barely move, but the device's work shifts
  toward the start or the end of the micro-batch's path;
- `merge`: stages next to each other on one device become one (no message between them);
- `swap`: two stages exchange their devices, the cuts kept (a placement search under
  `--keep partition`).

Recompute modes go with the stages: the two halves of a dispersed stage keep its mode, a
merged stage the mode of its parts that saves the most memory (so that it still fits).
"""

from __future__ import annotations

from ....plan import Recompute
from ..layout import SAVING, StageLayout, looped, v_shape
from .partition import shift


def families(num_devices: int, num_layers: int) -> list[tuple[str, tuple[int, ...]]]:
    """Named regular placements whose stages the model's layers can fill."""
    out = [("v", v_shape(num_devices))] + [
        (f"loop{v}", looped(num_devices, v)) for v in (1, 2, 3, 4)
    ]
    return [(name, devs) for name, devs in out if len(devs) <= num_layers]


def disperse(layout: StageLayout, stage: int, device: int) -> StageLayout | None:
    """Split `stage` in the middle of its layers; the second half runs on `device`. None when
    the stage has one layer or already runs there."""
    a, b = layout.cuts[stage], layout.cuts[stage + 1]
    if b - a < 2 or layout.devices[stage] == device:
        return None
    cuts = layout.cuts[: stage + 1] + ((a + b) // 2,) + layout.cuts[stage + 1 :]
    devices = layout.devices[: stage + 1] + (device,) + layout.devices[stage + 1 :]
    modes = layout.recompute[: stage + 1] + layout.recompute[stage:]
    return StageLayout(cuts, devices, modes)


def exchange(layout: StageLayout, device: int, earlier: bool) -> StageLayout | None:
    """Move one layer of `device`'s work toward the start of the path (`earlier`) or the end:
    its first stage grows by its successor's first layer and its last stage gives its first
    layer to its predecessor (or the reverse). None if the device has one stage or a shift
    would empty a stage."""
    stages = [s for s, d in enumerate(layout.devices) if d == device]
    if len(stages) < 2:
        return None
    first, last = stages[0], stages[-1]
    step = 1 if earlier else -1
    out = shift(layout, first + 1, step)
    return shift(out, last, step) if out is not None else None


def merge(layout: StageLayout) -> StageLayout:
    """Neighbouring stages on the same device joined into one."""
    cuts: list[int] = [0]
    devices: list[int] = []
    modes: list[Recompute] = []
    for s, (d, m) in enumerate(zip(layout.devices, layout.recompute, strict=True)):
        if devices and devices[-1] == d:
            cuts[-1] = layout.cuts[s + 1]
            modes[-1] = max(modes[-1], m, key=SAVING.index)
        else:
            devices.append(d)
            cuts.append(layout.cuts[s + 1])
            modes.append(m)
    return StageLayout(tuple(cuts), tuple(devices), tuple(modes))


def swap(layout: StageLayout, a: int, b: int) -> StageLayout | None:
    """Stages `a` and `b` on each other's device; None when they share one."""
    if layout.devices[a] == layout.devices[b]:
        return None
    devices = list(layout.devices)
    devices[a], devices[b] = devices[b], devices[a]
    return StageLayout(layout.cuts, tuple(devices), layout.recompute)
