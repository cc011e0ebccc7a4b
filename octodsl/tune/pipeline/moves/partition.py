"""Partitioning moves: which layers form each stage, the placement kept.

- `shift`: move one cut by some layers (the elementary move);
- `rebalance`: the partition that minimises the bubble-aware bound of estimate.py, found by
  iterated local search over cuts (deterministic for a seed);
- `relieve`: the cuts that move a layer off the most loaded device to a neighbouring stage on
  a less loaded one, most idle receiver first (the simulator measured the loads);
- `carry`: one layer moved off a loaded device to a farther stage on a lightly loaded one, each
  stage between passing a layer on (their layer counts kept): it moves a layer's work and its
  static bytes where `relieve` cannot, past neighbours that sit at the memory limit or are as
  loaded;
- `fitting`: cuts under which every device has room for one micro-batch, found by CP-SAT, for
  when shifts cannot reach them.
"""

from __future__ import annotations

import functools
import random
from collections import OrderedDict
from collections.abc import Sequence
from itertools import pairwise

import numpy as np

from ...problem import Problem
from ..estimate import FillModel
from ..layout import StageLayout


def shift(layout: StageLayout, cut: int, delta: int) -> StageLayout | None:
    """Move cut number `cut` (between stages cut - 1 and cut) by `delta` layers (positive: the
    earlier stage grows); None if a stage would be left empty."""
    c = list(layout.cuts)
    if not 0 < cut < len(c) - 1:
        return None
    c[cut] += delta
    if not c[cut - 1] < c[cut] < c[cut + 1]:
        return None
    return layout.with_cuts(c)


def rebalance(
    layout: StageLayout, problem: Problem, seed: int = 0, rounds: int = 60
) -> StageLayout:
    """The best cuts found for this placement: steepest descent over one-layer shifts from the
    current cuts, then `rounds` random kicks of a few cuts, each followed by descent, keeping
    the best. Over the memory limit, the result may not fit where some cuts do (`fitting`)."""
    S = layout.num_stages
    if S < 2:
        return layout
    header, kept = problem.rebalanced
    if header is not problem.header or len(kept) >= _KEPT:
        kept = {}
        problem.rebalanced = (problem.header, kept)
    key = (layout, seed, rounds)
    found = kept.get(key)
    if found is None:
        found = kept[key] = _rebalance(layout, problem, seed, rounds)
    return found


_KEPT = 1 << 12
"""Results `rebalance` keeps per problem (a few hundred kB); it starts again when full."""


def _rebalance(layout: StageLayout, problem: Problem, seed: int, rounds: int) -> StageLayout:
    S = layout.num_stages
    model = _model(problem, layout)
    best = np.array(layout.cuts, np.int64)
    model.search(best, _kicks(seed, S, rounds))
    return layout.with_cuts(best)


def _model(problem: Problem, layout: StageLayout) -> FillModel:
    """The fill model of the layout's placement and recompute modes, kept per problem (the
    latest `_MODELS`): a search rebalances the same few again and again, with other seeds or
    from other cuts, and a model's descents go straight to where its earlier ones through the
    same cuts ended (`FillModel.search`). Only `rebalance` uses these, and its search leaves
    the modes as they are."""
    key = (layout.devices, problem.modes_of(layout))
    header, models = problem.fill_models
    if header is not problem.header:
        models = OrderedDict()
        problem.fill_models = (problem.header, models)
    model = models.pop(key, None)
    if model is None:
        model = FillModel(problem, *key)
    models[key] = model
    if len(models) > _MODELS:
        models.popitem(last=False)
    return model


_MODELS = 16
"""Fill models `_model` keeps per problem (up to about a MB each: their search's scratch)."""


@functools.lru_cache(maxsize=256)
def _kicks(seed: int, num_stages: int, rounds: int) -> np.ndarray:
    """The search's kicks for a seed, drawn before it (they do not depend on it, and it then
    runs compiled from start to end): per round, up to three (cut, layers) shifts. Read-only,
    since a round of moves searches several layouts with one seed."""
    bits = random.Random(seed).getrandbits
    out = []
    for _ in range(rounds):
        row = [0] * 6
        for j in range(1 + _below(bits, 3)):  # rng.randint(1, 3)
            # rng.randrange(1, num_stages), rng.choice((-2, -1, 1, 2))
            row[2 * j] = 1 + _below(bits, num_stages - 1)
            row[2 * j + 1] = _SHIFTS[_below(bits, 4)]
        out.append(row)
    kicks = np.array(out, np.int64).reshape(rounds, 3, 2)
    kicks.flags.writeable = False
    return kicks


_SHIFTS = (-2, -1, 1, 2)


def _below(bits, n: int) -> int:
    """A draw in [0, n) as `random.Random`'s randrange, randint and choice make it from its
    bits (tests/tune/test_fast_paths.py holds the draws equal): the kicks of a search
    are thousands of draws, and the methods' argument checks took longer than the draws."""
    k = n.bit_length()
    r = bits(k)
    while r >= n:
        r = bits(k)
    return r


def relieve(layout: StageLayout, busy: Sequence[float] | np.ndarray) -> list[StageLayout]:
    """Layouts with one layer moved off the busiest device onto a neighbouring stage of another
    device, the least busy receiver first."""
    load = np.asarray(busy, float)
    top = int(np.argmax(load))
    moves = []
    for s, d in enumerate(layout.devices):
        if d != top:
            continue
        # Cut s is before stage s (the previous stage can take our first layer); cut s + 1 is
        # after it (the next stage can take our last layer).
        if s > 0 and layout.devices[s - 1] != top:
            moves.append((load[layout.devices[s - 1]], s, 1))
        if s + 1 < layout.num_stages and layout.devices[s + 1] != top:
            moves.append((load[layout.devices[s + 1]], s + 1, -1))
    out = []
    for _, cut, delta in sorted(moves):
        new = shift(layout, cut, delta)
        if new is not None:
            out.append(new)
    return out


def memory_bound(problem: Problem) -> bool:
    """Whether the devices' memory beside their static bytes holds fewer micro-batches'
    activations, kept whole (no recompute), than there are devices: a 1F1B pipeline's first
    device alone keeps as many in flight, so memory throttles every plan (nemotron-h-56b at
    80 GiB: 0.1 to 0.7 per device; jamba-v0.1 on 4 and qwen3-next-80b on 8 too; llama3-8b
    about 4)."""
    if problem.memory is None:
        return False
    free = problem.devices * problem.memory - float(problem.layer_static().sum())
    return free < problem.devices * float(problem.column("act").sum())


CARRIES = 6
"""Layouts `carry` proposes per loaded device, the lightest receivers first."""


def carry(
    layout: StageLayout, load: Sequence[float] | np.ndarray, source: int
) -> list[tuple[int, int, StageLayout]]:
    """(giving stage, receiving stage, layout) with one layer moved from a stage of device
    `source` to a stage two or more places away on a device less loaded than every device
    between (whose stages each pass one layer on: cuts giver + 1 .. receiver shift together).
    The least loaded receiver first, then the shortest chain, then the lower stages: at most
    `CARRIES`. Next-door receivers are `relieve`'s. Layer kinds differ, so a stage between may
    gain or lose a little work; its device's count of layers stays."""
    load = np.asarray(load, float)
    devs, S = layout.devices, layout.num_stages
    found = []
    for s in (s for s, d in enumerate(devs) if d == source):
        for step in (1, -1):
            # the chain's stages must not return to the source (its count would not change)
            t, worst = s + step, -np.inf
            while 0 <= t < S and devs[t] != source:
                if abs(t - s) > 1 and load[devs[t]] < min(worst, load[source]):
                    found.append((load[devs[t]], abs(t - s), s, t))
                worst = max(worst, load[devs[t]])
                t += step
    out = []
    for _, _, s, t in sorted(found):
        cuts = list(layout.cuts)
        if t > s:  # stage s gives its last layer; cuts s + 1 .. t move one layer down
            for c in range(s + 1, t + 1):
                cuts[c] -= 1
        else:  # stage s gives its first layer; cuts t + 1 .. s move one layer up
            for c in range(t + 1, s + 1):
                cuts[c] += 1
        if all(a < b for a, b in pairwise(cuts)):
            out.append((s, t, layout.with_cuts(cuts)))
        if len(out) == CARRIES:
            break
    return out


_STEPS = 2**20
"""The memory limit in `fitting`'s units."""
_FITTING_EFFORT = 2.0
"""CP-SAT's deterministic time limit for `fitting` (about a second of solving here): its work,
not the wall clock, bounds it, so the answer is the same on every machine."""


def fitting(layout: StageLayout, problem: Problem) -> StageLayout | None:
    """Cuts for this placement that leave room on every device for its static bytes
    (ZeRO-sharded) and one micro-batch's activations, the busiest device's work as small as
    possible (CP-SAT); None when no cuts fit, or no problem limit, or none found within the
    effort. Shifts one cut at a time cannot always get there: with MoE layers of 45 GiB
    (jamba-v0.1) every shift off an overfull device of 80 GiB overfills the next. The
    activations counted are a micro-batch's whole, as without recompute (the cuts then fit
    whatever the stages recompute)."""
    if problem.memory is None:
        return None
    from ortools.sat.python import cp_model

    layers = problem.table.layers
    n, S = len(layers), layout.num_stages
    # Bytes rounded up and seconds to whole microseconds: a solution fits the real limit.
    room = np.concatenate(
        [
            [0],
            np.cumsum(
                [
                    int(np.ceil((st + l.act) * _STEPS / problem.memory))
                    for st, l in zip(problem.layer_static(), layers, strict=True)
                ]
            ),
        ]
    ).tolist()
    work = np.concatenate(
        [[0], np.cumsum([int(round((l.f + l.b + l.w) * 1e6)) for l in layers])]
    ).tolist()
    m = cp_model.CpModel()
    cut = (
        [m.new_constant(0)]
        + [m.new_int_var(1, n - 1, f"c{s}") for s in range(1, S)]
        + [m.new_constant(n)]
    )
    at_room, at_work = [], []
    for s in range(S + 1):
        if s < S:
            m.add(cut[s + 1] >= cut[s] + 1)
        if 0 < s < S:
            m.add_hint(cut[s], layout.cuts[s])
        at_room.append(m.new_int_var(0, room[-1], f"r{s}"))
        m.add_element(cut[s], room, at_room[-1])
        at_work.append(m.new_int_var(0, work[-1], f"w{s}"))
        m.add_element(cut[s], work, at_work[-1])
    busiest = m.new_int_var(0, work[-1], "busiest")
    for stages in layout.device_stages(problem.devices):
        m.add(sum(at_room[s + 1] - at_room[s] for s in stages) <= _STEPS)
        m.add(sum(at_work[s + 1] - at_work[s] for s in stages) <= busiest)
    m.minimize(busiest)
    solver = cp_model.CpSolver()
    solver.parameters.num_workers = 1
    solver.parameters.max_deterministic_time = _FITTING_EFFORT
    if solver.solve(m) not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        return None
    return layout.with_cuts([solver.value(c) for c in cut])
