"""Every evaluation the tuner (and its baselines) makes goes through the project's simulator."""

from __future__ import annotations

import functools
import math
from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass, replace

import numpy as np

from ...plan import Plan, PlanError
from ...sim import SimDeadlock, SimProgram, SimResult, compile, simulate
from ...sim.costs import SimCosts
from ..problem import Problem


@dataclass(frozen=True)
class Score:
    """A plan's simulated iteration, or why it has none."""

    plan: Plan
    time: float
    """Simulated iteration time, seconds; inf for a plan that deadlocks."""
    peak: np.ndarray
    """Peak memory per device, bytes."""
    fits: bool
    """Every device's peak is within the problem's memory limit."""
    result: SimResult | None

    def better_than(self, other: Score | None) -> bool:
        """Fitting beats not fitting; then the shorter iteration; then the lower peak. A plan
        that deadlocks is never better."""
        if self.result is None:
            return False
        if other is None or other.result is None:
            return True
        if self.fits != other.fits:
            return self.fits
        if not self.fits:  # neither fits: closer to fitting is better
            return float(self.peak.max()) < float(other.peak.max())
        rel = (other.time - self.time) / other.time if other.time > 0 else 0.0
        if abs(rel) > 1e-9:
            return rel > 0
        return float(self.peak.max()) < float(other.peak.max()) - 1.0


def best_of(scores: Iterable[Score]) -> Score:
    """The best of some scores (Score.better_than; the earliest on a tie)."""
    return functools.reduce(lambda a, b: b if b.better_than(a) else a, scores)


PROGRAMS = 32
"""Compiled programs kept per evaluator, one per placement, most recently used."""

SCORES = 32
"""Scores of list-scheduled plans kept per evaluator, most recently used (a SimResult each,
up to about a MB)."""


class Evaluator:
    """Simulates plans of one problem; counts evaluations. Compiling reuses the program of the
    last plan with the same placement: a partition or schedule move changes only costs and
    device orders, and the search comes back to a few placements again and again."""

    def __init__(self, problem: Problem) -> None:
        self.problem = problem
        self.count = 0
        self._programs: OrderedDict[tuple[int, ...], SimProgram] = OrderedDict()
        self._scores: OrderedDict[tuple, tuple[SimCosts, tuple, Score]] = OrderedDict()

    def __call__(self, plan: Plan) -> Score:
        self.count += 1
        p = self.problem
        costs = p.sim_costs(plan)
        key = tuple(plan.stage_device())
        # A plan whose orders the list scheduler built shares their codes with every plan
        # built from the same stage costs and placement (`schedule.rebuild`): the same plan,
        # whose simulation is the same.
        codes = getattr(plan.schedule, "codes", None)
        same = (id(costs), id(codes), key)
        if codes is not None:
            hit = self._scores.get(same)
            if hit is not None and hit[0] is costs and hit[1] is codes:
                self._scores.move_to_end(same)
                return replace(hit[2], plan=plan)
        score = self._simulate(plan, costs, key)
        if codes is not None:
            self._scores[same] = (costs, codes, score)
            if len(self._scores) > SCORES:
                self._scores.popitem(last=False)
        return score

    def _simulate(self, plan: Plan, costs: SimCosts, key: tuple[int, ...]) -> Score:
        p = self.problem
        program = compile(plan, like=self._programs.pop(key, None))
        self._programs[key] = program
        if len(self._programs) > PROGRAMS:
            self._programs.popitem(last=False)
        try:
            result = simulate(program, costs, p.link, inter_link=p.inter_link)
        except SimDeadlock:
            return Score(plan, math.inf, np.zeros(p.devices), False, None)
        peak = result.peak_memory
        fits = p.memory is None or bool((peak <= p.memory).all())
        return Score(plan, result.iteration_time, peak, fits, result)


def check_plan(plan: Plan, problem: Problem) -> None:
    """Raise PlanError unless the plan is for the problem's devices, micro-batches and layers."""
    if plan.devices != problem.devices or plan.microbatches != problem.microbatches:
        raise PlanError(
            f"the plan is for {plan.devices} devices and {plan.microbatches} "
            f"micro-batches, not {problem.devices} and {problem.microbatches}"
        )
    problem.table.stage_costs(plan)
