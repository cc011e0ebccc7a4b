"""octodsl.partition: DeepSpeed's methods reproduced exactly, the time balance optimal."""

from __future__ import annotations

import itertools
import random

import pytest

from octodsl.errors import OctoError
from octodsl.partition import balance_parameters, balance_time, equal_layers


def _bounds(stages: list[tuple[int, int]]) -> list[int]:
    return [first for first, _ in stages] + [stages[-1][1] + 1]


def _valid(stages: list[tuple[int, int]], n: int, k: int) -> bool:
    return (
        len(stages) == k
        and stages[0][0] == 0
        and stages[-1][1] == n - 1
        and all(a <= b for a, b in stages)
        # strict=False: consecutive pairs, stages[1:] is one shorter
        and all(b + 1 == c for (_, b), (c, _) in zip(stages, stages[1:], strict=False))
    )


def test_equal_and_parameters_match_deepspeed():
    utils = pytest.importorskip("deepspeed.runtime.utils")
    rng = random.Random(7)
    for _ in range(300):
        n = rng.randint(1, 30)
        k = rng.randint(1, n)
        # Zeros and repeats make ties, where DeepSpeed's choice must be kept too.
        params = [rng.choice([0, 1, 7, 100, rng.randint(0, 10**6)]) for _ in range(n)]
        assert _bounds(balance_parameters(params, k)) == utils.partition_balanced(params, k)
        assert _bounds(equal_layers(n, k)) == utils.partition_uniform(n, k)


def test_balance_time_is_optimal():
    rng = random.Random(3)
    for _ in range(200):
        n = rng.randint(1, 12)
        k = rng.randint(1, n)
        cost = [rng.choice([rng.random(), 1.0, 0.25]) for _ in range(n)]
        got = balance_time(cost, k)
        assert _valid(got, n, k)
        best = min(
            max(sum(cost[a:b]) for a, b in zip((0, *cuts), (*cuts, n), strict=True))
            for cuts in itertools.combinations(range(1, n), k - 1)
        )
        assert max(sum(cost[a : b + 1]) for a, b in got) == pytest.approx(best, abs=1e-12)


def test_balance_time_evens_out_the_rest_optimally():
    """Among the cuts whose slowest stage is the least, the sum of squared stage times is the
    least, by brute force (layer times with repeats, as a model's repeated layers have)."""
    rng = random.Random(5)
    for _ in range(200):
        n = rng.randint(1, 11)
        k = rng.randint(1, n)
        cost = [rng.choice([rng.random(), 1.0, 0.5, 0.0]) for _ in range(n)]
        got = balance_time(cost, k)
        assert _valid(got, n, k)

        splits = [
            [sum(cost[a:b]) for a, b in zip((0, *cuts), (*cuts, n), strict=True)]
            for cuts in itertools.combinations(range(1, n), k - 1)
        ]
        least = min(max(s) for s in splits)
        even = min(sum(t * t for t in s) for s in splits if max(s) <= least + 1e-12)
        times = [sum(cost[a : b + 1]) for a, b in got]
        assert max(times) == pytest.approx(least, abs=1e-12)
        assert sum(t * t for t in times) == pytest.approx(even, abs=1e-9)


def test_parameters_match_deepspeed_on_a_deep_model():
    """A hundred layers over tens of stages, as the cluster search asks (DeepSpeed's own
    dynamic program, in Python, takes a few seconds here)."""
    utils = pytest.importorskip("deepspeed.runtime.utils")
    rng = random.Random(11)
    params = [rng.choice([0, 50_331_648, 100_663_296, rng.randint(0, 10**9)]) for _ in range(60)]
    for k in (7, 24):
        assert _bounds(balance_parameters(params, k)) == utils.partition_balanced(params, k)


def test_balance_time_evens_out_the_other_stages():
    # The slowest stage is 3 layers either way; 3,3,2,2 beats greedy packing's 3,3,3,1.
    assert sorted(b - a + 1 for a, b in balance_time([1.0] * 10, 4)) == [2, 2, 3, 3]


def test_balance_time_isolates_a_heavy_layer():
    cost = [1, 1, 1, 9, 1, 1, 1, 1]
    stages = balance_time(cost, 3)
    assert (3, 3) in stages


def test_too_few_layers():
    for f, arg in ((equal_layers, 2), (balance_parameters, [1, 2]), (balance_time, [1.0, 2.0])):
        with pytest.raises(OctoError, match="cannot fill 3 stages"):
            f(arg, 3)
