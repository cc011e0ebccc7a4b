"""A configuration's layout estimate: the order in which `tune --gpus` screens configurations.

Screening simulates a configuration's classic plans, seconds each on a large cluster (GPT-175B
on 384 GPUs: up to 440,000 ops per plan), so within a minute a search screens a few of the
hundreds its lower bounds leave in. The estimate ranks all of them first, in milliseconds
each: the pipeline tuner's partition objective (`FillModel`, tune/pipeline/estimate.py: each
device's fill, drain and memory throttle in closed form) of the classic schedules' placements
(1F1B's, interleaved's with 2 and 4 chunks, the V) at even cuts, at cuts near-balanced on
time, and at those that put the fewest parameters on a stage (as the classic plans'
partitions), each with one recompute mode on every stage and no less than its drain (the
last micro-batch's way back, `_drain`), the least of them, plus the data-parallel collectives
no plan avoids (`bounds.dp_seconds`).

It is not a bound: a tuned plan may beat it and a classic one take longer. So it only orders
the screening; the lower bounds alone rule configurations out."""

from __future__ import annotations

import math

import numpy as np

from ...partition import balance_time
from ..bounds import dp_seconds
from ..pipeline.estimate import FillModel
from ..pipeline.layout import even_cuts, looped, v_shape
from ..problem import Problem


def layout_estimate(problem: Problem) -> float:
    """Seconds an iteration of the problem's configuration may take (see the module)."""
    P, layers = problem.devices, problem.num_layers
    params = problem.column("params")
    best = math.inf
    for devices in (looped(P, 1), looped(P, 2), looped(P, 4), v_shape(P)):
        S = len(devices)
        if S > layers:
            continue
        model = FillModel(problem, devices)
        # even, near time-balanced, and the fewest parameters on a stage (what fits where
        # memory is tight)
        for cuts in {
            even_cuts(layers, S),
            share_cuts(problem.work, S),
            _fewest_params_cuts(params.tolist(), S),
        }:
            for mode in problem.modes:
                model.set_modes((mode,) * S)
                best = min(best, max(model(cuts), _drain(model, cuts, problem.microbatches)))
    return best + sum(dp_seconds(problem))


def _drain(model: FillModel, cuts: tuple[int, ...], microbatches: int) -> float:
    """No plan of these cuts ends sooner: the last stage's last B ends after micro-batch 0's
    forwards reach it and all its F and B ran; that micro-batch's input gradient then passes
    back through every stage's B, and the first stage's W follows (messages left out). The
    fill model prices each device's own work and warm-up; with fewer micro-batches than
    stages this drain is what decides (`tune --gpus` with a small global batch)."""
    st = model.stage_sums(cuts)
    f, b = st.f, st.b
    w0 = st.load[0] - f[0] - b[0]
    return float(f[:-1].sum() + microbatches * (f[-1] + b[-1]) + b[:-1].sum() + w0)


def share_cuts(weights: np.ndarray, num_stages: int) -> tuple[int, ...]:
    """Cuts where the running total of `weights` crosses each 1 / num_stages of the whole, a
    layer or more per stage: near-balanced in O(layers), where the exact balances
    (octodsl.partition) take milliseconds to a second for a hundred layers and stages."""
    n = len(weights)
    prefix = np.cumsum(weights)
    marks = np.searchsorted(prefix, prefix[-1] * np.arange(1, num_stages) / num_stages) + 1
    cuts = [0]
    for k, mark in enumerate(marks.tolist(), start=1):
        cuts.append(min(max(mark, cuts[-1] + 1), n - (num_stages - k)))
    return (*cuts, n)


def _fewest_params_cuts(params: list[float], num_stages: int) -> tuple[int, ...]:
    """The cuts whose largest stage holds the fewest parameters (exact; `balance_time` keeps
    what it found, and the configurations of one tp share them)."""
    ranges = balance_time(params, num_stages)
    return (*(a for a, _ in ranges), len(params))
