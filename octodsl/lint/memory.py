"""Lint's memory check: devices whose simulated peak memory exceeds the plan's limit."""

from __future__ import annotations

from ..costs.resolve import cost_table, header_costing
from ..errors import OctoError
from ..lang.errors import Diagnostic
from ..plan import Plan
from ..sim import SimCosts, compile, memory
from ..units import size

CODE = "E501"
DEFAULT_DEVICE = "H800"
"""Memory per op does not depend on the device's speed; the cost model still wants one."""


def memory_diagnostics(plan: Plan) -> list[Diagnostic]:
    """For a plan whose header names a model and a memory limit: an E501 error at the memory
    line for each device whose peak exceeds the limit (one GPU of its tp group, costed at the
    plan's tp and sequence parallelism), naming the op at the peak. Nothing when
    the model cannot be loaded or the plan's structure is broken (other checks report those)."""
    h = plan.header
    if h.model is None or h.memory is None:
        return []
    try:
        table = cost_table(model=h.model, device=DEFAULT_DEVICE, **header_costing(h))
        costs = SimCosts.from_table(table, plan)
        program = compile(plan)
    except OctoError:  # an unknown model (SpecError), a partition that does not fit (PlanError),
        # a tp the model does not split over (lint's tp check reports it)
        return []
    mem = memory(program, costs.stages)
    out = []
    for d, (peak, node) in enumerate(zip(mem.peak.tolist(), mem.peak_node.tolist(), strict=True)):
        if peak > h.memory:
            at = f" at {program.node_label(node)}" if node >= 0 else ""
            out.append(
                Diagnostic(
                    CODE,
                    f"device {d} peaks at {size(peak, 2)}{at}, {size(peak - h.memory, 2)} over the "
                    f"{size(h.memory, 2)} limit",
                    h.spans.get("memory"),
                    hint="run W ops earlier, hold fewer micro-batches in flight, move layers off "
                    "this device, recompute (a `recompute` section), shard with `zero 1` or "
                    "split the layers with a larger `tp`",
                )
            )
    return out
