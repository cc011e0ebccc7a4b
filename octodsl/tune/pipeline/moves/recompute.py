"""Recompute moves: what a stage drops after its forward and runs again in its backward.

Recompute trades B time for activation bytes: a device over the limit comes under it, and one
whose memory throttles the micro-batches in flight (the list scheduler admits a forward only
while its activations fit) can run more of them at once. The stages worth changing are those
holding the most activation byte-seconds in the simulated iteration (`held`): the bytes each
micro-batch keeps from its F to its B, what B brings back while it runs, and the part kept for
W until W. Each move changes one stage's mode (or every stage's) in the layout; the caller
rebuilds the order, so the list scheduler sees the smaller activations.

`fit_modes` picks every stage's mode at once by the bubble-aware model of estimate.py (which
prices both the recompute time and the micro-batches in flight it allows), for starts and as
the first move.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np

from ....plan import Recompute
from ....sim import SimResult
from ...problem import Problem
from ..estimate import FillModel
from ..layout import SAVING, StageLayout

HOT = 0.9
"""A device whose peak reaches this share of the limit may be throttled by memory."""
STAGES = 3
"""Stages tried per round, most byte-seconds first."""


def held(result: SimResult) -> np.ndarray:
    """Per stage: the activation byte-seconds it holds over the simulated iteration."""
    p = result.program
    S, M = p.num_stages, p.microbatches
    node = np.repeat(np.arange(p.num_nodes), np.diff(p.op_ptr))
    start, end = result.start[node], result.end[node]
    f_start, b_start, b_end = np.zeros((S, M)), np.zeros((S, M)), np.zeros((S, M))
    w_end = np.zeros((S, M))
    kind, stage, mb = p.op_kind, p.op_stage, p.op_mb
    for code, where, times in (
        (0, f_start, start),
        (1, b_start, start),
        (3, b_start, start),
        (1, b_end, end),
        (3, b_end, end),
        (2, w_end, end),
    ):
        k = kind == code
        where[stage[k], mb[k]] = times[k]
    w_end = np.maximum(w_end, b_end)  # a fused BW holds nothing past its end
    act, act_b, act_w = (result.costs.column(name)[:, None] for name in ("act", "act_b", "act_w"))
    return (act * (b_end - f_start) + act_b * (b_end - b_start) + act_w * (w_end - b_end)).sum(
        axis=1
    )


def ranked(layout: StageLayout, result: SimResult, devices: list[int]) -> list[int]:
    """The stages on `devices`, most byte-seconds held first (the lower stage on a tie)."""
    bs = held(result)
    mine = [s for s, d in enumerate(layout.devices) if d in devices]
    return sorted(mine, key=lambda s: (-bs[s], s))


def hot_devices(result: SimResult, limit: float, over: bool) -> list[int]:
    """The devices over the limit (`over`), else those near it, the highest peak first."""
    peak = result.peak_memory
    hot = [d for d in range(len(peak)) if (peak[d] > limit if over else peak[d] >= HOT * limit)]
    return sorted(hot, key=lambda d: (-peak[d], d))


def set_mode(layout: StageLayout, stages, mode: Recompute) -> StageLayout:
    modes = list(layout.recompute)
    for s in stages:
        modes[s] = mode
    return layout.with_recompute(modes)


def more(layout: StageLayout, stage: int, modes: tuple[Recompute, ...]) -> Iterator[Recompute]:
    """The allowed modes that save more than the stage's, least saving first."""
    now = SAVING.index(layout.recompute[stage])
    return (m for m in modes if SAVING.index(m) > now)


def less(layout: StageLayout, stage: int, modes: tuple[Recompute, ...]) -> Iterator[Recompute]:
    """The allowed modes that save less than the stage's, the nearest first."""
    now = SAVING.index(layout.recompute[stage])
    return (m for m in reversed(modes) if SAVING.index(m) < now)


def moves(
    layout: StageLayout, result: SimResult, limit: float, modes: tuple[Recompute, ...], over: bool
) -> Iterator[tuple[str, StageLayout]]:
    """(what, layout) for each recompute move, most promising first. Over the limit: more
    recompute on the over-full devices' stages that hold the most, then on all of the worst
    device's stages. Within it: more recompute on the near-full devices' stages that hold the
    most (more micro-batches in flight), then less on the stages that hold the least (one,
    then several together); then the same mode on every stage."""
    hot = hot_devices(result, limit, over)
    for s in ranked(layout, result, hot)[:STAGES]:
        for m in more(layout, s, modes):
            yield (
                (f"recompute stage {s} (device {layout.devices[s]}): {layout.recompute[s]} -> {m}"),
                set_mode(layout, [s], m),
            )
    if over and hot:
        mine = [s for s, d in enumerate(layout.devices) if d == hot[0]]
        for m in modes[1:]:
            yield f"recompute every stage of device {hot[0]}: {m}", set_mode(layout, mine, m)
    if not over:
        # Less recompute where it holds the least: one stage, then the 2, 4, 8 that hold the
        # least together (a device near the limit may still have room for a few).
        done = [
            s
            for s in ranked(layout, result, list(range(len(result.peak_memory))))[::-1]
            if layout.recompute[s] is not Recompute.NONE
        ]
        for s in done[:STAGES]:
            for m in less(layout, s, modes):
                yield (
                    (
                        f"recompute stage {s} (device {layout.devices[s]}): "
                        f"{layout.recompute[s]} -> {m}"
                    ),
                    set_mode(layout, [s], m),
                )
        for k in (2, 4, 8):
            if len(done) > k:
                fewer = list(layout.recompute)
                for s in done[:k]:
                    fewer[s] = next(less(layout, s, modes))
                yield (
                    f"less recompute on the {k} stages that hold the least",
                    layout.with_recompute(fewer),
                )
    for m in modes:
        yield f"recompute every stage: {m}", set_mode(layout, range(layout.num_stages), m)


def fit_modes(layout: StageLayout, problem: Problem) -> StageLayout:
    """The layout with the recompute modes the bubble-aware model ranks best for its cuts:
    steepest descent over single stages' modes (the lower stage and the less saving mode on
    ties), from the layout's own."""
    if len(problem.modes) < 2:
        return layout
    model = FillModel(problem, layout.devices, layout.recompute)
    return layout.with_recompute(model.fit_modes(layout.cuts, problem.modes))
