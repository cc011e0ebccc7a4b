"""One tuning run as `octodsl tune` and the benchmark make it: the classic baselines, the tuner
(refining the given plan and the best baseline besides its own starts), and optionally random
search and the CP-SAT model with the same budget."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Sequence

from ..plan import Plan
from .baselines import Baseline, best_baseline, classic_baselines
from .evaluate import Evaluator, Score
from .loop import Progress, TuneResult, tune
from .problem import Problem

OTHERS = ("random", "milp", "milp-warm")
"""Baselines with the tuner's budget: random search, CP-SAT cold, CP-SAT warm-started from the
best classic baseline."""


class NoPlanFits(ValueError):
    """Neither the tuner nor any baseline found a plan within the memory limit."""


def _size(nbytes: float) -> str:
    return f"{nbytes / 2**30:.1f} GiB" if nbytes >= 2**30 else f"{nbytes / 2**20:.1f} MiB"


def _check_some_plan_can_fit(problem: Problem) -> None:
    """NoPlanFits at once, saying why, when no partition can fit. A device holds its layers'
    static bytes all the time and, while its deepest stage runs the first micro-batch's
    forward, that micro-batch's activations of all its layers (their backwards come later):
    so the static bytes and one micro-batch's activations of all layers must fit in all the
    devices' memory together, and each layer's in one device's."""
    limit = problem.memory
    if limit is None:
        return
    layers = problem.table.layers
    P = problem.devices
    static = sum(l.static for l in layers)
    act = sum(l.act for l in layers)
    if static + act > P * limit:
        raise NoPlanFits(
            f"no plan fits in {_size(limit)} per device: on {P} devices the parameters, "
            f"gradients and optimizer state take {_size(static / P)} per device and one "
            f"micro-batch's activations {_size(act / P)} more; use at least "
            f"{math.ceil((static + act) / limit)} devices, a larger memory limit or smaller "
            "micro-batches")
    i = max(range(len(layers)), key=lambda k: layers[k].static + layers[k].act)
    if layers[i].static + layers[i].act > limit:
        raise NoPlanFits(
            f"no plan fits in {_size(limit)} per device: layer {i} ({layers[i].kind}) "
            f"alone holds {_size(layers[i].static + layers[i].act)} with one "
            "micro-batch's activations; use a larger memory limit or smaller micro-batches")


@dataclass
class Outcome:
    problem: Problem
    tuned: TuneResult
    baselines: list[Baseline]
    others: dict[str, Score | None] = field(default_factory=dict)
    notes: dict[str, str] = field(default_factory=dict)
    """Per other baseline: what it did (evaluations, solver status)."""


def tune_and_compare(problem: Problem, *, budget: float, seed: int = 0, start: Plan | None = None,
                     others: Sequence[str] = (), progress: Progress | None = None) -> Outcome:
    def note(phase: str):
        if progress:
            progress(phase, float("inf"), budget)

    _check_some_plan_can_fit(problem)
    note("baselines")
    baselines = classic_baselines(problem, Evaluator(problem))
    best = best_baseline(baselines)
    starts = ([start] if start is not None else []) + ([best.score.plan] if best else [])
    tuned = tune(problem, budget=budget, seed=seed, starts=starts, progress=progress)
    if tuned.interrupted and not tuned.best.fits:
        raise KeyboardInterrupt  # nothing worth keeping
    if not tuned.best.fits:
        peak = float(tuned.best.peak.max())
        raise NoPlanFits(f"no plan found fits in {_size(problem.memory)} per device: the best "
                         f"peaks at {_size(peak)}; use more devices or a larger memory limit")
    out = Outcome(problem, tuned, baselines)
    if tuned.interrupted:  # the user wants the tuned plan now, not the other searches' budgets
        out.notes.update((name, "not run: interrupted") for name in others)
        return out
    for name in others:
        note(name)
        if name == "random":
            from .random_search import random_search

            out.others[name], count = random_search(problem, budget, seed)
            out.notes[name] = f"{count} plans"
        else:
            from .milp import solve_milp

            hint = best.score.plan if name == "milp-warm" and best else None
            r = solve_milp(problem, budget, hint=hint)
            out.others[name] = r.score
            out.notes[name] = r.status.lower()
    return out
