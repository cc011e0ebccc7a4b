"""Memory moves: bring a device's peak under the limit without touching the partition.

`advance_w` runs, just before the op at which a device peaks, the oldest W whose B ran before
it: the W's held activations are released before the peak instead of after. A W has no
dependants, so moving it earlier never deadlocks.
"""

from __future__ import annotations

from ....plan import OpKind, Plan
from ....sim import SimResult
from .schedule import advance


def advance_w(plan: Plan, result: SimResult, device: int) -> Plan | None:
    """The plan with one W moved before `device`'s peak; None if no W can move there."""
    p = result.program
    peak_node = int(result.memory.peak_node[device])
    nodes = p.order_nodes[p.order_ptr[device] : p.order_ptr[device + 1]].tolist()
    if peak_node not in nodes:
        return None
    at = nodes.index(peak_node)
    order = plan.schedule[device]
    before = {(op.stage, op.mb) for slot in order[:at] for op in slot.ops if op.kind is OpKind.B}
    for j in range(at + 1, len(order)):
        op = order[j].ops[0]
        if op.kind is OpKind.W and len(order[j].ops) == 1 and (op.stage, op.mb) in before:
            return advance(plan, device, j, at)
    return None


def over_limit(result: SimResult, limit: float) -> list[int]:
    """Devices whose peak exceeds the limit, the worst first."""
    peak = result.peak_memory
    return sorted((d for d in range(len(peak)) if peak[d] > limit), key=lambda d: -peak[d])
