"""What a schedule generator computes: the stages, their placement, and each device's order cut
into named phases. `generate` turns it into .octo text (one comment per phase) and parses that."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from ..errors import OctoError
from ..plan import DevicePlacement, Op, OpKind, Slot


class ScheduleError(OctoError):
    """A schedule cannot be generated for the requested devices / micro-batches / chunks; the
    message says what the schedule needs."""


@dataclass(slots=True)
class Phase:
    comment: str
    """One line for the plan, e.g. 'warm-up: forwards fill the pipeline'."""
    slots: list[Slot] = field(default_factory=list)


@dataclass(slots=True)
class PhasedSchedule:
    """A generated schedule: its stages' count and placement, and each device's order cut into
    commented phases."""

    num_stages: int
    placement: list[DevicePlacement]
    phases: list[list[Phase]]
    """phases[d]: device d's order, phase by phase."""

    def orders(self) -> tuple[list[list[Slot]], dict[int, dict[int, str]]]:
        """Each device's slots, and the phase comments in render_plan's form (device -> slot
        index -> comment); an empty phase gets no comment."""
        schedule: list[list[Slot]] = []
        comments: dict[int, dict[int, str]] = {}
        for d, phases in enumerate(self.phases):
            slots: list[Slot] = []
            comments[d] = {}
            for ph in phases:
                if ph.slots:
                    comments[d][len(slots)] = ph.comment
                    slots.extend(ph.slots)
            schedule.append(slots)
        return schedule, comments


class Order:
    """Builds one device's phases: `phase(comment)` starts a phase, `add` appends a slot.

    `next(kind, stage)` is the op of that kind and stage for the next micro-batch: each
    (kind, stage) counts up from 0, as the reference implementations count. With `keep`, ops
    of micro-batches from `keep` on are left out (counting goes on)."""

    def __init__(self, keep: int | None = None) -> None:
        self.phases: list[Phase] = []
        self.keep = keep
        self._counts: Counter[tuple[OpKind, int]] = Counter()

    def phase(self, comment: str) -> None:
        self.phases.append(Phase(comment))

    def add(self, *ops: Op) -> None:
        """One slot; several ops form an overlap group."""
        if self.keep is None or all(o.mb < self.keep for o in ops):
            self.phases[-1].slots.append(Slot(tuple(ops)))

    def next(self, kind: OpKind, stage: int) -> Op:
        m = self._counts[kind, stage]
        self._counts[kind, stage] = m + 1
        return Op(kind, stage, m)

    def put(self, kind: OpKind, stage: int) -> None:
        """add(next(kind, stage))."""
        self.add(self.next(kind, stage))

    def count(self, kind: OpKind, stage: int) -> int:
        """How many ops of this kind and stage `next` has handed out."""
        return self._counts[kind, stage]


def F(stage: int, mb: int) -> Op:
    return Op(OpKind.F, stage, mb)


def B(stage: int, mb: int) -> Op:
    return Op(OpKind.B, stage, mb)


def W(stage: int, mb: int) -> Op:
    return Op(OpKind.W, stage, mb)


def BW(stage: int, mb: int) -> Op:
    return Op(OpKind.BW, stage, mb)
