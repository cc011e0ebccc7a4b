"""Small hand-written plans for the simulator's tests (classic schedules come from octodsl.gen)."""

from __future__ import annotations

from octodsl.plan import DevicePlacement, Header, Op, Plan, Slot, Stage, placement_loop


def make_plan(
    devices: int,
    microbatches: int,
    orders: list[list],
    num_stages: int | None = None,
    placement: list[tuple[int, ...]] | None = None,
    **header,
) -> Plan:
    """An abstract plan from per-device orders written as 'F0:1' strings or tuples of them
    (overlap groups); placement[d] lists device d's stages (default: looped)."""
    S = num_stages or devices
    place = (
        [DevicePlacement(d, tuple(st)) for d, st in enumerate(placement)]
        if placement
        else placement_loop(S, devices)
    )
    schedule = [
        [
            Slot(tuple(Op.parse(x) for x in (item if isinstance(item, tuple) else (item,))))
            for item in order
        ]
        for order in orders
    ]
    return Plan(
        Header(name="test", devices=devices, microbatches=microbatches, **header),
        [Stage() for _ in range(S)],
        place,
        schedule,
    )
