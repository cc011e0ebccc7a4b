"""Partitioning moves: which layers form each stage, the placement kept.

- `shift`: move one cut by some layers (the elementary move);
- `rebalance`: the partition that minimises the bubble-aware bound of estimate.py, found by
  iterated local search over cuts (deterministic for a seed);
- `relieve`: the cuts that move a layer off the most loaded device to a neighbouring stage on
  a less loaded one, most idle receiver first (the simulator measured the loads).
"""

from __future__ import annotations

import random
from typing import Sequence

import numpy as np

from ..estimate import FillModel
from ..layout import Layout
from ..problem import Problem


def shift(layout: Layout, cut: int, delta: int) -> Layout | None:
    """Move cut number `cut` (between stages cut - 1 and cut) by `delta` layers (positive: the
    earlier stage grows); None if a stage would be left empty."""
    c = list(layout.cuts)
    if not 0 < cut < len(c) - 1:
        return None
    c[cut] += delta
    if not c[cut - 1] < c[cut] < c[cut + 1]:
        return None
    return layout.with_cuts(c)


def rebalance(layout: Layout, problem: Problem, seed: int = 0, rounds: int = 60) -> Layout:
    """The best cuts found for this placement: steepest descent over one-layer shifts from the
    current cuts, then `rounds` random kicks of a few cuts, each followed by descent, keeping
    the best."""
    S = layout.num_stages
    if S < 2:
        return layout
    model = FillModel(problem, layout.devices)
    rng = random.Random(seed)
    best = np.array(layout.cuts, np.int64)
    best_v = model.descend(best)
    for _ in range(rounds):
        c = best.copy()
        for _ in range(rng.randint(1, 3)):
            i = rng.randrange(1, S)
            d = rng.choice((-2, -1, 1, 2))
            if c[i - 1] < c[i] + d < c[i + 1]:
                c[i] += d
        v = model.descend(c)
        if v < best_v:
            best, best_v = c, v
    return layout.with_cuts(best)


def relieve(layout: Layout, busy: Sequence[float]) -> list[Layout]:
    """Layouts with one layer moved off the busiest device onto a neighbouring stage of another
    device, the least busy receiver first."""
    busy = np.asarray(busy, float)
    top = int(np.argmax(busy))
    moves = []
    for s, d in enumerate(layout.devices):
        if d != top:
            continue
        # Cut s is before stage s (the previous stage can take our first layer); cut s + 1 is
        # after it (the next stage can take our last layer).
        if s > 0 and layout.devices[s - 1] != top:
            moves.append((busy[layout.devices[s - 1]], s, 1))
        if s + 1 < layout.num_stages and layout.devices[s + 1] != top:
            moves.append((busy[layout.devices[s + 1]], s + 1, -1))
    out = []
    for _, cut, delta in sorted(moves):
        new = shift(layout, cut, delta)
        if new is not None:
            out.append(new)
    return out
