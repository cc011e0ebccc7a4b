"""Where a simulated iteration loses time, and so which phase the next round works on.

Per device the idle time splits into the lead (before its first op), the tail (after its last)
and the gaps between. Stage imbalance shows as the busiest device's excess over the mean; fill
and drain as lead and tail; scheduling as gaps, and as expert all-to-alls run in line (which
the schedule phase's overlap groups may hide). Memory over the limit comes before all; within
it, the memory phase (recompute traded for micro-batches in flight) comes after all when asked.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ...sim import SimResult
from .moves.overlap import exposed_all_to_all

PHASES = ("memory", "partition", "placement", "schedule")


@dataclass(frozen=True)
class Bottleneck:
    imbalance: float
    """(busiest device's compute - mean compute) / iteration time."""
    fill: float
    """Mean lead + tail idle / iteration time."""
    gaps: float
    """Mean idle between ops / iteration time."""
    all_to_all: float
    """Mean expert all-to-all seconds not hidden by overlap groups / iteration time."""
    lead: np.ndarray
    tail: np.ndarray
    """Per device, seconds."""

    def phases(self, over_memory: bool, memory_within: bool = False) -> list[str]:
        """Phases by the share of time each could win back, the paper's order on ties; memory
        first when over the limit, else last with `memory_within` (recompute may pay: tried
        first when near the limit, it cost more rounds than it won on the benchmark)."""
        share = {
            "partition": self.imbalance,
            "placement": self.fill,
            "schedule": self.gaps + self.all_to_all,
        }
        return (
            ["memory"] * over_memory
            + sorted(share, key=lambda k: -share[k])
            + ["memory"] * (memory_within and not over_memory)
        )


def diagnose(result: SimResult) -> Bottleneck:
    p = result.program
    T = result.iteration_time
    lead = np.zeros(p.devices)
    tail = np.full(p.devices, T)
    for d in range(p.devices):
        lo, hi = p.order_ptr[d], p.order_ptr[d + 1]
        if hi > lo:
            lead[d] = result.start[p.order_nodes[lo]]
            tail[d] = T - result.end[p.order_nodes[hi - 1]]
    gaps = result.idle - lead - tail
    exposed = exposed_all_to_all(result)
    busy = result.busy
    return Bottleneck(
        float((busy.max() - busy.mean()) / T),
        float((lead + tail).mean() / T),
        float(gaps.mean() / T),
        0.0 if exposed is None else float(exposed.mean() / T),
        lead,
        tail,
    )
