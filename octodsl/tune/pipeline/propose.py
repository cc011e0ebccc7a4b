"""The candidate moves of each phase for the current plan, most promising first, and the random
kick that restarts the search from a changed copy of the best plan.

A proposal is a description for `--explain` and a function that builds the plan, so a round
that accepts its first candidate builds no others. Partition and placement proposals change the
layout and get a fresh order from the list scheduler; schedule and memory proposals edit the
current order, except recompute moves, which change the layout's modes and rebuild the order
(the list scheduler admits more micro-batches when they keep less). Under `--keep` the loop
drops every proposal whose layout the problem does not allow.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import numpy as np

from ...costs.levers import Zero
from ...plan import OpKind, Plan
from ...sim import SimResult
from ..problem import AUTO, Problem
from .diagnose import Bottleneck
from .evaluate import Score
from .layout import StageLayout, even_cuts
from .moves import memory, overlap, partition, placement, recompute, schedule


@dataclass(frozen=True)
class Proposal:
    move: str
    build: Callable[[], Plan]
    layout: StageLayout | None = None
    """Set for partition and placement moves: the layout the plan will have."""
    w_gap: bool | None = None
    """The list scheduler's setting the plan is built with, when it is rebuilt."""


@dataclass
class State:
    problem: Problem
    score: Score
    layout: StageLayout
    w_gap: bool
    """How the current plan's order was built (schedule moves keep it)."""
    bottleneck: Bottleneck
    seed: int

    @property
    def result(self) -> SimResult:
        """The current plan's simulation: a search state is made only for a plan that ran."""
        assert self.score.result is not None, "a state's plan has a simulation"
        return self.score.result


def proposals(phase: str, st: State) -> Iterator[Proposal]:
    return {
        "memory": _memory,
        "partition": _partition,
        "placement": _placement,
        "schedule": _schedule,
    }[phase](st)


def _rebuilt(st: State, layout: StageLayout) -> Callable[[], Plan]:
    """Builds `layout` with a fresh order from the list scheduler, set as the state's was."""
    return lambda: schedule.rebuild(st.problem.skeleton(layout), st.problem, st.w_gap)


def _given(plan: Plan) -> Callable[[], Plan]:
    """Builds `plan`: an edit of the current order, already made."""
    return lambda: plan


def _layout(st: State, move: str, layout: StageLayout | None) -> Iterator[Proposal]:
    if layout is not None and layout != st.layout:
        yield Proposal(move, _rebuilt(st, layout), layout, st.w_gap)


def _partition(st: State) -> Iterator[Proposal]:
    if st.problem.keep is not None:  # the cuts are kept
        return
    yield from _layout(
        st, "rebalance: bubble-aware cuts", partition.rebalance(st.layout, st.problem, seed=st.seed)
    )
    busy = _finish_load(st.result)
    top = int(np.argmax(busy))
    for new in partition.relieve(st.layout, busy):
        moved = [
            s for s, (a, b) in enumerate(zip(st.layout.cuts, new.cuts, strict=True)) if a != b
        ][0]
        yield from _layout(
            st, f"relieve device {top}: move cut {moved} to layer {new.cuts[moved]}", new
        )
    yield from _carries(st, busy, top)


def _carries(st: State, busy: np.ndarray, top: int) -> Iterator[Proposal]:
    """On a memory-bound problem (`partition.memory_bound`), a layer of the device whose
    work, fill and drain leave it the least idle between ops, then of the busiest, carried
    to a lightly loaded device farther on, when that device is near the limit (its
    neighbours often are too, and cannot take a layer). Elsewhere they only steer the
    search: on llama3-8b (16 x 64 at 80 GiB) they led its first six searches to plans 3%
    slower."""
    limit = st.problem.memory
    if limit is None or not partition.memory_bound(st.problem):
        return
    hot = set(recompute.hot_devices(st.result, limit, over=False))
    need = busy + st.bottleneck.lead + st.bottleneck.tail
    for d in dict.fromkeys((int(np.argmax(need)), top)):
        if d not in hot:
            continue
        for s, t, new in partition.carry(st.layout, need, d):
            yield from _layout(
                st,
                f"carry a layer of device {d} from stage {s} to stage {t} (device "
                f"{st.layout.devices[t]})",
                new,
            )


def _finish_load(result: SimResult) -> np.ndarray:
    """Per device, the seconds it needs before the optimizer step: its compute and its
    gradient reduction after it (zero 0 and 1), or the longer of its compute and its
    data-parallel stream of reductions (zero 2, which overlap the compute). Where the
    gradients are large for the compute, the device with the most parameters is the one to
    relieve."""
    dpc = result.dp_comm
    if Zero(dpc.zero).shards_gradients:
        return np.maximum(result.busy, dpc.reduction)
    return result.busy + dpc.allreduce + dpc.reduce_scatter + dpc.tied


def _placement(st: State) -> Iterator[Proposal]:
    P = st.problem.devices
    b = st.bottleneck
    idle = b.lead + b.tail
    if st.problem.keep is not None:
        yield from _placement_of_kept_cuts(st, idle)
        return
    for d in map(int, np.argsort(-idle, kind="stable")[:2]):
        for s in range(min(3, st.layout.num_stages)):
            new = placement.disperse(st.layout, s, d)
            if new is not None:
                yield from _layout(
                    st,
                    f"disperse stage {s} onto device {d}",
                    partition.rebalance(new, st.problem, seed=st.seed),
                )
    for d in map(int, np.argsort(-idle, kind="stable")[:2]):
        for earlier in (True, False):
            yield from _layout(
                st,
                f"exchange: device {d}'s work {'earlier' if earlier else 'later'}",
                placement.exchange(st.layout, d, earlier),
            )
    merged = placement.merge(st.layout)
    yield from _layout(
        st,
        "merge neighbouring stages of one device",
        partition.rebalance(merged, st.problem, seed=st.seed),
    )
    for name, devices in placement.families(P, st.problem.num_layers):
        start = StageLayout(even_cuts(st.problem.num_layers, len(devices)), devices)
        yield from _layout(
            st, f"placement {name}", partition.rebalance(start, st.problem, seed=st.seed)
        )


def _placement_of_kept_cuts(st: State, idle: np.ndarray) -> Iterator[Proposal]:
    """Placements of the kept cuts: the busiest device's stages swapped with those of the two
    most idle devices, then each regular placement with as many stages."""
    keep, lay = st.problem.keep, st.layout
    assert keep is not None, "only under --keep partition"
    if keep.devices is not None:
        return
    top = int(np.argmax(st.result.busy))
    for d in map(int, np.argsort(-idle, kind="stable")[:2]):
        for a in (s for s, x in enumerate(lay.devices) if x == top):
            for b in (s for s, x in enumerate(lay.devices) if x == d):
                yield from _layout(st, f"swap stages {a} and {b}", placement.swap(lay, a, b))
    for name, devices in placement.families(st.problem.devices, st.problem.num_layers):
        if len(devices) == lay.num_stages:
            yield from _layout(
                st, f"placement {name}", StageLayout(lay.cuts, devices, lay.recompute)
            )


def _schedule(st: State) -> Iterator[Proposal]:
    plan, result = st.score.plan, st.result
    yield Proposal(
        f"rebuild the order, W {'not ' if st.w_gap else ''}held for gaps",
        lambda: schedule.rebuild(plan, st.problem, not st.w_gap),
        None,
        not st.w_gap,
    )
    pairs, waits = overlap.candidates(result), overlap.waits(result)
    yield from _overlap_many(st, pairs, waits)
    for new in schedule.fill_gaps(plan, result, (OpKind.F, OpKind.B)):
        yield Proposal("advance an F/B into a gap", _given(new))
    for new in schedule.fill_gaps(plan, result, (OpKind.W,)):
        yield Proposal("run a W while waiting on a message", _given(new))
    for new in schedule.delay_w(plan, result):
        yield Proposal("delay a W that held up the critical path", _given(new))
    yield from _overlap_few(st, pairs, waits)


def _overlap_many(
    st: State, pairs: list[overlap.Pair], waits: list[tuple[float, int, int]]
) -> Iterator[Proposal]:
    """Overlap groups formed or split many at once: every candidate pair (the most hidden
    first, sharing no op); near the memory limit, those that run no forward earlier; every
    group split, when the groups wait longer than they hide."""
    plan = st.score.plan
    every = overlap.disjoint(pairs)
    yield from _pairs(plan, every, "every forward and backward that can")
    if st.problem.memory is not None and pairs:
        near = set(recompute.hot_devices(st.result, st.problem.memory, over=False))
        fewer = overlap.disjoint(overlap.held_back(plan, pairs, near))
        if fewer != every:
            yield from _pairs(
                plan, fewer, "those that run no forward earlier near the memory limit"
            )
    if sum(w for w, _, _ in waits) > 0:
        for first in ("forward", "backward"):
            yield Proposal(
                f"run every overlap group's ops in turn, the {first} first",
                _lazy(overlap.unpair, plan, [(d, i) for _, d, i in waits], first == "forward"),
            )


def _overlap_few(
    st: State, pairs: list[overlap.Pair], waits: list[tuple[float, int, int]]
) -> Iterator[Proposal]:
    """Overlap groups formed or split one device or one group at a time: the pairs of the
    device with the most all-to-all in line, the pairs that hide the most, the groups that
    wait the longest for what they hide."""
    plan, result = st.score.plan, st.result
    every = overlap.disjoint(pairs)
    exposed = overlap.exposed_all_to_all(result)
    if exposed is not None and len({c.device for c in every}) > 1:
        d = int(np.argmax(exposed))
        yield from _pairs(plan, overlap.disjoint(pairs, d), f"those of device {d}")
    for c in pairs[: overlap.SINGLES] if len(every) > 1 else ():
        yield from _pairs(plan, [c], "")
    for _, d, i in (w for w in waits[: overlap.SINGLES] if w[0] > 0):
        for first in ("forward", "backward"):
            yield Proposal(
                f"run {plan.schedule[d][i]} on device {d} in turn, the {first} first",
                _lazy(overlap.unpair, plan, [(d, i)], first == "forward"),
            )


def _pairs(plan: Plan, pairs: list[overlap.Pair], which: str) -> Iterator[Proposal]:
    """Pair `pairs` (disjoint) in overlap groups, if any."""
    if not pairs:
        return
    if len(pairs) == 1:
        c = pairs[0]
        order = plan.schedule[c.device]
        what = f"{order[c.first]} and {order[c.second]} on device {c.device}"
    else:
        what = f"{which} ({len(pairs)} groups)"
    yield Proposal(f"overlap group: pair {what}", _lazy(overlap.pair, plan, pairs))


def _lazy(move: Callable[..., Plan], *args) -> Callable[[], Plan]:
    """Builds `move(*args)`: an edit of the current order, made when tried."""
    return lambda: move(*args)


def _memory(st: State) -> Iterator[Proposal]:
    """Over the limit: recompute moves, then W advanced before peaks and a rebuilt order.
    Within it (only with recompute chosen by the tuner): recompute moves alone."""
    plan, result, p = st.score.plan, st.result, st.problem
    limit = p.memory
    assert limit is not None, "the memory phase runs only with a memory limit"
    over = not st.score.fits
    if p.recompute == AUTO:
        fitted = recompute.fit_modes(st.layout, p)
        yield from _layout(st, "recompute as the bubble-aware model picks", fitted)
        if p.keep is None:
            yield from _layout(
                st,
                "recompute as the bubble-aware model picks, cuts rebalanced",
                partition.rebalance(fitted, p, seed=st.seed),
            )
        for move, new in recompute.moves(st.layout, result, limit, p.modes, over):
            yield from _layout(st, move, new)
    if not over:
        return
    for d in memory.over_limit(result, limit):
        new_plan = memory.advance_w(plan, result, d)
        if new_plan is not None:
            yield Proposal(f"advance a W before device {d}'s peak", _given(new_plan))
    yield Proposal(
        "rebuild the order within the memory limit",
        lambda: schedule.rebuild(plan, p, st.w_gap),
        None,
        st.w_gap,
    )


def kick(st: State, rng: random.Random) -> Proposal:
    """A random placement move (disperse a stage, move a stage to another device, exchange) with
    cuts rebalanced, a random shift of up to three cuts, or (when the tuner picks recompute) a
    random stage's mode changed; only what the problem's `keep` leaves free (kept cuts: moves
    and swaps of stages between devices; a kept placement too: recompute alone)."""
    lay, P, p = st.layout, st.problem.devices, st.problem
    if p.keep is None:
        kinds: tuple[str, ...] = ("disperse", "move", "exchange", "shift")
    else:
        kinds = ("move", "swap") if p.keep.devices is None else ()
    kinds += ("recompute",) if len(p.modes) > 1 else ()
    for _ in range(20 if kinds else 0):
        what = rng.choice(kinds)
        s = rng.randrange(lay.num_stages)
        d = rng.randrange(P)
        new: StageLayout | None
        if what == "disperse":
            new, move = placement.disperse(lay, s, d), f"kick: disperse stage {s} onto device {d}"
        elif what == "move":
            new = StageLayout(
                lay.cuts, lay.devices[:s] + (d,) + lay.devices[s + 1 :], lay.recompute
            )
            move = f"kick: move stage {s} to device {d}"
        elif what == "swap":
            other = rng.randrange(lay.num_stages)
            new, move = placement.swap(lay, s, other), f"kick: swap stages {s} and {other}"
        elif what == "exchange":
            new = placement.exchange(lay, d, rng.random() < 0.5)
            move = f"kick: exchange device {d}'s work"
        elif what == "recompute":
            mode = rng.choice([m for m in p.modes if m is not lay.recompute[s]])
            new = recompute.set_mode(lay, [s], mode)
            move = f"kick: recompute stage {s}: {lay.recompute[s]} -> {mode}"
        else:
            new = lay
            for _ in range(rng.randint(1, 3)):
                cut = rng.randrange(1, lay.num_stages) if lay.num_stages > 1 else 0
                new = partition.shift(new, cut, rng.choice((-2, -1, 1, 2))) or new
            move = "kick: shift cuts"
        if new is None or new == lay or len(set(new.devices)) < P:
            continue
        if what in ("disperse", "move", "exchange") and p.keep is None:
            new = partition.rebalance(placement.merge(new), st.problem, seed=rng.randrange(1 << 30))
        if not p.allows(new):
            continue
        return Proposal(move, _rebuilt(st, new), new, st.w_gap)
    return Proposal("kick: none found", lambda: st.score.plan, st.layout, st.w_gap)
