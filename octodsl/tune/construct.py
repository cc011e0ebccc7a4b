"""Schedule construction: given a partition, a placement and stage costs, each device's order.

Greedy list scheduling over the plan's dependency rules (octodsl.dag), ZeroBubble-style:
- every op is B (input gradient), F, or W (weight gradient): the backward is always split, so
  W is free to fill gaps;
- a device that is free runs, in order of preference, a ready B (it is on the critical path
  and frees memory), a ready F whose activations fit the memory budget, else a W; with
  `w_gap`, a W only when it ends before the next known arrival (so it never delays a B or F);
- among ready ops of one kind, the oldest micro-batch first, then the deeper stage (a deeper F
  reaches the loss, and so its B, sooner);
- memory is counted as the simulator counts it (F allocates `act`, B releases all but `act_w`,
  W the rest). A forward that starts a micro-batch on a device keeps room for the rest of that
  micro-batch on the device; when a forward does not fit, a pending W runs first to make room.

Each kind of op runs its micro-batches in order on every stage, so a device's candidates are,
per stage, the next F, B and W: the state is a few arrays and the walk compiles with numba.

The constructor times ops with a simplified model (a message costs the link time of its cut,
no stream contention); it only decides orders. Every evaluation is the simulator's. Its output
is the order of an actual execution, so it never deadlocks.
"""

from __future__ import annotations

import functools
from dataclasses import replace
from typing import Sequence

import numpy as np

from ..costs.table import Link, StageCost
from ..plan import Op, Plan, Slot
from ..sim.jit import njit
from ..sim.program import KIND_OF_CODE

_INF = np.inf


def build_schedule(plan: Plan, costs: Sequence[StageCost], link: Link,
                   memory: float | None = None, w_gap: bool = True) -> Plan:
    """`plan` with every device's order built by list scheduling (its own schedule ignored).

    memory: per-device bytes the orders should stay within (None: no limit); static bytes of
    each device's stages count against it. The simulator checks the result; a device whose
    static bytes and one micro-batch already exceed the limit gets an order over it."""
    kind, stage, mb, dev = _arrays(plan, costs, link, memory, w_gap)
    orders: list[list[Slot]] = [[] for _ in range(plan.devices)]
    for k, s, i, d in zip(kind.tolist(), stage.tolist(), mb.tolist(), dev.tolist()):
        orders[d].append(_slot(k, s, i))
    return replace(plan, schedule=orders)


@functools.lru_cache(maxsize=1 << 18)
def _slot(kind: int, stage: int, mb: int) -> Slot:
    """Slots are immutable: the tuner's thousands of plans share them."""
    return Slot((Op(KIND_OF_CODE[kind], stage, mb),))


def _arrays(plan: Plan, costs: Sequence[StageCost], link: Link,
                    memory: float | None = None, w_gap: bool = True):
    """The constructed schedule as arrays in run order: (kind code, the simulator's: 0 F / 1 B /
    2 W; stage; mb; device)."""
    sd = np.array(plan.stage_device(), np.int64)
    S, P, M = len(sd), plan.devices, plan.microbatches
    dev_stages = [np.flatnonzero(sd == d) for d in range(P)]
    dev_ptr = np.zeros(P + 1, np.int64)
    dev_ptr[1:] = np.cumsum([len(x) for x in dev_stages])
    flat = np.concatenate(dev_stages) if S else np.zeros(0, np.int64)
    col = {name: np.array([getattr(c, name) for c in costs], float)
           for name in ("f", "b", "w", "act", "act_w", "static")}
    delay = np.array([link.time(costs[s].send_bytes) if s + 1 < S and sd[s] != sd[s + 1] else 0.0
                      for s in range(S)])
    static = np.bincount(sd, weights=col["static"], minlength=P)
    budget = np.full(P, _INF) if memory is None else memory - static
    return _walk(sd, dev_ptr, flat, col["f"], col["b"], col["w"], col["act"], col["act_w"],
                 delay, M, budget, w_gap)


@njit
def _ready_f(s, mb, M, nF, endF, delay):
    if mb >= M:
        return _INF
    if s == 0:
        return 0.0
    if nF[s - 1] > mb:
        return endF[s - 1, mb] + delay[s - 1]
    return _INF


@njit
def _ready_b(s, mb, S, nF, nB, endF, endB, delay):
    if mb >= nF[s]:
        return _INF
    r = endF[s, mb]
    if s + 1 < S:
        if nB[s + 1] <= mb:
            return _INF
        r = max(r, endB[s + 1, mb] + delay[s])
    return r


@njit
def _decide(d, dev_ptr, stages, S, M, w, act, delay, nF, nB, nW, endF, endB, tdev, mem,
            budget, room, w_gap):
    """Device d's next action: (time, kind, stage), kind -1 when it has nothing it can run yet.
    Also returns the stage of a ready forward held back by memory (-1 if none)."""
    t0 = tdev[d]
    best_b, tb, best_f, tf, blocked, best_w = -1, _INF, -1, _INF, -1, -1
    for i in range(dev_ptr[d], dev_ptr[d + 1]):
        s = stages[i]
        r = max(_ready_b(s, nB[s], S, nF, nB, endF, endB, delay), t0)
        # Earlier start wins; at the same start, the older micro-batch, then the deeper stage.
        if r < tb or (r == tb and r < _INF and (nB[s] < nB[best_b] or
                                                 (nB[s] == nB[best_b] and s > best_b))):
            best_b, tb = s, r
        r = _ready_f(s, nF[s], M, nF, endF, delay)
        if r < _INF:
            need = act[s] + (room[d] if s == stages[dev_ptr[d]] else 0.0)
            if mem[d] + need > budget[d]:
                if blocked < 0 or r < _ready_f(blocked, nF[blocked], M, nF, endF, delay):
                    blocked = s
            else:
                r = max(r, t0)
                if r < tf or (r == tf and (nF[s] < nF[best_f] or (nF[s] == nF[best_f] and s > best_f))):
                    best_f, tf = s, r
        if nW[s] < nB[s] and (best_w < 0 or endB[s, nW[s]] < endB[best_w, nW[best_w]]):
            best_w = s
    if tb <= t0:
        return t0, 1, best_b, blocked
    if tf <= t0:
        return t0, 0, best_f, blocked
    nxt = min(tb, tf)
    held = blocked >= 0 and _ready_f(blocked, nF[blocked], M, nF, endF, delay) <= t0
    if best_w >= 0 and (held or not w_gap or nxt == _INF or nxt - t0 >= w[best_w]):
        return t0, 2, best_w, blocked
    if nxt == _INF:
        return _INF, -1, -1, blocked
    if tb <= tf:
        return tb, 1, best_b, blocked
    return tf, 0, best_f, blocked


@njit
def _walk(sd, dev_ptr, stages, f, b, w, act, act_w, delay, M, budget, w_gap):
    S = sd.shape[0]
    P = dev_ptr.shape[0] - 1
    N = 3 * S * M
    out_kind = np.zeros(N, np.int64)
    out_stage = np.zeros(N, np.int64)
    out_mb = np.zeros(N, np.int64)
    out_dev = np.zeros(N, np.int64)
    nF = np.zeros(S, np.int64)
    nB = np.zeros(S, np.int64)
    nW = np.zeros(S, np.int64)
    endF = np.zeros((S, M))
    endB = np.zeros((S, M))
    tdev = np.zeros(P)
    mem = np.zeros(P)
    # Room a new micro-batch needs on a device beyond its first stage's activations.
    room = np.zeros(P)
    for d in range(P):
        for i in range(dev_ptr[d] + 1, dev_ptr[d + 1]):
            room[d] += act[stages[i]]
    for k in range(N):
        bt, bd, bk, bs = _INF, -1, -1, -1
        stuck_t, stuck_d, stuck_s = _INF, -1, -1
        for d in range(P):
            t, kind, s, blocked = _decide(d, dev_ptr, stages, S, M, w, act, delay, nF, nB,
                                          nW, endF, endB, tdev, mem, budget, room, w_gap)
            if kind >= 0 and t < bt:
                bt, bd, bk, bs = t, d, kind, s
            if blocked >= 0:
                r = max(tdev[d], _ready_f(blocked, nF[blocked], M, nF, endF, delay))
                if r < stuck_t:
                    stuck_t, stuck_d, stuck_s = r, d, blocked
        if bd < 0:
            # Every device waits and some forward is held back by memory alone: run the first
            # to be ready over the budget rather than stall (the simulator reports the peak).
            if stuck_d < 0:
                raise RuntimeError("list scheduling stalled with no op held back")
            bt, bd, bk, bs = stuck_t, stuck_d, 0, stuck_s
        s = bs
        if bk == 0:
            i = nF[s]
            e = bt + f[s]
            endF[s, i] = e
            nF[s] += 1
            mem[bd] += act[s]
        elif bk == 1:
            i = nB[s]
            e = bt + b[s]
            endB[s, i] = e
            nB[s] += 1
            mem[bd] -= act[s] - act_w[s]
        else:
            i = nW[s]
            e = bt + w[s]
            nW[s] += 1
            mem[bd] -= act_w[s]
        tdev[bd] = e
        out_kind[k] = bk
        out_stage[k] = s
        out_mb[k] = i
        out_dev[k] = bd
    return out_kind, out_stage, out_mb, out_dev
