"""One tuning run as `octodsl tune` and the benchmark make it: the classic baselines, the tuner
(refining the given plan and the best baseline besides its own starts), and optionally random
search and the CP-SAT model with the same budget."""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field

from ...errors import OctoError
from ...plan import Plan
from ...units import size
from ..advice import larger_tps, sharding
from ..pipeline.evaluate import Evaluator, Score, best_of
from ..pipeline.loop import RESTARTS, BudgetTooShort, Progress, TuneResult, tune
from ..problem import AUTO, Problem
from ..warm import COMPILING, warm_up_tuner
from .baselines import Baseline, best_baseline, classic_baselines

OTHERS = ("random", "milp", "milp-warm")
"""Baselines with the tuner's budget: random search, CP-SAT cold, CP-SAT warm-started from the
best classic baseline."""


class NoPlanFits(OctoError):
    """Neither the tuner nor any baseline found a plan within the memory limit."""

    exit_code = 1


@dataclass
class Outcome:
    problem: Problem
    tuned: TuneResult
    baselines: list[Baseline]
    others: dict[str, Score | None] = field(default_factory=dict)
    notes: dict[str, str] = field(default_factory=dict)
    """Per other baseline: what it did (evaluations, solver status)."""
    seconds: float = 0.0
    """Wall time of the baselines and the tuner (the other searches not included)."""
    compiled: float = 0.0
    """Seconds spent compiling the tuner's kernels before the search (`warm_up_tuner`: 0 where
    numba's disk cache held them), left out of the budget and of `seconds`."""


def tune_and_compare(
    problem: Problem,
    *,
    budget: float,
    seed: int = 0,
    start: Plan | None = None,
    others: Sequence[str] = (),
    progress: Progress | None = None,
    max_evaluations: int | None = None,
    searches: int = RESTARTS,
    jobs: int = 1,
) -> Outcome:
    """The baselines and the tuner within `budget` seconds together (the baselines take at most
    half; those left out are NOT_RUN), then each of `others` with `budget` seconds of its own.
    `max_evaluations`: the tuner (and random search) stop after simulating that many plans, a
    stop that does not depend on the machine's speed. `searches`: the tuner's searches at most
    (`loop.tune`'s `restarts`), `jobs` of them at once."""

    def note(phase: str):
        if progress:
            progress(phase, float("inf"), budget)

    t0 = time.perf_counter()
    reason = problem.why_no_plan_fits()
    if reason is not None:
        raise NoPlanFits(reason)
    note("start-up")
    # Loading the compiled kernels counts, as all start-up does; compiling them (a machine's
    # first run) does not: the budget is the search's.
    compiled = warm_up_tuner(lambda: note(COMPILING))
    t0 += compiled
    note("baselines")
    baselines = classic_baselines(problem, Evaluator(problem), deadline=t0 + budget / 2)
    best = best_baseline(baselines)
    best_plan = (
        best.score.plan if best is not None and best.score is not None else None
    )  # usable: scored
    starts = ([start] if start is not None else []) + ([best_plan] if best_plan is not None else [])
    left = t0 + budget - time.perf_counter()
    try:
        # A start of the tuner costs about what a baseline does: none fits in less time.
        if left <= 0 or (best is not None and left < max(b.seconds for b in baselines)):
            raise BudgetTooShort("no time left after the baselines")
        tuned = tune(
            problem,
            budget=left,
            seed=seed,
            starts=starts,
            progress=progress,
            max_evaluations=max_evaluations,
            restarts=searches,
            jobs=jobs,
        )
    except BudgetTooShort:
        # The best baseline is the best plan found in time (the checks below say if it does
        # not fit).
        scored = [b.score for b in baselines if b.score is not None and b.score.result is not None]
        if not scored:
            raise BudgetTooShort(
                f"the budget of {budget:.3g} s ran out before one plan was "
                "simulated; give it more time"
            ) from None
        first = best_of(scored)
        tuned = TuneResult(first, [], 0, finished=False)
    if tuned.interrupted and not tuned.best.fits:
        raise KeyboardInterrupt  # nothing worth keeping
    if not tuned.best.fits:
        assert problem.memory is not None, "only a memory limit makes a simulated plan not fit"
        peak = float(tuned.best.peak.max())
        counted = max_evaluations is not None and tuned.evaluations >= max_evaluations
        more = (
            ""
            if tuned.finished
            else f" (the search stopped after {max_evaluations} plans: more may)"
            if counted
            else " (the budget stopped the search: a longer one may)"
        )
        h = problem.header
        tp = next((t for t, _ in larger_tps(problem)), None)
        levers = (
            ([f"ZeRO (`--zero {h.zero + 1} --dp {max(h.dp, 8)}`)"] if h.zero < 2 else [])
            + (["recompute (`--recompute auto`)"] if problem.recompute != AUTO else [])
            + ([f"a larger tp (`--tp {tp}` or more)"] if tp is not None else [])
        )
        raise NoPlanFits(
            f"no plan found fits in {size(problem.memory)} per device "
            f"({sharding(problem)}, recompute {problem.recompute}): the best peaks "
            f"at {size(peak)}; use "
            + "".join(x + ", " for x in levers)
            + "more devices or a larger memory limit"
            + more
        )
    out = Outcome(problem, tuned, baselines, seconds=time.perf_counter() - t0, compiled=compiled)
    if tuned.interrupted:  # the user wants the tuned plan now, not the other searches' budgets
        out.notes.update((name, "not run: interrupted") for name in others)
        return out
    for name in others:
        note(name)
        if name == "random":
            from .random_search import random_search

            out.others[name], count = random_search(problem, budget, seed, max_evaluations)
            out.notes[name] = f"{count} plans"
        else:
            from .cpsat import solve_cpsat

            hint = best_plan if name == "milp-warm" else None
            r = solve_cpsat(problem, budget, hint=hint)
            out.others[name] = r.score
            out.notes[name] = r.status.lower()
    return out
