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

Static bytes are ZeRO-sharded as the problem's header says (`Problem.layer_static`). A stage that
recomputes keeps less from F to B (full: its input; selective: all but `sel_act`), its B takes
longer (full: + its F; selective: + `sel_f`), and while one of its B's runs the device holds
what it brings back as well: so a device's room is the limit less its static bytes and the
most one of its B's brings back, as the list scheduler counts it.

This prices balance and the fill/drain bubble together: a deep device starts late, so it should
carry less work, and a device whose first stage is tiny idles until its first backward.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from ...costs.levers import RECOMPUTE_CODE, RECOMPUTE_FULL, RECOMPUTE_SELECTIVE
from ...plan import Recompute
from ...sim.jit import njit
from ...sim.links import cut_crosses_nodes, link_times
from ..problem import Problem

_UNFIT = 1e12
"""Seconds no real layout takes: the scale of the score of one that does not fit."""

_TIE_BREAK = 1e-3
"""Weight of the devices' mean bound beside the slowest device's: it breaks ties between layouts
with the same slowest device."""


class _LayerSums(NamedTuple):
    """Prefix sums over the layers, one array each: entry c sums the layers before layer c."""

    f: np.ndarray
    b: np.ndarray
    w: np.ndarray
    """W seconds as the plan runs them (with the gradient-accumulation pass as the header's
    runtime runs it: `Problem.accumulation`)."""
    act: np.ndarray
    static: np.ndarray
    """ZeRO-sharded (`Problem.layer_static`)."""
    sel_act: np.ndarray
    """Bytes selective recompute drops, and below the seconds it runs again."""
    sel_f: np.ndarray


class _Inputs(NamedTuple):
    """What the compiled bound reads besides the cuts; per stage unless said."""

    stage_device: np.ndarray
    mode: np.ndarray
    """What each stage recomputes (`RECOMPUTE_CODE`); FillModel.set_modes writes it in place."""
    devices: int
    microbatches: int
    limit: float
    """Bytes per device (inf: no limit)."""
    sums: _LayerSums
    input_bytes: np.ndarray
    """Per layer c: what a stage starting at c keeps under full recompute (0 at the end)."""
    hop: np.ndarray
    """[stage, layer c]: a message of layer c's output across the cut after the stage, on the
    link the cut's ranks take (octodsl.sim.links)."""
    dev_ptr: np.ndarray
    """Device d holds stages dev_stages[dev_ptr[d]:dev_ptr[d + 1]], in stage order."""
    dev_stages: np.ndarray
    first: np.ndarray
    """Per device: its first stage, and below its deepest (-1 for none)."""
    deepest: np.ndarray


class _StageSums(NamedTuple):
    """Per stage, its layers' sums with its recompute mode applied."""

    f: np.ndarray
    b: np.ndarray
    """With what recompute runs again."""
    act: np.ndarray
    """Kept from F to B."""
    static: np.ndarray
    load: np.ndarray
    """F + B + W seconds."""
    brought: np.ndarray
    """What its B brings back by recompute (`StageCost.act_b`)."""


class _DeviceSums(NamedTuple):
    """Per device, over its stages."""

    load: np.ndarray
    act: np.ndarray
    held: np.ndarray
    """Static bytes plus the most one of its B's brings back."""


class _Scratch(NamedTuple):
    """The arrays an evaluation of the bound fills, allocated once per model: a search values
    thousands of cuts, and allocating a dozen arrays for each took longer than the arithmetic."""

    st: _StageSums
    dev: _DeviceSums
    hop: np.ndarray
    """Per stage: the message time after it (0 within a device)."""
    arrive: np.ndarray
    back: np.ndarray
    pace: np.ndarray
    seen: np.ndarray
    """[slot, cut]: the cuts the model's descents passed through, an open-addressing hash table
    (`_visit`) of the slots in `used`. Kept from one search of the model to the next (a value
    depends on the cuts alone) until its recompute modes change."""
    used: np.ndarray
    """Per slot: whether it holds cuts (a table's rows are written, and so its memory touched,
    only as descents reach them)."""
    end: np.ndarray
    """Per slot: the slot of the cuts where the descent through its cuts ends (-1: not known,
    for the descent under way or one whose end found no slot)."""
    value: np.ndarray
    """Per slot that ends a descent: the bound there."""
    path: np.ndarray
    """The slots of the descent under way."""
    filled: np.ndarray
    """[0]: the slots of `seen` in use."""
    kept: np.ndarray
    """The sums of the two stages either side of the cut a descent shifts and of their devices
    before the shift (`_keep`), put back after it (`_put_back`)."""


_SEEN_SLOTS = 4096
"""Slots of the table of cuts a model's descents passed through; it stops growing at half full
(a search of jamba-v0.1 on 16 devices passes through 60 cuts on average, nemotron-h-56b's 220;
cuts of 32-bit integers: 1 MB for 64 stages)."""


class FillModel:
    """`model(cuts)` -> the bound above for one placement (`devices[s]` per stage) and what
    each stage recomputes (`recompute[s]`, default none)."""

    def __init__(
        self, problem: Problem, devices: tuple[int, ...], recompute: tuple[Recompute, ...] = ()
    ) -> None:
        sums, input_bytes, hop_intra, hop_inter = _layer_part(problem)
        inter = cut_crosses_nodes(problem.mesh, devices)
        hop = np.where(inter[:, None], hop_inter, hop_intra).reshape(len(devices), -1)
        limit = float(problem.memory) if problem.memory is not None else np.inf
        sd = np.array(devices, np.int64)
        S, P = len(devices), problem.devices
        dev_stages = np.argsort(sd, kind="stable")
        dev_ptr = np.concatenate([[0], np.cumsum(np.bincount(sd, minlength=P))])
        held = np.diff(dev_ptr) > 0
        first, deepest = np.full(P, -1, np.int64), np.full(P, -1, np.int64)
        first[held] = dev_stages[dev_ptr[:-1][held]]
        deepest[held] = dev_stages[dev_ptr[1:][held] - 1]
        self.inputs = _Inputs(
            sd,
            np.zeros(S, np.int64),
            P,
            problem.microbatches,
            limit,
            sums,
            input_bytes,
            hop,
            dev_ptr,
            dev_stages,
            first,
            deepest,
        )
        self.scratch = _Scratch(
            _stage_arrays(S),
            _DeviceSums(*(np.zeros(P) for _ in _DeviceSums._fields)),
            hop=np.zeros(S),
            arrive=np.zeros(S),
            back=np.zeros(S),
            pace=np.zeros(S),
            seen=np.empty((_SEEN_SLOTS, S + 1), np.int32),
            used=np.zeros(_SEEN_SLOTS, np.bool_),
            end=np.empty(_SEEN_SLOTS, np.int64),
            value=np.empty(_SEEN_SLOTS),
            path=np.empty(_SEEN_SLOTS, np.int64),
            filled=np.zeros(1, np.int64),
            kept=np.zeros(_KEPT),
        )
        if recompute:
            self.set_modes(recompute)

    def set_modes(self, recompute: tuple[Recompute, ...] | list[Recompute]) -> None:
        """What each stage recomputes from now on."""
        self.inputs.mode[:] = [RECOMPUTE_CODE[m] for m in recompute]
        self._forget()

    def _forget(self) -> None:
        """Empty the table of descents (`_Scratch.seen`): the modes changed the values."""
        self.scratch.used[:] = False
        self.scratch.filled[0] = 0

    def __call__(self, cuts) -> float:
        return _bound(np.asarray(cuts, np.int64), self.inputs, self.scratch)

    def stage_sums(self, cuts) -> _StageSums:
        """Per stage of `cuts`, the sums the bound is made of (for the tests that hold them
        equal to `CostTable.stage_costs`)."""
        out = _stage_arrays(len(cuts) - 1)
        _stage_sums(np.asarray(cuts, np.int64), self.inputs, out)
        return out

    @staticmethod
    def fits(value: float) -> bool:
        """Whether a value of this model is of a layout whose every device holds its static
        bytes and one micro-batch's activations within the limit."""
        return value < _UNFIT

    def search(self, cuts: np.ndarray, kicks: np.ndarray) -> float:
        """Steepest descent over one-layer shifts of single cuts from `cuts`, then from each
        kick of the best cuts so far, keeping the best (in `cuts`, in place); its value.
        kicks[k] lists the kick's (cut, layers) shifts, (0, 0) for none; a shift that would
        empty a stage is skipped."""
        return _search(cuts, np.empty_like(cuts), kicks, self.inputs, self.scratch)

    def fit_modes(self, cuts, modes: tuple[Recompute, ...]) -> tuple[Recompute, ...]:
        """Steepest descent over single stages' recompute modes (of `modes`) for `cuts`, from
        the model's own; a change counts when it lowers the bound by more than a relative 1e-9,
        the lower stage and the earlier mode of `modes` on ties. The model keeps the modes it
        ends with, and returns them."""
        allowed = np.array([RECOMPUTE_CODE[m] for m in modes], np.int64)
        _fit_modes(np.asarray(cuts, np.int64), allowed, self.inputs, self.scratch)
        self._forget()
        return tuple(_MODE_OF_CODE[int(k)] for k in self.inputs.mode)


_MODE_OF_CODE = {code: mode for mode, code in RECOMPUTE_CODE.items()}


class _LayerPart(NamedTuple):
    """What a FillModel reads of the problem's layers, whatever the placement (shared by every
    model of the problem, which only reads them)."""

    sums: _LayerSums
    input_bytes: np.ndarray
    hop_intra: np.ndarray
    """Per layer c: a message of its output inside a node, and below between nodes."""
    hop_inter: np.ndarray


def _layer_part(problem: Problem) -> _LayerPart:
    """The problem's `_LayerPart`, built once per header: a search builds a model for each
    placement and recompute modes it rebalances, hundreds per tune."""
    header, part = problem.fill_layers
    if header is problem.header and isinstance(part, _LayerPart):
        return part
    table = problem.table
    layers = table.layers
    rows = [
        [l.f for l in layers],
        [l.b for l in layers],
        list(problem.column("w") + problem.accumulation()),
        [l.act for l in layers],
        list(problem.layer_static()),
        [l.sel_act for l in layers],
        [l.sel_f for l in layers],
    ]
    sums = _LayerSums(*(np.concatenate([[0.0], np.cumsum(np.array(r, float))]) for r in rows))
    input_bytes = np.array([table.input_bytes(c) for c in range(len(layers))] + [0.0])
    out = np.array([l.message_bytes for l in layers], float)
    extra = float(table.meta.get("message_overhead", 0.0))
    part = _LayerPart(
        sums,
        input_bytes,
        link_times(problem.link, out) + extra,
        link_times(problem.inter_link or problem.link, out) + extra,
    )
    problem.fill_layers = (problem.header, part)
    return part


def _stage_arrays(num_stages: int) -> _StageSums:
    return _StageSums(*(np.zeros(num_stages) for _ in _StageSums._fields))


# The bound's kernels allocate nothing (they fill the model's scratch arrays), so they compile
# without reference counting (octodsl.sim.jit). What a descent runs for each neighbour
# (`_keep`, `_resum`, `_rest`, `_put_back`) is inlined into it (octodsl.sim.jit): called, each
# was passed the model's named tuples by value, a copy that took a quarter of a descent.
@njit(refcounts=False)
def _visit(w, c):
    """The slot of cuts `c` in `w.seen`, added (its end not known) when not in it; -1 when not
    in it and the table is full: it stops growing at half full (then cuts not in it are
    descended from as they were before it), so a probe always ends at an empty slot."""
    seen, n = w.seen, c.shape[0]
    h = 0
    for i in range(n):
        h = (h * 1000003 + c[i]) & 0xFFFFFFFF
    slots = seen.shape[0]
    k = h % slots
    while w.used[k]:
        same = True
        for i in range(n):
            if seen[k, i] != c[i]:
                same = False
                break
        if same:
            return k
        k = (k + 1) % slots
    if 2 * w.filled[0] >= slots:
        return -1
    for i in range(n):
        seen[k, i] = c[i]
    w.used[k] = True
    w.end[k] = -1
    w.filled[0] += 1
    return k


@njit(refcounts=False)
def _ended(c, w, n, k, e):
    """The descent under way, through `n` slots of `w.path`, ends at slot `e`'s cuts (when
    e >= 0, its value known): put them in `c` (when not at them already, slot `k`); the
    value."""
    if e >= 0:
        for p in range(n):
            w.end[w.path[p]] = e
        if e != k:
            for i in range(c.shape[0]):
                c[i] = w.seen[e, i]
    return w.value[e] if e >= 0 else np.inf


@njit(refcounts=False)
def _descend(c, x, w):
    """Steepest descent from `c` (in place); its value. A shift of cut i changes only stages
    i - 1 and i, so each neighbour re-sums those two stages and their devices (and puts back
    their sums before the shift after: the values re-summing them would give again). A neighbour is valued only as far as it could beat the best neighbour so far
    (`_rest`'s `below`), which picks the same one. The value depends on the cuts alone, so
    from cuts an earlier descent of the model passed through the descent ends where that one
    ended: it goes there at once (`w.seen`). Within a search that end was valued already, so
    it is no better than the search's best so far (a search keeps a descent's end only when
    it is better)."""
    n = 0
    k = _visit(w, c)
    if k >= 0 and w.end[k] >= 0:
        return _ended(c, w, n, k, w.end[k])
    cur = _bound(c, x, w)
    while True:
        if k >= 0:
            w.path[n] = k
            n += 1
        best, best_i, best_d = cur, -1, 0
        for i in range(1, c.shape[0] - 1):
            _keep(x, w, i)
            for d in (-1, 1):
                if c[i - 1] < c[i] + d < c[i + 1]:
                    c[i] += d
                    _resum(c, x, w, i)
                    v = _rest(c, x, w, best)
                    c[i] -= d
                    _put_back(x, w, i)
                    if v < best:
                        best, best_i, best_d = v, i, d
        if best_i < 0:
            if k < 0:  # an end with no slot: the descents through this one stay unknown
                return cur
            w.value[k] = cur
            return _ended(c, w, n, k, k)
        cur = best
        c[best_i] += best_d
        k = _visit(w, c)
        if k >= 0 and w.end[k] >= 0:
            return _ended(c, w, n, k, w.end[k])
        _resum(c, x, w, best_i)


@njit(refcounts=False)
def _search(best, trial, kicks, x, w):
    best_v = _descend(best, x, w)
    n = best.shape[0]
    for k in range(kicks.shape[0]):
        for i in range(n):
            trial[i] = best[i]
        for j in range(kicks.shape[1]):
            i, d = kicks[k, j, 0], kicks[k, j, 1]
            if i > 0 and trial[i - 1] < trial[i] + d < trial[i + 1]:
                trial[i] += d
        v = _descend(trial, x, w)
        if v < best_v:
            for i in range(n):
                best[i] = trial[i]
            best_v = v
    return best_v


@njit(refcounts=False)
def _fit_modes(c, allowed, x, w):
    """A mode change of stage s changes only its sums and its device's, so each change re-sums
    those (and sums them back after), and is valued only as far as it could count (`_rest`'s
    `below`: a value it makes inf is not below the bar either), as `_descend` does."""
    cur = _bound(c, x, w)
    while True:
        best, best_s, best_m = cur, -1, -1
        for s in range(x.mode.shape[0]):
            was = x.mode[s]
            for m in allowed:
                if m == was:
                    continue
                x.mode[s] = m
                _resum_stage(c, x, w, s)
                bar = best * (1 - 1e-9)
                v = _rest(c, x, w, bar)
                if v < bar:
                    best, best_s, best_m = v, s, m
            x.mode[s] = was
            _resum_stage(c, x, w, s)
        if best_s < 0:
            return
        x.mode[best_s] = best_m
        _resum_stage(c, x, w, best_s)
        cur = best


@njit(refcounts=False, inline=True)
def _resum_stage(c, x, w, s):
    """The sums of stage s and of its device, again."""
    _stage_sum(c, x, s, w.st)
    _device_sum(x, w, x.stage_device[s])


@njit(refcounts=False, inline=True)
def _resum(c, x, w, i):
    """The sums of stages i - 1 and i (either side of cut i) and of their devices, again."""
    for s in (i - 1, i):
        _stage_sum(c, x, s, w.st)
        _device_sum(x, w, x.stage_device[s])


_KEPT = 2 * len(_StageSums._fields) + 2 * len(_DeviceSums._fields)
"""Floats `_keep` keeps: two stages' sums and two devices'."""


@njit(refcounts=False, inline=True)
def _keep(x, w, i):
    """Keep the sums of stages i - 1 and i and of their devices in `w.kept`."""
    st, dev, k = w.st, w.dev, w.kept
    j = 0
    for s in (i - 1, i):
        k[j], k[j + 1], k[j + 2] = st.f[s], st.b[s], st.act[s]
        k[j + 3], k[j + 4], k[j + 5] = st.static[s], st.load[s], st.brought[s]
        d = x.stage_device[s]
        k[j + 6], k[j + 7], k[j + 8] = dev.load[d], dev.act[d], dev.held[d]
        j += 9


@njit(refcounts=False, inline=True)
def _put_back(x, w, i):
    """The sums `_keep` kept, back in place (the later stage's device last, as `_resum` sums
    it last: when both stages are on one device, both kept the same sums)."""
    st, dev, k = w.st, w.dev, w.kept
    j = 0
    for s in (i - 1, i):
        st.f[s], st.b[s], st.act[s] = k[j], k[j + 1], k[j + 2]
        st.static[s], st.load[s], st.brought[s] = k[j + 3], k[j + 4], k[j + 5]
        d = x.stage_device[s]
        dev.load[d], dev.act[d], dev.held[d] = k[j + 6], k[j + 7], k[j + 8]
        j += 9


@njit(refcounts=False)
def recomputed_code(mode, f, act, sel_f, sel_act, input_bytes):
    """octodsl.costs.levers.recomputed for a mode's code, compiled: (seconds B runs again,
    bytes F keeps until B). It mirrors that rule (tests/tune/test_mirrors.py holds them equal)."""
    if mode == RECOMPUTE_FULL:
        return f, min(act, input_bytes)
    if mode == RECOMPUTE_SELECTIVE:
        return sel_f, act - sel_act
    return 0.0, act


@njit(refcounts=False)
def _stage_sums(c, x, out):
    """The layers' sums over each stage into `out`, as `CostTable.range_costs` sums them (W
    without the gradient-accumulation pass)."""
    for s in range(x.stage_device.shape[0]):
        _stage_sum(c, x, s, out)


@njit(refcounts=False)
def _stage_sum(c, x, s, out):
    p = x.sums
    a, b = c[s], c[s + 1]
    f = p.f[b] - p.f[a]
    act = p.act[b] - p.act[a]
    again, kept = recomputed_code(
        x.mode[s],
        f,
        act,
        p.sel_f[b] - p.sel_f[a],
        p.sel_act[b] - p.sel_act[a],
        x.input_bytes[a],
    )
    out.f[s] = f
    out.b[s] = p.b[b] - p.b[a] + again
    out.act[s] = kept
    out.static[s] = p.static[b] - p.static[a]
    out.load[s] = f + out.b[s] + p.w[b] - p.w[a]
    out.brought[s] = act - kept


# Micro-batch 0's path follows the dependency rule: it mirrors octodsl.dag.producers (F after
# the F before it, B after its F and the B after it; tests/tune/test_mirrors.py holds it to it).
@njit(refcounts=False)
def _first_trip(c, x, w):
    """When micro-batch 0's forward reaches each stage (w.arrive), and when its input gradient
    can start there (w.back); messages only between stages of different devices."""
    sd, st, h, arrive, back = x.stage_device, w.st, w.hop, w.arrive, w.back
    S = sd.shape[0]
    for s in range(S - 1):
        h[s] = x.hop[s, c[s + 1] - 1] if sd[s] != sd[s + 1] else 0.0
    arrive[0] = 0.0
    for s in range(1, S):
        arrive[s] = arrive[s - 1] + st.f[s - 1] + h[s - 1]
    back[S - 1] = arrive[S - 1] + st.f[S - 1]
    for s in range(S - 2, -1, -1):
        back[s] = back[s + 1] + st.b[s + 1] + h[s]


@njit(refcounts=False)
def _device_sum(x, w, d):
    st, dev = w.st, w.dev
    load, act, static, brought = 0.0, 0.0, 0.0, 0.0
    for i in range(x.dev_ptr[d], x.dev_ptr[d + 1]):
        s = x.dev_stages[i]
        load += st.load[s]
        act += st.act[s]
        static += st.static[s]
        brought = max(brought, st.brought[s])
    dev.load[d] = load
    dev.act[d] = act
    dev.held[d] = static + brought


@njit(refcounts=False)
def _device_bound(d, x, w):
    """The module docstring's a_d + max(M * load_d + fill_d, M * pace_d) for device d, whose
    stages run from its first to its deepest."""
    M, limit, st, dev = x.microbatches, x.limit, w.st, w.dev
    arrive, back, pace = w.arrive, w.back, w.pace
    first, hs = x.first[d], x.deepest[d]
    act, held_static = dev.act[d], dev.held[d]
    cap = float(M)
    if limit < np.inf and act > 0:
        cap = min(cap, float(np.floor((limit - held_static) / act)))
    a = arrive[first]
    early = 0.0
    # Memory throttle: stage s holds a micro-batch's activations for its round trip, so
    # at one micro-batch per `pace` it holds about trip / pace of them; the fastest pace
    # whose activations fit beside the static bytes.
    held = 0.0
    for i in range(x.dev_ptr[d], x.dev_ptr[d + 1]):
        s = x.dev_stages[i]
        reach = 1.0 + np.floor((back[hs] - arrive[s]) / pace[s]) if pace[s] > 0 else cap
        early += st.f[s] * min(cap, reach)
        held += st.act[s] * (back[s] + st.b[s] - arrive[s])
    fill = max(0.0, back[hs] - a - early)
    throttle = held / (limit - held_static)
    return a + max(M * dev.load[d] + fill, M * throttle)


@njit(refcounts=False)
def _bound(c, x, w):
    _stage_sums(c, x, w.st)
    for d in range(x.devices):
        _device_sum(x, w, d)
    return _rest(c, x, w, np.inf)


@njit(refcounts=False, inline=True)
def _rest(c, x, w, below):
    """The bound from the stage and device sums in `w`; or inf as soon as it is sure to be at
    least `below` (a descent needs only the neighbours that beat its best so far). Sure
    because a fitting layout's bound is its slowest device's plus a non-negative tie-break,
    and device d's is at least M * load_d (arrival, fill and throttle are non-negative: sums
    of seconds and bytes): so it is inf only where the full value is >= `below`, or NaN,
    which compares as not below either. Before the costlier part (fill and throttle), the same
    holds for the bound with a_d + M * load_d in place of each device's: every operation of the
    value rises with its operands, so that bound is at most the value, float for float."""
    S, P, limit = x.stage_device.shape[0], x.devices, x.limit
    st, dev, pace = w.st, w.dev, w.pace
    overflow = 0.0
    for d in range(P):
        overflow += max(0.0, dev.held[d] + dev.act[d] - limit)
    if overflow > 0:
        return _UNFIT * (1.0 + overflow / limit)
    M = x.microbatches
    for d in range(P):
        if x.first[d] >= 0 and M * dev.load[d] >= below:
            return np.inf
    _first_trip(c, x, w)
    # a_d + M * load_d <= device d's bound (fill and throttle are >= 0)
    low_worst = 0.0
    low_total = 0.0
    for d in range(P):
        if x.first[d] >= 0:
            low = w.arrive[x.first[d]] + M * dev.load[d]
            low_worst = max(low_worst, low)
            low_total += low
    if low_worst + _TIE_BREAK * low_total / P >= below:
        return np.inf
    # Forwards reach stage s no faster than the slowest forward before it lets them through.
    pace[0] = 0.0
    for s in range(1, S):
        pace[s] = max(pace[s - 1], st.f[s - 1])
    worst = 0.0
    total = 0.0
    for d in range(P):
        if x.first[d] < 0:
            continue
        t = _device_bound(d, x, w)
        worst = max(worst, t)
        if worst >= below:
            return np.inf
        total += t
    return worst + _TIE_BREAK * total / P
