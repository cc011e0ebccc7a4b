"""ZeroBubble's automatic scheduler (ZB-1p / ZB-2p of Qi et al., "Zero Bubble Pipeline
Parallelism", ICLR 2024), the reference the tuner is held to on one stage per device.

A re-implementation of the greedy its runtime runs: `Graph.manual_order` and
`initial_solution` in github.com/sail-sg/zero-bubble-pipeline-parallelism,
megatron/core/pipeline_parallel/zerobubble/scheduler/zb.py (commit 39f2c186). Stage by stage it
places each micro-batch's forwards (as many warm-up forwards as fit before the first backward
returns, within the activation budget), then its backwards from the last stage down, and fills
the waits for a message with weight-gradient passes (W) when the wait is longer than the W or
when this stage's idle time would otherwise exceed the busiest stage's; it tries its three
switches (2 x 2 x 2 settings) and keeps the order its own timing model finds shortest. Its
timing model is ZeroBubble's: one message cost for every cut, each stage's ops back to back.

The tuner starts from its orders too (`zb_starts`), besides the list scheduler's, on every
starting layout of one stage per device: so that, the partition and placement kept, the search
is never behind ZeroBubble's own scheduler (benchmarks/zb_auto.md).

What differs from the original, and why:
- a setting that cannot fit the budget raises in the original (`Cannot fit memory`) and stops
  the whole search; here that setting is skipped, the others still tried;
- a setting can leave a stage's last forwards unplaced (a stage places a forward only when
  every later stage does, and a later stage that has run all of its own never does again):
  the original then fails its closing checks, or, when they happen to hold, hands on an order
  without those forwards; here the setting is skipped;
- the orders are handed to octodsl's simulator, so it is their order that is compared, timed
  the same way as the tuner's plans.

ZeroBubble's runtime calls it with each kind of op at the median over stages ("Using uniform
f/b/w timing for now", runtime.py) and a budget of `max_pending_backward` x the forward's
activation bytes: P for ZB-1p (1F1B's peak), 2P for ZB-2p. `zb_auto` takes per-stage costs;
`uniform=True` gives the runtime's medians.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from itertools import product
from typing import NamedTuple

import numpy as np

from ...optable import KIND_OF_CODE
from ...optable import B as _B
from ...optable import F as _F
from ...optable import W as _W
from ...plan import Op, OpKind, Plan, Slot, placement_loop
from ...sim.jit import njit
from ...sim.links import cut_crosses_nodes, cut_times
from ..problem import Problem
from .layout import StageLayout


class CannotFit(Exception):
    """A setting whose order would go over the activation budget."""


class Unplaced(Exception):
    """A setting that left some forward unplaced."""


@dataclass(frozen=True)
class ZbCosts:
    """Per stage: seconds and activation bytes of each kind of op (as ZeroBubble's GraphConfig),
    one message's seconds, and each stage's activation budget."""

    f: Sequence[float]
    b: Sequence[float]
    w: Sequence[float]
    comm: float
    mem_f: Sequence[float]
    """Bytes a forward allocates."""
    mem_b: Sequence[float]
    """Bytes a backward adds (negative: it frees what W does not need)."""
    mem_w: Sequence[float]
    """Bytes a weight-gradient pass adds (negative: it frees the rest)."""
    max_mem: Sequence[float]

    def uniform(self) -> ZbCosts:
        """Every stage at the median of each kind, as ZeroBubble's runtime calls it."""

        def med(xs: Sequence[float]) -> list[float]:
            return [sorted(xs)[len(xs) // 2]] * len(xs)

        return replace(self, f=med(self.f), b=med(self.b), w=med(self.w))


class _Costs(NamedTuple):
    """A ZbCosts and a setting of the greedy's switches, as the compiled greedy reads them."""

    cost: np.ndarray
    """[kind code, stage]: seconds of F, B and W, and below the bytes each adds."""
    mem: np.ndarray
    comm: float
    max_mem: np.ndarray
    nmb: int
    bubble_before_first_b: bool
    prioritize_b: bool
    fill_w: bool


class _State(NamedTuple):
    """One run of the greedy, updated in place; per stage unless said."""

    done: np.ndarray
    """[kind code, stage]: ops of each kind placed."""
    end: np.ndarray
    """When the stage's last placed op ends."""
    used: np.ndarray
    """Activation bytes held."""
    bubble: np.ndarray
    """Idle seconds after the stage's first forward."""
    t: np.ndarray
    """[kind code, stage, micro-batch]: each op's completion."""
    order: np.ndarray
    """[stage, place, 0 or 1]: the kind code and micro-batch of each op the stage placed, in
    order (`done`'s total of them)."""


# The greedy runs compiled (numba; plain Python without it): ZeroBubble's runtime scheduler
# is one stage op at a time, a few thousand per setting, which as Python methods took a
# twentieth of a tuner's search on one stage per device. The same float operations in the
# same order as the original (tests/tune/test_zb_auto.py holds it to the original's results,
# and to it written as Python methods on random settings).
_OK, _CANNOT_FIT, _UNPLACED = 0, 1, 2


@njit
def _greedy(c):
    """One run of the greedy with the setting of `c`: (status, each stage's order as
    [place, (kind code, micro-batch)], span); status _CANNOT_FIT or _UNPLACED for a setting
    that the original cannot run or that leaves a forward unplaced."""
    p, nmb = c.cost.shape[1], c.nmb
    x = _State(
        np.zeros((3, p), np.int64),
        np.zeros(p),
        np.zeros(p),
        np.zeros(p),
        np.zeros((3, p, nmb)),
        np.zeros((p, 3 * nmb, 2), np.int64),
    )
    status = _run(c, x)
    if status != _OK:
        return status, x.order, 0.0
    span = -np.inf
    for j in range(p):
        span = max(span, x.t[_W, j, nmb - 1] - x.t[_F, j, 0] + c.cost[_F, j])
    return _OK, x.order, span


@njit(refcounts=False)
def _put(c, x, j, k):
    i = x.done[k, j]
    if i >= c.nmb:
        raise IndexError("the greedy placed an op past the last micro-batch")
    cost = c.cost[k, j]
    end = x.end[j] + cost
    busy = end
    if k == _F and j > 0:
        end = max(end, x.t[_F, j - 1, i] + c.comm + cost)
    if k == _B and j < c.cost.shape[1] - 1:
        end = max(end, x.t[_B, j + 1, i] + c.comm + cost)
    if x.done[_F, j] > 0:
        x.bubble[j] += end - busy
    x.end[j] = end
    x.t[k, j, i] = end
    x.used[j] += c.mem[k, j]
    n = x.done[_F, j] + x.done[_B, j] + x.done[_W, j]
    x.order[j, n, 0] = k
    x.order[j, n, 1] = i
    x.done[k, j] += 1


@njit(refcounts=False)
def _w_first(c, x, j, k, ready):
    """Before op kind `k` on stage `j`: W passes to make room for it, then W passes that end
    before its input arrives at `ready`, and one more into a wait the stage can afford
    (with `fill_w`) or cannot (always). False when it cannot make room."""
    while x.used[j] + c.mem[k, j] > c.max_mem[j]:
        if x.done[_W, j] >= x.done[_B, j]:
            return False
        _put(c, x, j, _W)
    if ready < 0:
        return True
    while x.done[_W, j] < x.done[_B, j] and x.end[j] + c.cost[_W, j] <= ready:
        _put(c, x, j, _W)
    if x.done[_W, j] < x.done[_B, j] and x.end[j] < ready:
        if ready - x.end[j] > x.bubble.max() - x.bubble[j] or c.fill_w:
            _put(c, x, j, _W)
    return True


@njit
def _run(c, x):
    p, comm, nmb = c.cost.shape[1], c.comm, c.nmb
    _first(c, x)
    for i in range(1, nmb):
        need = _forwards_wanted(c, x)
        for j in range(p - 2, -1, -1):
            need[j] = min(need[j], need[j + 1])
        for j in range(p):
            if need[j]:
                ready = x.t[_F, j - 1, x.done[_F, j]] + comm if j > 0 else -1.0
                if not _w_first(c, x, j, _F, ready):
                    return _CANNOT_FIT
                _put(c, x, j, _F)
        for j in range(p - 1, -1, -1):
            ready = x.t[_B, j + 1, i] + comm if j + 1 < p else -1.0
            if not _w_first(c, x, j, _B, ready):
                return _CANNOT_FIT
            if j == 0 and x.done[_F, j] == nmb:
                while x.done[_W, j] < x.done[_B, j]:
                    _put(c, x, j, _W)
            _put(c, x, j, _B)
    for j in range(p):
        while x.done[_W, j] < nmb:
            _put(c, x, j, _W)
    for j in range(p):
        if x.done[_F, j] < nmb:
            # a stage whose forwards the greedy never placed (each stage's forwards are capped
            # by the next stage's): the original's own checks fail or miss it
            return _UNPLACED
    return _OK


@njit
def _forwards_wanted(c, x):
    """Per stage, 1 if it should run a forward before the next micro-batch's backward.
    With `prioritize_b`, a stage two or more forwards ahead of the next one skips it when
    that forward (and the W passes it needs room from) would end after the next stage's
    next forward and backward, and the wait it leaves is one the stage can afford."""
    p, comm = c.cost.shape[1], c.comm
    need = np.zeros(p, np.int64)
    for j in range(p):
        if x.done[_F, j] >= c.nmb:
            continue
        if j + 1 < p and x.done[_F, j] >= x.done[_F, j + 1] + 2 and c.prioritize_b:
            after_next = x.end[j + 1] + c.cost[_F, j + 1] + c.cost[_B, j + 1] + comm
            if x.end[j] >= after_next:
                continue
            w_cost, w_n, room = 0.0, 0, x.used[j] + c.mem[_F, j]
            while room > c.max_mem[j] and x.done[_W, j] + w_n < x.done[_B, j]:
                w_cost += c.cost[_W, j]
                room += c.mem[_W, j]
                w_n += 1
            if x.end[j] + c.cost[_F, j] + w_cost <= after_next:
                need[j] = 1
                continue
            if after_next - x.end[j] <= x.bubble.max() - x.bubble[j]:
                continue
        need[j] = 1
    return need


@njit
def _first(c, x):
    """Micro-batch 0: its forwards, the warm-up forwards each stage has time and room for
    before that micro-batch's backward reaches it, then its backwards."""
    p, comm, nmb = c.cost.shape[1], c.comm, c.nmb
    for j in range(p):
        _put(c, x, j, _F)
    need = np.zeros(p, np.int64)
    last = 0.0
    for j in range(p - 1, -1, -1):
        if j == p - 1:
            last = x.t[_F, j, 0] + c.cost[_B, j]
            continue
        held, busy = x.used[j], x.end[j]
        while x.done[_F, j] + need[j] < nmb and held + c.mem[_F, j] <= c.max_mem[j]:
            if c.bubble_before_first_b:
                if busy + c.cost[_F, j] > last + comm:
                    break
            elif busy >= last + comm:
                break
            held += c.mem[_F, j]
            busy += c.cost[_F, j]
            need[j] += 1
        last = max(busy, last + comm) + c.cost[_B, j]
    for j in range(1, p):
        while need[j] > 0 and need[j] >= need[j - 1] and x.done[_F, j] + need[j] < nmb:
            need[j] -= 1
    for j in range(p):
        for _ in range(need[j]):
            _put(c, x, j, _F)
    for j in range(p - 1, -1, -1):
        _put(c, x, j, _B)


def greedy(
    costs: ZbCosts, nmb: int, bubble_before_first_b: bool, prioritize_b: bool, fill_w: bool
) -> tuple[np.ndarray, float]:
    """One run of the greedy with one setting of its three switches: each stage's order as
    [stage, place, (kind code, micro-batch)] and the span by ZeroBubble's timing. Raises
    CannotFit or Unplaced for a setting that the original cannot run or that leaves a forward
    unplaced."""
    c = _Costs(
        np.array([costs.f, costs.b, costs.w], float).reshape(3, -1),
        np.array([costs.mem_f, costs.mem_b, costs.mem_w], float).reshape(3, -1),
        float(costs.comm),
        np.array(costs.max_mem, float),
        int(nmb),
        bool(bubble_before_first_b),
        bool(prioritize_b),
        bool(fill_w),
    )
    status, order, span = _greedy(c)
    if status == _CANNOT_FIT:
        raise CannotFit
    if status == _UNPLACED:
        raise Unplaced
    return order, float(span)


def zb_auto(costs: ZbCosts, microbatches: int) -> list[list[tuple[OpKind, int]]] | None:
    """Each stage's order of (kind, micro-batch), F, B and W, of the best of the greedy's eight
    settings by ZeroBubble's own timing (the first on a tie, in the original's loop order), or
    None when no setting fits the budget."""
    best: tuple[float, np.ndarray] | None = None
    for switches in product((True, False), repeat=3):
        try:
            order, span = greedy(costs, microbatches, *switches)
        except (CannotFit, Unplaced):
            continue
        if best is None or span < best[0]:
            best = (span, order)
    if best is None:
        return None
    return [[(KIND_OF_CODE[k], i) for k, i in stage] for stage in best[1].tolist()]


def zb_auto_plan(plan: Plan, orders: list[list[tuple[OpKind, int]]]) -> Plan:
    """`plan` (one stage per device, in a loop) with `orders` as its schedule."""
    assert plan.num_stages == plan.devices and list(plan.placement) == placement_loop(
        plan.devices, plan.devices
    ), "ZeroBubble's scheduler places one stage per device"

    schedule = [[Slot((Op(k, s, i),)) for k, i in order] for s, order in enumerate(orders)]
    return replace(plan, schedule=schedule)


def zb_starts(problem: Problem, layout: StageLayout) -> list[tuple[str, Plan]]:
    """The tuner's starts from ZeroBubble's greedy for `layout`, when it is one stage per
    device in a loop: its order on the layout's per-stage costs and on their medians (as its
    runtime calls it), within the problem's memory limit; each message at the slowest cut's
    time. None for other layouts, or when no setting fits."""
    if layout.devices != tuple(range(problem.devices)):
        return []
    skeleton = problem.skeleton(layout)
    costs = problem.stage_costs(skeleton)
    send = np.array([c.send_bytes for c in costs], float)
    inter = problem.inter_link or problem.link
    cuts = cut_times(send, cut_crosses_nodes(problem.mesh, layout.devices), problem.link, inter)
    memory = math.inf if problem.memory is None else problem.memory
    zc = ZbCosts(
        f=[c.f for c in costs],
        b=[c.b for c in costs],
        w=[c.w for c in costs],
        comm=float(cuts[:-1].max(initial=0.0)),
        mem_f=[c.act for c in costs],
        mem_b=[c.act_w - c.act for c in costs],
        mem_w=[-c.act_w for c in costs],
        max_mem=[memory - c.static for c in costs],
    )
    out = []
    for name, given in (("its per-stage costs", zc), ("the medians", zc.uniform())):
        orders = zb_auto(given, problem.microbatches)
        if orders is not None:
            out.append((f"ZeroBubble's greedy on {name}", zb_auto_plan(skeleton, orders)))
    return out
