"""A plan's partition, placement and recompute modes as three tuples, the form the tuner's
moves edit.

`StageLayout(cuts, devices, recompute)`: stage s holds layers cuts[s] .. cuts[s + 1] - 1, runs
on device devices[s] and recomputes recompute[s] (default: nothing anywhere). A StageLayout is
hashable, so the tuner remembers which ones it has evaluated.
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import pairwise

from ...plan import DevicePlacement, Plan, PlanError, Recompute, Stage

SAVING = (Recompute.NONE, Recompute.SELECTIVE, Recompute.FULL)
"""Recompute modes by the activation bytes they save, least first (full keeps only the input)."""


@dataclass(frozen=True, slots=True)
class StageLayout:
    """Where a plan's stages are: the layers each holds and the device each runs on."""

    cuts: tuple[int, ...]
    """Stage boundaries: cuts[0] = 0, cuts[-1] = number of layers, strictly increasing."""
    devices: tuple[int, ...]
    """Device of each stage."""
    recompute: tuple[Recompute, ...] = ()
    """What each stage recomputes; () is none on every stage (and is stored as that)."""

    def __post_init__(self) -> None:
        if (
            len(self.cuts) != len(self.devices) + 1
            or self.cuts[0] != 0
            or any(a >= b for a, b in pairwise(self.cuts))
        ):
            raise ValueError(f"bad layout: cuts {self.cuts} for {len(self.devices)} stages")
        if not self.recompute:  # one spelling per layout: equal layouts hash alike
            object.__setattr__(self, "recompute", (Recompute.NONE,) * len(self.devices))
        elif len(self.recompute) != len(self.devices):
            raise ValueError(
                f"bad layout: {len(self.recompute)} recompute modes for {len(self.devices)} stages"
            )

    @property
    def num_stages(self) -> int:
        return len(self.devices)

    @property
    def num_layers(self) -> int:
        return self.cuts[-1]

    @classmethod
    def of(cls, plan: Plan) -> StageLayout:
        """The layout of a plan whose stages name their layers; PlanError otherwise."""
        if any(st.abstract for st in plan.stages):
            raise PlanError("the plan's partition names no layers (an abstract plan)")
        return cls(
            tuple(st.bounds[0] for st in plan.stages) + (plan.stages[-1].bounds[1] + 1,),
            tuple(plan.stage_device()),
            tuple(plan.recompute()),
        )

    def stages(self) -> list[Stage]:
        return [
            Stage(a, b - 1, recompute=m)
            for (a, b), m in zip(pairwise(self.cuts), self.recompute, strict=True)
        ]

    def placement(self, num_devices: int) -> list[DevicePlacement]:
        return [
            DevicePlacement(d, tuple(stages))
            for d, stages in enumerate(self.device_stages(num_devices))
        ]

    def device_stages(self, num_devices: int) -> list[list[int]]:
        out: list[list[int]] = [[] for _ in range(num_devices)]
        for s, d in enumerate(self.devices):
            out[d].append(s)
        return out

    def with_cuts(self, cuts) -> StageLayout:
        """New cuts, the same number of stages: each keeps its device and recompute mode."""
        return StageLayout(tuple(int(c) for c in cuts), self.devices, self.recompute)

    def with_recompute(self, modes) -> StageLayout:
        return StageLayout(self.cuts, self.devices, tuple(modes))


def looped(num_devices: int, chunks: int) -> tuple[int, ...]:
    """Stage s on device s mod P, `chunks` stages per device (1F1B's and interleaved's)."""
    return tuple(s % num_devices for s in range(num_devices * chunks))


def v_shape(num_devices: int) -> tuple[int, ...]:
    """Down the devices and back up: device d holds stages d and 2P - 1 - d (ZB-V's)."""
    return tuple(range(num_devices)) + tuple(reversed(range(num_devices)))


def even_cuts(num_layers: int, num_stages: int) -> tuple[int, ...]:
    """Equal layer counts: the starting point before any balancing."""
    return tuple(round(num_layers * i / num_stages) for i in range(num_stages + 1))
