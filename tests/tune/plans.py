"""Hand-written orders for the move tests."""

from __future__ import annotations

from octodsl.plan import Op, Slot
from octodsl.tune.pipeline.layout import StageLayout


def ops(text: str) -> list[Slot]:
    """'F0:0 B0:0 W0:0' -> slots."""
    return [Slot((Op.parse(item),)) for item in text.split()]


def with_orders(problem, layout: StageLayout, *orders: str):
    return problem.with_schedule(problem.skeleton(layout), [ops(o) for o in orders])
