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

import numpy as np

from ...optable import KIND_OF_CODE
from ...optable import B as _B
from ...optable import F as _F
from ...optable import W as _W
from ...plan import Op, OpKind, Plan, Slot, placement_loop
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


class _Greedy:
    """One run of the greedy with one setting of its three switches."""

    def __init__(
        self, c: ZbCosts, nmb: int, bubble_before_first_b: bool, prioritize_b: bool, fill_w: bool
    ):
        self.c, self.nmb = c, nmb
        # Plain lists, not arrays: the greedy reads and writes one element at a time.
        self.cost = [list(map(float, c.f)), list(map(float, c.b)), list(map(float, c.w))]
        self.mem = [list(map(float, c.mem_f)), list(map(float, c.mem_b)), list(map(float, c.mem_w))]
        p = len(c.f)
        self.p = p
        self.switches = (bubble_before_first_b, prioritize_b, fill_w)
        self.done = [[0] * p for _ in range(3)]  # ops of each kind placed per stage
        self.end = [0.0] * p  # when each stage's last placed op ends
        self.used = [0.0] * p  # activation bytes held per stage
        self.bubble = [0.0] * p  # idle seconds per stage after its first forward
        self.t = [[[0.0] * nmb for _ in range(p)] for _ in range(3)]  # each op's completion
        self.order: list[list[tuple[int, int]]] = [[] for _ in range(p)]

    def put(self, j: int, k: int) -> None:
        i = self.done[k][j]
        cost = self.cost[k][j]
        end = self.end[j] + cost
        busy = end
        if k == _F and j > 0:
            end = max(end, self.t[_F][j - 1][i] + self.c.comm + cost)
        if k == _B and j < self.p - 1:
            end = max(end, self.t[_B][j + 1][i] + self.c.comm + cost)
        if self.done[_F][j] > 0:
            self.bubble[j] += end - busy
        self.end[j] = end
        self.t[k][j][i] = end
        self.used[j] += self.mem[k][j]
        self.done[k][j] += 1
        self.order[j].append((k, i))

    def _w_first(self, j: int, k: int, ready: float) -> None:
        """Before op kind `k` on stage `j`: W passes to make room for it, then W passes that end
        before its input arrives at `ready`, and one more into a wait the stage can afford
        (with `fill_w`) or cannot (always)."""
        while self.used[j] + self.mem[k][j] > self.c.max_mem[j]:
            if self.done[_W][j] >= self.done[_B][j]:
                raise CannotFit
            self.put(j, _W)
        if ready < 0:
            return
        while self.done[_W][j] < self.done[_B][j] and self.end[j] + self.cost[_W][j] <= ready:
            self.put(j, _W)
        if self.done[_W][j] < self.done[_B][j] and self.end[j] < ready:
            if ready - self.end[j] > max(self.bubble) - self.bubble[j] or self.switches[2]:
                self.put(j, _W)

    def run(self) -> tuple[list[list[tuple[int, int]]], float]:
        p, comm = self.p, self.c.comm
        self._first()
        for i in range(1, self.nmb):
            need = self._forwards_wanted()
            for j in range(p - 2, -1, -1):
                need[j] = min(need[j], need[j + 1])
            for j in range(p):
                if need[j]:
                    ready = self.t[_F][j - 1][self.done[_F][j]] + comm if j > 0 else -1.0
                    self._w_first(j, _F, ready)
                    self.put(j, _F)
            for j in range(p - 1, -1, -1):
                ready = self.t[_B][j + 1][i] + comm if j + 1 < p else -1.0
                self._w_first(j, _B, ready)
                if j == 0 and self.done[_F][j] == self.nmb:
                    while self.done[_W][j] < self.done[_B][j]:
                        self.put(j, _W)
                self.put(j, _B)
        for j in range(p):
            while self.done[_W][j] < self.nmb:
                self.put(j, _W)
        if any(self.done[_F][j] < self.nmb for j in range(p)):
            # a stage whose forwards the greedy never placed (each stage's forwards are capped
            # by the next stage's): the original's own checks fail or miss it
            raise Unplaced
        span = max(
            self.t[_W][j][self.nmb - 1] - self.t[_F][j][0] + self.cost[_F][j] for j in range(p)
        )
        return self.order, span

    def _forwards_wanted(self) -> list[int]:
        """Per stage, 1 if it should run a forward before the next micro-batch's backward.
        With `prioritize_b`, a stage two or more forwards ahead of the next one skips it when
        that forward (and the W passes it needs room from) would end after the next stage's
        next forward and backward, and the wait it leaves is one the stage can afford."""
        p, comm = self.p, self.c.comm
        need = [0] * p
        for j in range(p):
            if self.done[_F][j] >= self.nmb:
                continue
            if j + 1 < p and self.done[_F][j] >= self.done[_F][j + 1] + 2 and self.switches[1]:
                after_next = self.end[j + 1] + self.cost[_F][j + 1] + self.cost[_B][j + 1] + comm
                if self.end[j] >= after_next:
                    continue
                w_cost, w_n, room = 0.0, 0, self.used[j] + self.mem[_F][j]
                while room > self.c.max_mem[j] and self.done[_W][j] + w_n < self.done[_B][j]:
                    w_cost += self.cost[_W][j]
                    room += self.mem[_W][j]
                    w_n += 1
                if self.end[j] + self.cost[_F][j] + w_cost <= after_next:
                    need[j] = 1
                    continue
                if after_next - self.end[j] <= max(self.bubble) - self.bubble[j]:
                    continue
            need[j] = 1
        return need

    def _first(self) -> None:
        """Micro-batch 0: its forwards, the warm-up forwards each stage has time and room for
        before that micro-batch's backward reaches it, then its backwards."""
        p, comm = self.p, self.c.comm
        for j in range(p):
            self.put(j, _F)
        need = [0] * p
        last = 0.0
        for j in range(p - 1, -1, -1):
            if j == p - 1:
                last = self.t[_F][j][0] + self.cost[_B][j]
                continue
            held, busy = self.used[j], self.end[j]
            while (
                self.done[_F][j] + need[j] < self.nmb
                and held + self.mem[_F][j] <= self.c.max_mem[j]
            ):
                if self.switches[0]:
                    if busy + self.cost[_F][j] > last + comm:
                        break
                elif busy >= last + comm:
                    break
                held += self.mem[_F][j]
                busy += self.cost[_F][j]
                need[j] += 1
            last = max(busy, last + comm) + self.cost[_B][j]
        for j in range(1, p):
            while need[j] > 0 and need[j] >= need[j - 1] and self.done[_F][j] + need[j] < self.nmb:
                need[j] -= 1
        for j in range(p):
            for _ in range(need[j]):
                self.put(j, _F)
        for j in range(p - 1, -1, -1):
            self.put(j, _B)


def zb_auto(costs: ZbCosts, microbatches: int) -> list[list[tuple[OpKind, int]]] | None:
    """Each stage's order of (kind, micro-batch), F, B and W, of the best of the greedy's eight
    settings by ZeroBubble's own timing (the first on a tie, in the original's loop order), or
    None when no setting fits the budget."""
    best: tuple[float, list[list[tuple[int, int]]]] | None = None
    for switches in product((True, False), repeat=3):
        try:
            order, span = _Greedy(costs, microbatches, *switches).run()
        except (CannotFit, Unplaced):
            continue
        if best is None or span < best[0]:
            best = (span, order)
    if best is None:
        return None
    return [[(KIND_OF_CODE[k], i) for k, i in stage] for stage in best[1]]


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
