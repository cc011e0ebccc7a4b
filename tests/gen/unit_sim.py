"""A tiny timing model for the schedule property tests (test-only; the project's simulator is
octodsl.sim): every op takes a fixed time by kind, messages are free, each device runs its
slots in order as soon as their inputs are done. An overlap group takes its longest op."""

from __future__ import annotations

from dataclasses import dataclass

from octodsl.dag import build_graph, execution_order
from octodsl.plan import OpKind, Plan

UNIT = {OpKind.F: 1.0, OpKind.B: 1.0, OpKind.W: 1.0, OpKind.BW: 2.0}
"""F = B = W, the setting the ZeroBubble paper states its bubbles for."""


@dataclass
class Timing:
    makespan: float
    busy: list[float]
    first: list[float]
    last: list[float]

    def idle_inside(self, d: int) -> float:
        """Time device d waits between its first op's start and its last op's end."""
        return self.last[d] - self.first[d] - self.busy[d]


def run(plan: Plan, cost: dict[OpKind, float] = UNIT) -> Timing:
    g = build_graph(plan)
    order = execution_order(g)
    assert order and isinstance(order[0], int), "the plan deadlocks"
    end = [0.0] * g.num_nodes
    free = [0.0] * plan.devices
    busy = [0.0] * plan.devices
    first = [float("inf")] * plan.devices
    for n in order:
        d = g.node_device[n]
        start = max([free[d]] + [end[e.src] for e in g.deps[n]])
        took = max(cost[op.kind] for op in g.node_ops[n])
        end[n] = free[d] = start + took
        busy[d] += took
        first[d] = min(first[d], start)
    return Timing(max(free), busy, first, free)


def peak_in_flight(plan: Plan) -> list[int]:
    """Per device, the most micro-batch-stages whose forward has run and whose weight gradient
    (W, or the fused BW) has not: the activations a device holds, in the paper's unit."""
    peaks = []
    for slots in plan.schedule:
        held = peak = 0
        for slot in slots:
            for op in slot.ops:
                held += {OpKind.F: 1, OpKind.W: -1, OpKind.BW: -1}.get(op.kind, 0)
            peak = max(peak, held)
        peaks.append(peak)
    return peaks
