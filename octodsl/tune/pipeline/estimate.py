"""The partition phase's objective: a closed-form, bubble-aware bound on when each device can
finish, used to rank the many cuts a partition search visits before the simulator times the few
it keeps.

For device d, with its stages' per-micro-batch work `load_d`, the bound is

    a_d + max(M * load_d + fill_d, M * pace_d)

- a_d: when micro-batch 0 first reaches d (the forwards and messages before d's first stage);
- fill_d: the warm-up gap d cannot fill: until the first input gradient comes back to d's
  deepest stage, d can only run forwards: of each of its stages, the micro-batches that reach
  it by then (one per slowest forward upstream; all of them at the first stage) and that its
  memory admits;
- cap_d: micro-batches whose activations fit beside d's static bytes (no limit: M);
- pace_d: the memory throttle: each stage s of d holds a micro-batch's activations a_s for
  its round trip R_s (forward to input-gradient backward), so one micro-batch every pace_d
  needs about sum(a_s * R_s / pace_d) bytes beside the static ones.
A layout whose static bytes and one micro-batch overflow some device scores above any that
fits, the more the larger the overflow, so a search is led toward layouts that fit.

Static bytes are ZeRO-sharded as the problem's header says (`Problem.share`). A stage that
recomputes keeps less from F to B (full: its input; selective: all but `sel_act`), its B takes
longer (full: + its F; selective: + `sel_f`), and while one of its B's runs the device holds
what it brings back as well: so a device's room is the limit less its static bytes and the
most one of its B's brings back, as the list scheduler counts it.

This prices balance and the fill/drain bubble together: a deep device starts late, so it should
carry less work, and a device whose first stage is tiny idles until its first backward.
"""

from __future__ import annotations

import numpy as np

from ...plan import Recompute
from ...sim.jit import njit
from ...sim.links import cut_crosses_nodes, link_times
from ..problem import Problem

_MODE = {Recompute.NONE: 0, Recompute.SELECTIVE: 1, Recompute.FULL: 2}
"""Recompute modes as the compiled bound reads them."""

_UNFIT = 1e12
"""Seconds no real layout takes: the scale of the score of one that does not fit."""


class FillModel:
    """`model(cuts)` -> the bound above for one placement (`devices[s]` per stage) and what
    each stage recomputes (`recompute[s]`, default none)."""

    def __init__(self, problem: Problem, devices: tuple[int, ...],
                 recompute: tuple[Recompute, ...] = ()) -> None:
        table = problem.table
        layers = table.layers
        # Prefix sums over the layers, one row each: F, B, W, act, static (ZeRO-sharded),
        # selective's dropped bytes and its extra seconds.
        rows = np.array([[l.f for l in layers], [l.b for l in layers], [l.w for l in layers],
                         [l.act for l in layers], list(problem.layer_static()),
                         [l.sel_act for l in layers], [l.sel_f for l in layers]], float)
        self.pre = np.concatenate([np.zeros((len(rows), 1)), np.cumsum(rows, axis=1)], axis=1)
        # What a stage starting at layer c keeps under full recompute (none at the end).
        self.inb = np.array([table.input_bytes(c) for c in range(len(layers))] + [0.0])
        self.sd = np.array(devices, np.int64)
        # Per cut s and layer c: a message of layer c's output across cut s, on the link the
        # cut's ranks take (octodsl.sim.links).
        out = np.array([l.message_bytes for l in layers], float)
        inter = cut_crosses_nodes(problem.mesh, devices)
        extra = float(table.meta.get("message_overhead", 0.0))
        self.hop = np.array([link_times(problem.inter_link or problem.link if x else problem.link, out)
                             for x in inter.tolist()]).reshape(len(devices), len(layers)) + extra
        self.mode = np.zeros(len(devices), np.int64)
        if recompute:
            self.set_modes(recompute)
        self.P = problem.devices
        self.M = problem.microbatches
        self.limit = float(problem.memory) if problem.memory is not None else np.inf

    def set_modes(self, recompute: tuple[Recompute, ...] | list[Recompute]) -> None:
        """What each stage recomputes from now on."""
        self.mode[:] = [_MODE[m] for m in recompute]

    def __call__(self, cuts) -> float:
        return _bound(np.asarray(cuts, np.int64), *self._args())

    @staticmethod
    def fits(value: float) -> bool:
        """Whether a value of this model is of a layout whose every device holds its static
        bytes and one micro-batch's activations within the limit."""
        return value < _UNFIT

    def descend(self, cuts: np.ndarray) -> float:
        """Steepest descent over one-layer shifts of single cuts, in place; the final value."""
        return _descend(cuts, *self._args())

    def _args(self):
        return (self.sd, self.mode, self.P, self.M, self.limit, self.pre, self.inb, self.hop)


@njit
def _descend(c, sd, mode, P, M, limit, pre, inb, hop):
    cur = _bound(c, sd, mode, P, M, limit, pre, inb, hop)
    while True:
        best, best_i, best_d = cur, -1, 0
        for i in range(1, c.shape[0] - 1):
            for d in (-1, 1):
                if c[i - 1] < c[i] + d < c[i + 1]:
                    c[i] += d
                    v = _bound(c, sd, mode, P, M, limit, pre, inb, hop)
                    c[i] -= d
                    if v < best:
                        best, best_i, best_d = v, i, d
        if best_i < 0:
            return cur
        cur = best
        c[best_i] += best_d


@njit
def _first_trip(c, sd, sf, sb, hop):
    """When micro-batch 0's forward reaches each stage, and when its input gradient can start
    there (messages only between stages of different devices)."""
    S = sd.shape[0]
    # Message time after each stage (none between stages of one device).
    h = np.zeros(S)
    for s in range(S - 1):
        if sd[s] != sd[s + 1]:
            h[s] = hop[s, c[s + 1] - 1]
    arrive = np.zeros(S)  # micro-batch 0's forward reaches stage s
    for s in range(1, S):
        arrive[s] = arrive[s - 1] + sf[s - 1] + h[s - 1]
    back = np.zeros(S)  # micro-batch 0's input gradient can start on stage s
    back[S - 1] = arrive[S - 1] + sf[S - 1]
    for s in range(S - 2, -1, -1):
        back[s] = back[s + 1] + sb[s + 1] + h[s]
    return arrive, back


@njit
def _device_sums(sd, P, load_s, sa, ss, back_s):
    """Per device: its first and deepest stage (-1 for none), its stages' summed work,
    kept activations, and its static bytes plus the most one of its B's brings back."""
    first = np.full(P, -1, np.int64)
    deepest = np.full(P, -1, np.int64)
    load = np.zeros(P)
    act = np.zeros(P)
    static = np.zeros(P)
    brought = np.zeros(P)
    for s in range(sd.shape[0]):
        d = sd[s]
        if first[d] < 0:
            first[d] = s
        deepest[d] = s
        load[d] += load_s[s]
        act[d] += sa[s]
        static[d] += ss[s]
        brought[d] = max(brought[d], back_s[s])
    return first, deepest, load, act, static + brought


@njit
def _device_bound(d, first, hs, M, limit, load, act, static, sd, sf, sb, sa, arrive, back, pace):
    """The module docstring's a_d + max(M * load_d + fill_d, M * pace_d) for device d, whose
    stages run from `first` to `hs` (its deepest)."""
    cap = float(M)
    if limit < np.inf and act > 0:
        cap = min(cap, float(np.floor((limit - static) / act)))
    a = arrive[first]
    early = 0.0
    for s in range(first, hs + 1):
        if sd[s] == d:
            reach = 1.0 + np.floor((back[hs] - arrive[s]) / pace[s]) if pace[s] > 0 else cap
            early += sf[s] * min(cap, reach)
    fill = max(0.0, back[hs] - a - early)
    # Memory throttle: stage s holds a micro-batch's activations for its round trip, so
    # at one micro-batch per `pace` it holds about trip / pace of them; the fastest pace
    # whose activations fit beside the static bytes.
    held = 0.0
    for s in range(first, hs + 1):
        if sd[s] == d:
            held += sa[s] * (back[s] + sb[s] - arrive[s])
    throttle = held / (limit - static)
    return a + max(M * load + fill, M * throttle)


@njit
def _bound(c, sd, mode, P, M, limit, pre, inb, hop):
    S = sd.shape[0]
    sf, sb, sa, ss = np.empty(S), np.empty(S), np.empty(S), np.empty(S)
    load_s, back_s = np.empty(S), np.empty(S)
    for s in range(S):  # the rows' sums over each stage's layers
        a, b = c[s], c[s + 1]
        sf[s] = pre[0, b] - pre[0, a]
        sb[s] = pre[1, b] - pre[1, a]
        sa[s] = pre[3, b] - pre[3, a]
        ss[s] = pre[4, b] - pre[4, a]
        whole = sa[s]
        # recompute: B runs again what F dropped, F keeps less
        if mode[s] == 1:
            sb[s] += pre[6, b] - pre[6, a]
            sa[s] -= pre[5, b] - pre[5, a]
        elif mode[s] == 2:
            sb[s] += sf[s]
            sa[s] = min(sa[s], inb[a])
        load_s[s] = sf[s] + sb[s] + pre[2, b] - pre[2, a]
        back_s[s] = whole - sa[s]
    arrive, back = _first_trip(c, sd, sf, sb, hop)
    first, deepest, load, act, static = _device_sums(sd, P, load_s, sa, ss, back_s)
    overflow = 0.0
    for d in range(P):
        overflow += max(0.0, static[d] + act[d] - limit)
    if overflow > 0:
        return _UNFIT * (1.0 + overflow / limit)
    # Forwards reach stage s no faster than the slowest forward before it lets them through.
    pace = np.zeros(S)
    for s in range(1, S):
        pace[s] = max(pace[s - 1], sf[s - 1])
    worst = 0.0
    total = 0.0
    for d in range(P):
        if first[d] < 0:
            continue
        t = _device_bound(d, first[d], deepest[d], M, limit, load[d], act[d], static[d],
                          sd, sf, sb, sa, arrive, back, pace)
        worst = max(worst, t)
        total += t
    # The mean breaks ties between layouts with the same slowest device.
    return worst + 1e-3 * total / P
