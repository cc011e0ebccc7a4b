"""Schedule construction: given a partition, a placement and stage costs, each device's order.

Greedy list scheduling over the plan's dependency rules (octodsl.dag), ZeroBubble-style:
- every op is B (input gradient), F, or W (weight gradient): the backward is always split, so
  W is free to fill gaps;
- a device that is free runs, in order of preference, a ready B (it is on the critical path
  and frees memory), a ready F whose activations fit the memory budget, else a W; with
  `w_gap`, a W only when it ends before the next known arrival (so it never delays a B or F);
- among ready ops of one kind, the oldest micro-batch first, then the deeper stage (a deeper F
  reaches the loss, and so its B, sooner);
- memory is counted as the simulator counts it (octodsl.costs.levers: F allocates `act`, B releases all but `act_w`,
  W the rest; with recompute, B holds `act_b` more while it runs and may leave more than F
  kept). A forward that starts a micro-batch on a device keeps room for the rest of that
  micro-batch on the device and for the most one of its B's brings back; when a forward does
  not fit, or a B's recompute would go over the limit, a pending W runs first to make room.

Each kind of op runs its micro-batches in order on every stage, so a device's candidates are,
per stage, the next F, B and W: the state is a few arrays and the walk compiles with numba.

The constructor times ops with a simplified model (a message costs the time of its cut on the
cut's link, no stream contention); it only decides orders. Every evaluation is the simulator's. Its output
is the order of an actual execution, so it never deadlocks.

The pilot method (`_pilot`, for the tuner's final plans) improves on the greedy walk: at each
step it tries the other ops the device could start instead, each rolled out to the end by the
walk, and keeps the choice that ends soonest. The walk's timing is close to the simulator's on
the compute (within 0.2% on nemotron-h-56b, 16 devices x 32 micro-batches), so what ends sooner
here mostly ends sooner there.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Sequence
from dataclasses import replace
from typing import NamedTuple

import numpy as np

from ...costs.table import Link, StageCost
from ...mesh import Mesh
from ...plan import Op, Plan, Slot
from ...sim.costs import SimCosts
from ...sim.jit import njit
from ...sim.links import cut_crosses_nodes, cut_times, link_times
from ...sim.program import KIND_OF_CODE, CodedOrders

_INF = np.inf


def build_schedule(
    plan: Plan,
    costs: SimCosts | Sequence[StageCost],
    link: Link,
    memory: float | None = None,
    w_gap: bool = True,
    inter_link: Link | None = None,
    pilot: bool = False,
    deadline: float | None = None,
) -> Plan:
    """`plan` with every device's order built by list scheduling (its own schedule ignored).

    memory: per-device bytes the orders should stay within (None: no limit); static bytes of
    each device's stages count against it. The simulator checks the result; a device whose
    static bytes and one micro-batch already exceed the limit gets an order over it.
    pilot: improve the list scheduler's order by the pilot method (`_pilot`: about as many
    walks as the plan has ops, so for a final plan, not for each of a search's); `deadline`
    (time.perf_counter()): where the pilot method stops trying alternatives and the walk
    finishes the order from there."""
    x = _arrays(plan, costs, link, memory, w_gap, inter_link)
    order, _ = _pilot(x, deadline) if pilot else _walk(x)
    table = _slots(plan.num_stages, plan.microbatches)
    kind, stage, mb, flat, ends = _by_device(order, plan.devices, table.shape[1], table.shape[2])
    # a flat take: half the time of indexing the object table by three arrays
    slots = table.ravel().take(flat)
    # slices, not np.split, whose Python loop took a tenth of this function
    bounds = [0, *ends.tolist()]
    orders = [slots[a:b].tolist() for a, b in zip(bounds, bounds[1:], strict=False)]
    return replace(plan, schedule=CodedOrders(orders, (kind, stage, mb)))


def pilot_seconds(
    plan: Plan,
    costs: SimCosts | Sequence[StageCost],
    link: Link,
    memory: float | None = None,
    w_gap: bool = True,
    inter_link: Link | None = None,
) -> float:
    """About how long `build_schedule(..., pilot=True)` takes: a walk, timed, per op of the
    plan (the pilot method's rollouts, half a walk each on average, number about two per op:
    1.6 s against 3.0 s estimated on nemotron-h-56b's best layout for 16 devices x 32
    micro-batches). The fastest of `PILOT_TIMINGS` walks: one walk timed right after a search
    ran up to 40% over its repeats there, and the tuner reserves the polish by this figure."""
    x = _arrays(plan, costs, link, memory, w_gap, inter_link)
    walk = _INF
    for _ in range(PILOT_TIMINGS):
        t = time.perf_counter()
        _walk(x)
        walk = min(walk, time.perf_counter() - t)
    return walk * 3 * plan.num_stages * plan.microbatches


PILOT_TIMINGS = 3
"""Walks `pilot_seconds` times, keeping the fastest (the usual guard against a timer's noise)."""


@njit
def _by_device(order, devices, table_stages, microbatches):
    """The ops of `order` in device order, each device's in run order (a stable sort by
    device, by counting): their kind codes, stages and micro-batches, their places in the
    slot table (`_slots`, of `table_stages` stages) flattened, and where each device's ops
    end."""
    ends = np.zeros(devices, np.int64)
    for d in order.device:
        ends[d] += 1
    at = np.zeros(devices, np.int64)
    total = 0
    for d in range(devices):
        at[d] = total
        total += ends[d]
        ends[d] = total
    n = order.device.shape[0]
    kind, stage, mb = np.empty(n, np.int64), np.empty(n, np.int64), np.empty(n, np.int64)
    flat = np.empty(n, np.int64)
    for k in range(n):
        i = at[order.device[k]]
        at[order.device[k]] += 1
        kind[i], stage[i], mb[i] = order.kind[k], order.stage[k], order.mb[k]
        flat[i] = (kind[i] * table_stages + stage[i]) * microbatches + mb[i]
    return kind, stage, mb, flat, ends


def _slots(num_stages: int, microbatches: int) -> np.ndarray:
    """[kind code, stage, micro-batch] -> its Slot, for stages 0 .. num_stages - 1 at least.
    Slots are immutable: the tuner's thousands of plans share them (and the simulator's
    compiled programs know them by identity), whatever their number of stages, so a table
    grows by the stages it lacks and keeps the slots it has."""
    have = _SLOTS.get(microbatches)
    if have is not None and have.shape[1] >= num_stages:
        return have
    kinds = KIND_OF_CODE[:3]  # F, B and W: the backward is always split
    start = 0 if have is None else have.shape[1]
    more = np.empty((len(kinds), num_stages - start, microbatches), object)
    for k, kind in enumerate(kinds):
        for s in range(start, num_stages):
            for i in range(microbatches):
                more[k, s - start, i] = Slot((Op(kind, s, i),))
    table = more if have is None else np.concatenate([have, more], axis=1)
    if len(_SLOTS) >= _SLOT_TABLES and microbatches not in _SLOTS:
        _SLOTS.pop(next(iter(_SLOTS)))
    _SLOTS[microbatches] = table
    return table


_SLOTS: dict[int, np.ndarray] = {}
"""`_slots`' tables by micro-batches."""
_SLOT_TABLES = 8


class _Inputs(NamedTuple):
    """What the list scheduler knows before it starts; per stage unless said."""

    num_stages: int
    microbatches: int
    dev_ptr: np.ndarray
    """Device d holds stages[dev_ptr[d]:dev_ptr[d + 1]]."""
    stages: np.ndarray
    f: np.ndarray
    """Seconds of a forward, and below of a B and a W."""
    b: np.ndarray
    w: np.ndarray
    act: np.ndarray
    """Bytes a forward allocates; a B leaves act_w of its micro-batch held (under recompute
    possibly more than F kept; what it brings back, act_b, it holds only while it runs), a W
    releases that."""
    act_w: np.ndarray
    act_b: np.ndarray
    delay: np.ndarray
    """Seconds a message across the cut after stage s takes (0 within a device)."""
    budget: np.ndarray
    """Per device: bytes for activations when a forward starts (the limit less its static
    bytes and the most that one of its B's brings back by recompute, which it holds while it
    runs)."""
    cap: np.ndarray
    """Per device: the limit less its static bytes. A B whose act_b would go over it waits for
    a pending W (under recompute a B leaves more held than F kept, so B's in a row grow the
    level)."""
    room: np.ndarray
    """Per device: bytes a new micro-batch needs beyond its first stage's activations."""
    w_gap: bool
    """A W only when it ends before the next known arrival."""


class _Progress(NamedTuple):
    """The scheduler's state, updated in place as it runs ops; per stage unless said."""

    f_done: np.ndarray
    """Forwards run so far (the next forward's micro-batch), and below B's and W's."""
    b_done: np.ndarray
    w_done: np.ndarray
    f_end: np.ndarray
    """[stage, micro-batch]: when the forward ends, and below the B."""
    b_end: np.ndarray
    device_free: np.ndarray
    """Per device: when its last op ends."""
    memory: np.ndarray
    """Per device: activation bytes held."""
    ready_b: np.ndarray
    """When each stage's next B can start (`_ready_b`), and below its next F (`_ready_f`):
    kept up to date as ops run (`_refresh`), since a device's decision reads them for each
    of its stages and an op changes at most three."""
    ready_f: np.ndarray


@njit
def _start(x):
    """The scheduler's state before any op: nothing run, every device free and empty."""
    S, M, P = x.num_stages, x.microbatches, x.dev_ptr.shape[0] - 1
    st = _Progress(
        np.zeros(S, np.int64),
        np.zeros(S, np.int64),
        np.zeros(S, np.int64),
        np.zeros((S, M)),
        np.zeros((S, M)),
        np.zeros(P),
        np.zeros(P),
        np.zeros(S),
        np.zeros(S),
    )
    for s in range(S):
        _refresh(x, st, s)
    return st


@njit(refcounts=False)
def _refresh(x, st, s):
    """Stage s's ready times from the progress so far."""
    st.ready_b[s] = _ready_b(x, st, s, st.b_done[s])
    st.ready_f[s] = _ready_f(x, st, s, st.f_done[s])


class _Order(NamedTuple):
    """The constructed schedule in run order, one entry per op."""

    kind: np.ndarray
    """The simulator's kind code: 0 F, 1 B, 2 W."""
    stage: np.ndarray
    mb: np.ndarray
    device: np.ndarray


_COLUMN_NAMES = ("f", "b", "w", "act", "act_w", "act_b", "static", "send_bytes")
"""The stage costs the list scheduler reads (`SimCosts.column`: a problem's costs hold them
once built)."""


def _arrays(
    plan: Plan,
    costs: SimCosts | Sequence[StageCost],
    link: Link,
    memory: float | None = None,
    w_gap: bool = True,
    inter_link: Link | None = None,
) -> _Inputs:
    """The list scheduler's inputs for `plan`."""
    devices = tuple(plan.stage_device())
    sd = np.array(devices, np.int64)
    S, P, M = len(sd), plan.devices, plan.microbatches
    flat = np.argsort(sd, kind="stable")  # each device's stages, in stage order
    counts = np.bincount(sd, minlength=P)
    dev_ptr = np.zeros(P + 1, np.int64)
    dev_ptr[1:] = np.cumsum(counts)
    column = SimCosts.of(costs).column
    col = {name: column(name) for name in _COLUMN_NAMES}
    cut = (
        cut_times(col["send_bytes"], _crossings(Mesh.of(plan.header), devices), link, inter_link)
        if inter_link is not None
        else link_times(link, col["send_bytes"])
    )
    delay = np.zeros(S)
    delay[:-1] = np.where(sd[1:] != sd[:-1], cut[:-1], 0.0)
    static = np.bincount(sd, weights=col["static"], minlength=P)
    transient = np.zeros(P)
    np.maximum.at(transient, sd, col["act_b"])
    cap = np.full(P, _INF) if memory is None else memory - static
    # all but each device's first stage, summed in stage order from 0 (as `sum` would)
    later = col["act"].copy()
    later[flat[dev_ptr[:-1][counts > 0]]] = 0.0
    room = np.bincount(sd, weights=later, minlength=P)
    return _Inputs(
        S,
        M,
        dev_ptr,
        flat,
        col["f"],
        col["b"],
        col["w"],
        col["act"],
        col["act_w"],
        col["act_b"],
        delay,
        cap - transient,
        cap,
        room,
        w_gap,
    )


@functools.lru_cache(maxsize=256)
def _crossings(mesh: Mesh, stage_device: tuple[int, ...]) -> np.ndarray:
    """`cut_crosses_nodes`, read-only and remembered: the tuner list-schedules hundreds of
    layouts on a few placements."""
    out = cut_crosses_nodes(mesh, stage_device)
    out.flags.writeable = False
    return out


# _ready_f, _ready_b and the W after its B in _decide are the dependency rule: they mirror
# octodsl.dag.producers (tests/tune/test_mirrors.py holds the run order to it).
@njit(refcounts=False)
def _ready_f(x, st, s, mb):
    """When forward `mb` of stage `s` can start (inf: not yet known)."""
    if mb >= x.microbatches:
        return _INF
    if s == 0:
        return 0.0
    if st.f_done[s - 1] > mb:
        return st.f_end[s - 1, mb] + x.delay[s - 1]
    return _INF


@njit(refcounts=False)
def _ready_b(x, st, s, mb):
    """When B `mb` of stage `s` can start (inf: not yet known)."""
    if mb >= st.f_done[s]:
        return _INF
    r = st.f_end[s, mb]
    if s + 1 < x.num_stages:
        if st.b_done[s + 1] <= mb:
            return _INF
        r = max(r, st.b_end[s + 1, mb] + x.delay[s])
    return r


@njit(refcounts=False, inline=True)
def _forward_fits(x, st, d, s):
    """Whether stage s's next forward fits device d's budget: its activations, and for the
    device's first stage (which starts a micro-batch there) room for the rest of it."""
    need = x.act[s] + (x.room[d] if s == x.stages[x.dev_ptr[d]] else 0.0)
    return st.memory[d] + need <= x.budget[d]


@njit(refcounts=False)
def _decide(x, st, d):
    """Device d's next action: (time, kind, stage), kind -1 when it has nothing it can run yet.
    Also returns the stage of a ready forward held back by memory (-1 if none)."""
    t0 = st.device_free[d]
    f_done, b_done, w_done = st.f_done, st.b_done, st.w_done
    best_b, tb, best_f, tf, blocked, best_w = -1, _INF, -1, _INF, -1, -1
    for i in range(x.dev_ptr[d], x.dev_ptr[d + 1]):
        s = x.stages[i]
        r = max(st.ready_b[s], t0)
        # Earlier start wins; at the same start, the older micro-batch, then the deeper stage.
        if r < tb or (
            r == tb
            and r < _INF
            and (b_done[s] < b_done[best_b] or (b_done[s] == b_done[best_b] and s > best_b))
        ):
            best_b, tb = s, r
        r = st.ready_f[s]
        if r < _INF:
            if not _forward_fits(x, st, d, s):
                if blocked < 0 or r < st.ready_f[blocked]:
                    blocked = s
            else:
                r = max(r, t0)
                if r < tf or (
                    r == tf
                    and (f_done[s] < f_done[best_f] or (f_done[s] == f_done[best_f] and s > best_f))
                ):
                    best_f, tf = s, r
        if w_done[s] < b_done[s] and (
            best_w < 0 or st.b_end[s, w_done[s]] < st.b_end[best_w, w_done[best_w]]
        ):
            best_w = s
    # a B whose recomputed part would not fit lets a held W free memory first, now or later
    b_needs_w = (
        best_w >= 0
        and best_b >= 0
        and x.act_b[best_b] > 0
        and st.memory[d] + x.act_b[best_b] > x.cap[d]
    )
    if tb <= t0:
        if b_needs_w:
            return t0, 2, best_w, blocked
        return t0, 1, best_b, blocked
    if tf <= t0:
        return t0, 0, best_f, blocked
    nxt = min(tb, tf)
    held = blocked >= 0 and st.ready_f[blocked] <= t0
    if best_w >= 0 and (held or not x.w_gap or nxt == _INF or nxt - t0 >= x.w[best_w]):
        return t0, 2, best_w, blocked
    if nxt == _INF:
        return _INF, -1, -1, blocked
    if tb <= tf:
        if b_needs_w:
            return t0, 2, best_w, blocked
        return tb, 1, best_b, blocked
    return tf, 0, best_f, blocked


@njit(refcounts=False)
def held_change(kind, act, act_w):
    """octodsl.costs.levers.held_change, compiled: the bytes an op of kind code `kind` leaves
    held. It mirrors that rule (tests/tune/test_mirrors.py holds them equal)."""
    if kind == 0:
        return act
    if kind == 1:
        return -(act - act_w)
    if kind == 2:
        return -act_w
    return -act


class _Choices(NamedTuple):
    """Per device, its last decision (`_decide`'s time, kind, stage and stage held back by
    memory), kept until the op just run may have changed it: an op of stage s changes only its
    device's clock and memory and stage s's progress of its kind, which besides its own device
    only the device of s + 1 reads for an F (its F's ready time) and that of s - 1 for a B (its
    B's)."""

    when: np.ndarray
    """inf where the device has nothing it can run (and for the tree's padding, at P)."""
    what: np.ndarray
    which: np.ndarray
    held: np.ndarray
    owner: np.ndarray
    """Per stage: its device."""
    tree: np.ndarray
    """The devices' decisions as a tournament (`_redecide`): tree[1] the device of the earliest,
    tree[i] the winner of tree[2i] and tree[2i + 1], the leaves from len(tree) / 2 on device
    0, 1, ..., then P, whose `when` is inf, for the rest."""


@njit
def _walk(x):
    """The list scheduler's order, and when its last op ends by the scheduler's timing."""
    N = 3 * x.num_stages * x.microbatches
    out = _empty_order(N)
    st, c = _fresh(x)
    if not _run(x, st, c, out, 0):
        raise RuntimeError("list scheduling stalled with no op held back")
    return out, st.device_free.max()


@njit
def _empty_order(n):
    return _Order(
        np.zeros(n, np.int64), np.zeros(n, np.int64), np.zeros(n, np.int64), np.zeros(n, np.int64)
    )


@njit
def _fresh(x):
    """The walk's state before any op, every device's first decision made."""
    S, P = x.num_stages, x.dev_ptr.shape[0] - 1
    st = _start(x)
    c = _Choices(
        np.full(P + 1, _INF),
        np.zeros(P, np.int64),
        np.zeros(P, np.int64),
        np.zeros(P, np.int64),
        np.zeros(S, np.int64),
        _tournament(P),
    )
    for d in range(P):
        for i in range(x.dev_ptr[d], x.dev_ptr[d + 1]):
            c.owner[x.stages[i]] = d
    for d in range(P):
        _redecide(x, st, c, d)
    return st, c


@njit(refcounts=False)
def _redecide(x, st, c, d):
    """Device d's decision again, and the tournament's winners above it (the earlier
    decision, the lower device on a tie: what a scan of the devices in order finds)."""
    c.when[d], c.what[d], c.which[d], c.held[d] = _decide(x, st, d)
    tree = c.tree
    i = (tree.shape[0] // 2 + d) >> 1
    while i > 0:
        a, b = tree[2 * i], tree[2 * i + 1]
        tree[i] = a if c.when[a] <= c.when[b] else b
        i >>= 1


@njit
def _tournament(P):
    """`_Choices.tree` before any decision: every node on the never-chosen P."""
    leaves = 1
    while leaves < P:
        leaves *= 2
    tree = np.full(2 * leaves, P, np.int64)
    tree[leaves : leaves + P] = np.arange(P)
    return tree


# The walk's loop allocates nothing: compiled without reference counting (octodsl.sim.jit), as
# numba would otherwise count a reference for every array it reads out of the state's tuples.
@njit(refcounts=False)
def _run(x, st, c, out, k0):
    """Schedules every op from the k0-th on into `out`; False when it stalls."""
    for k in range(k0, out.kind.shape[0]):
        bd, bt, bk, bs = _pick(x, st, c)
        if bd < 0:
            return False
        _record(out, k, bd, bk, bs, _apply(x, st, c, bd, bt, bk, bs))
    return True


@njit(refcounts=False, inline=True)
def _record(out, k, d, kind, s, mb):
    out.kind[k] = kind
    out.stage[k] = s
    out.mb[k] = mb
    out.device[k] = d


@njit(refcounts=False, inline=True)
def _pick(x, st, c):
    """The next op, (device, start, kind code, stage): the earliest decision of any device;
    device -1 when the walk stalls."""
    P = x.dev_ptr.shape[0] - 1
    bd = c.tree[1]
    if c.when[bd] < _INF:
        return bd, c.when[bd], c.what[bd], c.which[bd]
    # Every device waits and some forward is held back by memory alone: run the first to be
    # ready over the budget rather than stall (the simulator reports the peak).
    stuck_t, stuck_d, stuck_s = _INF, -1, -1
    for d in range(P):
        blocked = c.held[d]
        if blocked >= 0:
            r = max(st.device_free[d], st.ready_f[blocked])
            if r < stuck_t:
                stuck_t, stuck_d, stuck_s = r, d, blocked
    return stuck_d, stuck_t, 0, stuck_s


@njit(refcounts=False, inline=True)
def _apply(x, st, c, bd, bt, bk, s):
    """Runs an op of kind code bk of stage s on device bd from bt; returns its micro-batch."""
    S = x.num_stages
    if bk == 0:
        i = st.f_done[s]
        e = bt + x.f[s]
        st.f_end[s, i] = e
        st.f_done[s] += 1
    elif bk == 1:
        i = st.b_done[s]
        e = bt + x.b[s]
        st.b_end[s, i] = e
        st.b_done[s] += 1
        # B's own act_b comes and goes within it (the budget keeps room for it)
    else:
        i = st.w_done[s]
        e = bt + x.w[s]
        st.w_done[s] += 1
    st.memory[bd] += held_change(bk, x.act[s], x.act_w[s])
    st.device_free[bd] = e
    # what the op changed: its stage's ready times and a neighbour's (the dependency rule),
    # so its device's decision and that neighbour's device's
    if bk != 2:
        _refresh(x, st, s)
    other = -1
    if bk == 1 and s > 0:
        _refresh(x, st, s - 1)
        other = c.owner[s - 1]
    elif bk == 0 and s + 1 < S:
        _refresh(x, st, s + 1)
        other = c.owner[s + 1]
    _redecide(x, st, c, bd)
    if other >= 0 and other != bd:
        _redecide(x, st, c, other)
    return i


@njit
def _copy(st2, c2, st, c):
    """The walk's state and choices (st2, c2) set to another's (st, c)."""
    st2.f_done[:] = st.f_done
    st2.b_done[:] = st.b_done
    st2.w_done[:] = st.w_done
    st2.f_end[:] = st.f_end
    st2.b_end[:] = st.b_end
    st2.device_free[:] = st.device_free
    st2.memory[:] = st.memory
    st2.ready_b[:] = st.ready_b
    st2.ready_f[:] = st.ready_f
    c2.when[:] = c.when
    c2.what[:] = c.what
    c2.which[:] = c.which
    c2.held[:] = c.held
    c2.tree[:] = c.tree


@njit(refcounts=False)
def _may_run(x, st, d, kind, s):
    """When device d may start stage s's next op of `kind` under the walk's rules (the
    dependency rule and memory), inf if not now known."""
    t0 = st.device_free[d]
    if kind == 0:
        r = st.ready_f[s]
        if r == _INF or not _forward_fits(x, st, d, s):
            return _INF
        return max(r, t0)
    if kind == 1:
        r = st.ready_b[s]
        if r == _INF or st.memory[d] + x.act_b[s] > x.cap[d]:
            return _INF
        return max(r, t0)
    return t0 if st.w_done[s] < st.b_done[s] else _INF


def _pilot(x, deadline: float | None = None):
    """The pilot method over the walk: at each step, the op the walk picks or another op its
    device could start before that one ends, whichever the walk's rules then finish soonest
    (each alternative rolled out to the end by the walk); the order and when its last op ends
    by the scheduler's timing, never later than the walk's alone (the walk's own choice is
    always one of those tried, and its rollout is the rest of the walk).

    An alternative runs only where the walk could run it (its producers done, a forward's
    activations within the budget, a B's recompute within the cap), so the order is valid and
    kept to memory as the walk's is.

    Run in chunks of steps of about `_PILOT_CHUNK_SECONDS` each (a step's rollouts take longer
    the more ops a plan has), so that past `deadline` the walk finishes the order from the step
    reached: the walk from the pilot's state ends when the best rollout so far does (it is that
    rollout), so a pilot cut short is as good as the steps it took."""
    p = _pilot_start(x)
    n = p.out.kind.shape[0]
    k, best, chunk = 0, p.best, 1
    while k < n:
        t = time.perf_counter()
        best = _pilot_steps(x, p, best, k, min(n, k + chunk))
        k = min(n, k + chunk)
        now = time.perf_counter()
        if k < n and deadline is not None and now >= deadline:
            if not _run(x, p.st, p.c, p.out, k):
                raise RuntimeError("list scheduling stalled with no op held back")
            break
        chunk = max(1, min(4 * chunk, int(chunk * _PILOT_CHUNK_SECONDS / max(now - t, 1e-6))))
    return p.out, best


_PILOT_CHUNK_SECONDS = 0.01
"""How long the pilot method runs between looks at the clock: the most it overruns a deadline,
about (a step of nemotron-h-56b on 16 devices x 32 micro-batches takes under a millisecond)."""


class _PilotState(NamedTuple):
    """The pilot method's state between its chunks of steps."""

    out: _Order
    scratch: _Order
    st: _Progress
    c: _Choices
    st2: _Progress
    c2: _Choices
    dur: np.ndarray
    best: float


@njit
def _pilot_start(x):
    """The pilot method before its first step: the walk alone rolled out for its end."""
    S, M = x.num_stages, x.microbatches
    N = 3 * S * M
    out = _empty_order(N)
    scratch = _empty_order(N)
    st, c = _fresh(x)
    st2, c2 = _fresh(x)
    _copy(st2, c2, st, c)
    if not _run(x, st2, c2, scratch, 0):
        raise RuntimeError("list scheduling stalled with no op held back")
    dur = np.empty((3, S))
    dur[0], dur[1], dur[2] = x.f, x.b, x.w
    return _PilotState(out, scratch, st, c, st2, c2, dur, st2.device_free.max())


@njit
def _pilot_steps(x, p, best, k0, k1):
    """The pilot method's steps k0 .. k1 - 1 (`_pilot`); the end of the best rollout so far."""
    st, c, st2, c2, dur = p.st, p.c, p.st2, p.c2, p.dur
    for k in range(k0, k1):
        bd, bt, bk, bs = _pick(x, st, c)
        ct, ck, cs = bt, bk, bs
        limit = bt + dur[bk, bs]
        for i in range(x.dev_ptr[bd], x.dev_ptr[bd + 1]):
            s = x.stages[i]
            for kind in range(3):
                if kind == bk and s == bs:
                    continue
                r = _may_run(x, st, bd, kind, s)
                if r >= limit:
                    continue
                _copy(st2, c2, st, c)
                _apply(x, st2, c2, bd, r, kind, s)
                if not _run(x, st2, c2, p.scratch, k + 1):
                    continue
                end = st2.device_free.max()
                if end < best - 1e-12:
                    best, ct, ck, cs = end, r, kind, s
        _record(p.out, k, bd, ck, cs, _apply(x, st, c, bd, ct, ck, cs))
    return best
