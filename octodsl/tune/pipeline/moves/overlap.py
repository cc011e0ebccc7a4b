"""Overlap-group moves: which ops of a device share a slot, `(F0:7 & B7:3)`, so that each op's
expert all-to-alls run under the other's compute (`SimProgram.per_slot`); the partition, the
placement and the rest of the order kept.

- `pair`: two single ops of one device, a forward and a backward (B, BW or W: lint's W403
  warns about two of one direction), become one group at the earlier one's place. Candidates
  (`candidates`) are ops at most `WINDOW` apart whose group would hide some all-to-all, the
  most hidden first; only with all-to-alls (`ep` > 1 and MoE layers) are there any.
- `unpair`: a group becomes its two ops in turn, forward first or backward first, at its
  place. A group starts both ops together, so it waits for the later one's inputs: where that
  costs more than the group hides, running them in turn is faster (jamba-v0.1 at ep 8).

A pair cannot deadlock when the later op was ready when the earlier one started (in the
simulation of the current order) and the earlier one took time: the later op's producers all
ended before the earlier op started, so none of them depends on an op the group now runs
before; and the group's dependants each started after it ended. Disjoint pairs chosen so
together stay safe, on one device or several: give each group the start of its earlier op and
every other op its own start; every dependency then runs forward in that time (through a group
strictly), so the new graph has no cycle. Splitting a group never deadlocks: its two ops need
nothing from each other, and each waits for no more than the group did.
"""

from __future__ import annotations

from dataclasses import replace
from typing import NamedTuple

import numpy as np

from ....optable import KIND_CODE
from ....plan import OpKind, Plan, Slot
from ....sim import SimResult
from ....sim.program import group_seconds
from .schedule import ready_times

WINDOW = 4
"""The farthest apart (in slots of one device's order) two ops may be to pair."""
SINGLES = 2
"""Single pairs (the most hidden first) and single groups (the costliest first) tried per
round, after the moves of many at once."""

_F = KIND_CODE[OpKind.F]


class Pair(NamedTuple):
    hidden: float
    """Seconds of all-to-all the group would hide (its ops in turn less the group's time)."""
    device: int
    first: int
    """Index of the earlier op's slot in the device's order; the group goes there."""
    second: int


def exposed_all_to_all(result: SimResult) -> np.ndarray | None:
    """Per device: the expert all-to-all seconds no overlap group hides; None when the plan's
    stages have none (no `ep` or no MoE layers: the common case, answered without arrays)."""
    if not any(c.ep_f or c.ep_b for c in result.costs.stages):
        return None
    return result.all_to_all - result.all_to_all_hidden


def op_seconds(result: SimResult) -> tuple[np.ndarray, np.ndarray]:
    """Per op of the program: its seconds and the expert all-to-all seconds among them, as the
    simulator costs them (an F's `ep_f`, a B's or fused BW's `ep_b`, a W none)."""
    p = result.program
    column = result.costs.column
    ep_f, ep_b = column("ep_f"), column("ep_b")
    seconds = p.per_op(column("f"), column("b"), column("w"), column("fused_backward"))
    return seconds, p.per_op(ep_f, ep_b, np.zeros_like(ep_f), ep_b)


def hidden(s1, a1, s2, a2):
    """What a group of two ops of s1 and s2 seconds, a1 and a2 of them all-to-alls, saves on
    the two in turn (the simulator's `group_seconds`). Arrays or floats."""
    return s1 + s2 - group_seconds(s1 - a1 + s2 - a2, a1 + a2, np.maximum(s1, s2))


def candidates(result: SimResult) -> list[Pair]:
    """Every pair of single ops of one device, a forward and a backward at most `WINDOW` slots
    apart, the later one ready when the earlier one started and the earlier one taking time
    (so the group cannot deadlock), whose group would hide some all-to-all: the most hidden
    first (then by device and place)."""
    if exposed_all_to_all(result) is None:
        return []
    seconds, comm = op_seconds(result)
    p = result.program
    seq = p.order_nodes
    dev = np.repeat(np.arange(p.devices), np.diff(p.order_ptr))
    pos = np.arange(len(seq)) - p.order_ptr[dev]
    op = p.op_ptr[:-1][seq]
    single = np.diff(p.op_ptr)[seq] == 1
    fwd = p.op_kind[op] == _F
    s, a = seconds[op], comm[op]
    start, ready = result.start[seq], ready_times(result)[seq]
    ran = result.end[seq] > start
    out: list[Pair] = []
    for k in range(1, WINDOW + 1):
        i = np.arange(max(len(seq) - k, 0))
        j = i + k
        saved = hidden(s[i], a[i], s[j], a[j])
        ok = (
            (dev[i] == dev[j])
            & single[i]
            & single[j]
            & (fwd[i] != fwd[j])
            & ran[i]
            & (ready[j] <= start[i])
            & (saved > 0)
        )
        out += [
            Pair(float(saved[x]), int(dev[x]), int(pos[x]), int(pos[x]) + k)
            for x in np.flatnonzero(ok)
        ]
    out.sort(key=lambda c: (-c.hidden, c.device, c.first, c.second))
    return out


def disjoint(pairs: list[Pair], device: int | None = None) -> list[Pair]:
    """The pairs (of `device`, or of all) that share no op, taken in the order given."""
    used: set[tuple[int, int]] = set()
    out = []
    for c in pairs:
        if device is not None and c.device != device:
            continue
        if (c.device, c.first) in used or (c.device, c.second) in used:
            continue
        used.update(((c.device, c.first), (c.device, c.second)))
        out.append(c)
    return out


def held_back(plan: Plan, pairs: list[Pair], devices: set[int]) -> list[Pair]:
    """The pairs but those that run a forward earlier on one of `devices`: a backward run
    earlier frees its activations sooner, a forward holds its own longer (a device near its
    memory limit may then go over it)."""
    return [
        c
        for c in pairs
        if c.device not in devices or plan.schedule[c.device][c.second].ops[0].kind is not OpKind.F
    ]


def pair(plan: Plan, pairs: list[Pair]) -> Plan:
    """The plan with each pair's ops (disjoint pairs) in one group at the earlier one's place,
    the forward written first (as `gen dualpipev` does)."""
    schedule = list(plan.schedule)
    for d in sorted({c.device for c in pairs}):
        order = list(schedule[d])
        gone = set()
        for c in pairs:
            if c.device != d:
                continue
            x, y = order[c.first].ops[0], order[c.second].ops[0]
            order[c.first] = Slot((x, y) if x.kind is OpKind.F else (y, x))
            gone.add(c.second)
        schedule[d] = [slot for i, slot in enumerate(order) if i not in gone]
    return replace(plan, schedule=schedule)


def unpair(plan: Plan, where: list[tuple[int, int]], forward_first: bool) -> Plan:
    """The plan with the groups at `where` ((device, index) pairs) split into their ops in
    turn at their place: the forward first, or the backward first."""
    schedule = list(plan.schedule)
    for d in sorted({d for d, _ in where}):
        at = {i for e, i in where if e == d}
        order: list[Slot] = []
        for i, slot in enumerate(schedule[d]):
            if i not in at:
                order.append(slot)
                continue
            ops = sorted(slot.ops, key=lambda op: (op.kind is OpKind.F) != forward_first)
            order += [Slot((op,)) for op in ops]
        schedule[d] = order
    return replace(plan, schedule=schedule)


def waits(result: SimResult) -> list[tuple[float, int, int]]:
    """(seconds, device, index) of each overlap group: how long its device idled before it,
    less the all-to-all it hides; the largest first. A group waits for both ops' inputs: where
    it waits longer than it hides, running the ready op first may pay."""
    p = result.program
    if not p.grouped:
        return []
    seconds, _ = op_seconds(result)
    size = np.diff(p.op_ptr)
    out = []
    for d in range(p.devices):
        nodes = p.order_nodes[p.order_ptr[d] : p.order_ptr[d + 1]]
        for k in np.flatnonzero(size[nodes] > 1).tolist():
            n = nodes[k]
            idle = result.start[n] - (result.end[nodes[k - 1]] if k else 0.0)
            ran = result.end[n] - result.start[n]
            saved = seconds[p.op_ptr[n] : p.op_ptr[n + 1]].sum() - ran
            out.append((float(idle - saved), d, k))
    out.sort(key=lambda g: (-g[0], g[1], g[2]))
    return out
