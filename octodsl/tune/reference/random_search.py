"""Random search baseline: random layouts (a regular placement or a random irregular one, random
cuts), each ordered by the tuner's own list scheduler and timed by the simulator, for the same
budget as the tuner. Deterministic for a seed and a number of evaluations."""

from __future__ import annotations

import random
import time

from ..pipeline.evaluate import Evaluator, Score
from ..pipeline.layout import StageLayout
from ..pipeline.moves.placement import families
from ..pipeline.moves.schedule import rebuild
from ..problem import Problem


def random_layout(problem: Problem, rng: random.Random) -> StageLayout:
    P, L = problem.devices, problem.num_layers
    regular = families(P, L)
    pick = rng.randrange(len(regular) + 1)
    if pick < len(regular):
        devices = regular[pick][1]
    else:  # irregular: every device at least once, the rest anywhere
        extra = rng.randint(0, min(3 * P, L - P))
        order = list(range(P)) + [rng.randrange(P) for _ in range(extra)]
        rng.shuffle(order)
        devices = tuple(order)
    S = len(devices)
    cuts = (0,) + tuple(sorted(rng.sample(range(1, L), S - 1))) + (L,)
    return StageLayout(cuts, devices)


def random_search(
    problem: Problem, budget: float, seed: int = 0, max_evaluations: int | None = None
) -> tuple[Score | None, int]:
    """(the best plan found, evaluations made)."""
    rng = random.Random(seed)
    evaluate = Evaluator(problem)
    deadline = time.perf_counter() + budget
    best: Score | None = None
    while time.perf_counter() < deadline and (
        max_evaluations is None or evaluate.count < max_evaluations
    ):
        layout = random_layout(problem, rng)
        s = evaluate(rebuild(problem.skeleton(layout), problem, w_gap=rng.random() < 0.5))
        if s.better_than(best):
            best = s
    return best, evaluate.count
