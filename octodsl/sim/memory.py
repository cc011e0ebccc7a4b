"""Memory per device: static bytes plus activations, op by op in each device's order.

A device holds the static bytes (parameters, gradients, optimizer state) of its stages all the
time. F allocates its stage's activations when it starts (with recompute, only what it keeps);
B allocates what recompute brings back (`act_b`) when it starts and releases all but `act_w`
when it ends, W releases the rest when it ends, a fused BW allocates as B and releases all when
it ends (octodsl.costs.levers.op_bytes). An overlap group allocates for all its ops, then
releases for all. Since a device runs its ops one after another, the levels depend only on the order, not on timing: lint's memory check needs no walk.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from ..costs.table import StageCost
from .costs import SimCosts
from .jit import njit
from .program import SimProgram


@dataclass(frozen=True)
class Memory:
    static: np.ndarray
    """Per device: bytes held all the time."""
    at_start: np.ndarray
    """Per node: the device's bytes once the node has allocated (when it starts)."""
    at_end: np.ndarray
    """Per node: the device's bytes once the node has released (when it ends)."""
    peak: np.ndarray
    """Per device: the highest level."""
    peak_node: np.ndarray
    """Per device: the first node at which the level reaches the peak (-1 for an idle device)."""


def memory(program: SimProgram, costs: SimCosts | Sequence[StageCost]) -> Memory:
    costs = SimCosts.of(costs)
    alloc, release = costs.op_bytes
    static = np.bincount(
        program.stage_device, weights=costs.column("static"), minlength=program.devices
    )
    node_alloc = program.per_node(program.of_kind(alloc))
    node_release = program.per_node(program.of_kind(release))
    at_start, at_end, peak, peak_node = _levels(
        program.order_ptr, program.order_nodes, static, node_alloc, node_release
    )
    return Memory(static, at_start, at_end, peak, peak_node)


@njit
def _levels(order_ptr, order_nodes, static, alloc, release):
    P = order_ptr.shape[0] - 1
    at_start = np.zeros(alloc.shape[0])
    at_end = np.zeros(alloc.shape[0])
    peak = static.copy()
    peak_node = np.full(P, -1, np.int64)
    for d in range(P):
        level = static[d]
        for i in range(order_ptr[d], order_ptr[d + 1]):
            n = order_nodes[i]
            level += alloc[n]
            at_start[n] = level
            if level > peak[d] or peak_node[d] < 0:
                peak[d] = level
                peak_node[d] = n
            level -= release[n]
            at_end[n] = level
    return at_start, at_end, peak, peak_node
