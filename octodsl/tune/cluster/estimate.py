"""A configuration's layout estimate: the order in which `tune --gpus` screens configurations.

Screening simulates a configuration's classic plans, seconds each on a large cluster (GPT-175B
on 384 GPUs: up to 440,000 ops per plan), so within a minute a search screens a few of the
hundreds its lower bounds leave in. The estimate ranks all of them first, in about a
millisecond each: the pipeline tuner's partition objective (`FillModel`,
tune/pipeline/estimate.py: each device's fill, drain and memory throttle in closed form) of the
placements of the classic schedules (1F1B's, interleaved's with 2 and 4 chunks, the V) at even, time-balanced and parameter-balanced cuts (the classic plans'
partitions), each with one recompute mode on every stage, the least of them, plus the data-parallel collectives no plan avoids (`bounds.dp_seconds`).

It is not a bound: a tuned plan may beat it and a classic one take longer. So it only orders
the screening; the lower bounds alone rule configurations out."""

from __future__ import annotations

import math

from ...partition import balance_parameters, balance_time
from ..bounds import dp_seconds
from ..pipeline.estimate import FillModel
from ..pipeline.layout import even_cuts, looped, v_shape
from ..problem import Problem


def layout_estimate(problem: Problem) -> float:
    """Seconds an iteration of the problem's configuration may take (see the module)."""
    P, layers = problem.devices, problem.num_layers
    params = [l.params for l in problem.table.layers]
    best = math.inf
    for devices in (looped(P, 1), looped(P, 2), looped(P, 4), v_shape(P)):
        S = len(devices)
        if S > layers:
            continue
        model = FillModel(problem, devices)
        for cuts in {
            even_cuts(layers, S),
            _cuts(balance_time(problem.work.tolist(), S)),
            _cuts(balance_parameters(params, S)),  # what fits where memory is tight
        }:
            for mode in problem.modes:
                model.set_modes((mode,) * S)
                best = min(best, model(cuts))
    return best + sum(dp_seconds(problem))


def _cuts(ranges: list[tuple[int, int]]) -> tuple[int, ...]:
    return tuple(a for a, _ in ranges) + (ranges[-1][1] + 1,)
