"""Scheduling moves: the order of ops on each device, the partition and placement kept.

- `rebuild`: a fresh order from the list scheduler (construct.py), with or without W held back
  for gaps;
- `advance`: move one op earlier in its device's order;
- `fill_gaps`: for the largest idle gaps of the busiest devices, advance a later op that was
  already ready when the gap opened: an F or B (advance into gaps) or a W (independent compute
  while the device waits on a message);
- `delay_w`: where the critical path waits because a W held the device, run the W after the
  op it delayed (W has no dependants but the optimizer step).

Advancing an op that was ready when the gap opened cannot deadlock: its producers finished
before any op it now overtakes started, so they never depend on those ops.
"""

from __future__ import annotations

import time
from dataclasses import replace

import numpy as np

from ....costs.table import Link
from ....optable import KIND_CODE
from ....plan import OpKind, Plan
from ....sim import SimResult
from ....sim.costs import SimCosts
from ....sim.program import CodedOrders
from ...problem import Problem
from .. import construct


def rebuild(
    plan: Plan,
    problem: Problem,
    w_gap: bool,
    pilot: bool = False,
    deadline: float | None = None,
) -> Plan:
    """The plan with the list scheduler's order for its partition and placement, within the
    problem's memory limit (`pilot`: improved by the pilot method, construct.build_schedule,
    which stops improving at `deadline`). The problem keeps the latest `_KEPT_ORDERS` (a search
    comes back to the same layout from other moves), but not a pilot's order the deadline may
    have cut short; a plan built from them shares their device orders and codes
    (`CodedOrders`: never edited in place) in a list of its own."""
    costs = problem.sim_costs(plan)
    key = (id(costs), tuple(plan.stage_device()), w_gap, pilot)
    kept = problem.schedules
    hit = kept.get(key)
    if hit is not None and hit[0] is costs:
        kept.move_to_end(key)
        orders = hit[1]
        assert isinstance(orders, CodedOrders) and orders.codes is not None
        return replace(plan, schedule=CodedOrders(orders, orders.codes))
    built = construct.build_schedule(
        *_args(plan, problem, w_gap, costs), pilot=pilot, deadline=deadline
    )
    if deadline is not None and time.perf_counter() >= deadline:
        return built
    kept[key] = (costs, built.schedule)
    if len(kept) > _KEPT_ORDERS:
        kept.popitem(last=False)
    return built


_KEPT_ORDERS = 64
"""Orders `rebuild` keeps per problem (up to a few MB: each holds its slots' references)."""


def pilot_seconds(plan: Plan, problem: Problem, w_gap: bool) -> float:
    """About how long `rebuild(..., pilot=True)` takes on `plan` (construct.pilot_seconds)."""
    return construct.pilot_seconds(*_args(plan, problem, w_gap, problem.sim_costs(plan)))


def _args(
    plan: Plan, problem: Problem, w_gap: bool, costs: SimCosts
) -> tuple[Plan, SimCosts, Link, int | None, bool, Link | None]:
    """The list scheduler's arguments for `plan` with its `costs` under the problem's memory
    limit."""
    return plan, costs, problem.link, problem.memory, w_gap, problem.inter_link


def advance(plan: Plan, device: int, src: int, dst: int) -> Plan:
    """Device `device`'s slot at index `src` moved to index `dst` (dst < src)."""
    order = list(plan.schedule[device])
    order.insert(dst, order.pop(src))
    schedule = list(plan.schedule)
    schedule[device] = order
    return replace(plan, schedule=schedule)


def ready_times(result: SimResult) -> np.ndarray:
    """Per node: when every input it needs had arrived (its local producers ended, its
    messages were received)."""
    p = result.program
    ready = np.zeros(p.num_nodes)
    src = np.repeat(np.arange(p.num_nodes), np.diff(p.out_ptr))
    arrive = np.where(p.out_msg >= 0, result.msg_end[np.maximum(p.out_msg, 0)], result.end[src])
    np.maximum.at(ready, p.out_dst, arrive)
    return ready


def gaps(result: SimResult, device: int) -> list[tuple[float, int]]:
    """(idle seconds, index of the slot after the gap) for each gap on a device, largest first."""
    p = result.program
    nodes = p.order_nodes[p.order_ptr[device] : p.order_ptr[device + 1]]
    if not len(nodes):
        return []
    ends = np.concatenate([[0.0], result.end[nodes[:-1]]])
    idle = result.start[nodes] - ends
    at = np.flatnonzero(idle > 1e-9)
    return sorted(((float(idle[i]), int(i)) for i in at), key=lambda g: (-g[0], g[1]))


def fill_gaps(
    plan: Plan, result: SimResult, kinds: tuple[OpKind, ...], devices: int = 2, per_device: int = 3
) -> list[Plan]:
    """Plans with one op of `kinds` advanced into one of the largest gaps of the `devices`
    busiest devices: the first later op that was ready when the gap opened and fits in it."""
    p = result.program
    ready = ready_times(result)
    # each node's slot's first op's kind (the program's nodes are the plan's slots, in order)
    of_kinds = np.isin(p.op_kind[p.op_ptr[:-1]], [KIND_CODE[k] for k in kinds])
    out = []
    for d in np.argsort(-result.busy, kind="stable")[:devices]:
        d = int(d)
        nodes = p.order_nodes[p.order_ptr[d] : p.order_ptr[d + 1]]
        for idle, i in gaps(result, d)[:per_device]:
            opened = float(result.end[nodes[i - 1]]) if i > 0 else 0.0
            later = nodes[i + 1 :]
            fits = np.flatnonzero(
                (ready[later] <= opened + 1e-12)
                & of_kinds[later]
                & (result.end[later] - result.start[later] <= idle + 1e-12)
            )
            if len(fits):
                out.append(advance(plan, d, i + 1 + int(fits[0]), i))
    return out


def delay_w(plan: Plan, result: SimResult, limit: int = 4) -> list[Plan]:
    """Plans with one W on the critical path moved after the op it held up."""
    p = result.program
    starts: dict[int, np.ndarray] = {}  # per device met: its nodes' starts, in its order
    out = []
    path = result.critical_nodes()
    for d, start in zip(p.node_dev[path].tolist(), result.start[path].tolist(), strict=True):
        if d not in starts:
            starts[d] = result.start[p.order_nodes[p.order_ptr[d] : p.order_ptr[d + 1]]]
        # A device's starts never decrease along its order: the last slot that starts when
        # the step does (a zero-second op may share its start) is at j.
        j = int(np.searchsorted(starts[d], start, side="right")) - 1
        if j <= 0 or starts[d][j] != start:
            continue
        at = p.order_ptr[d] + j
        if (
            plan.schedule[d][j - 1].ops[0].kind is OpKind.W
            and result.pred[p.order_nodes[at]] == p.order_nodes[at - 1]
        ):
            out.append(advance(plan, d, j, j - 1))
            if len(out) == limit:
                break
    return out
