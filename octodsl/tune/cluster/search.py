"""`tune --gpus`: the fastest way to train a global batch on a GPU count, searched over the whole
configuration (tp x pp x dp, micro-batching, ZeRO, expert parallelism) and, inside the most promising
configurations, over plans (partition, placement, schedule, recompute) by the pipeline tuner.

Every configuration runs the same global batch on the same GPUs, so the shortest simulated
iteration is the most tokens per GPU per second. The search, within one budget:
1. enumerate (space.py): each configuration's problem; those no plan of which fits in memory are
   infeasible; the rest are ranked by their lower bound (`Problem.tight_lower_bound`, a bound
   over every plan of the configuration);
2. the Megatron-style recipe (baselines.py): its plans are the first to beat;
3. screen, in `screen_order` (by the layout estimate, estimate.py: milliseconds per
   configuration, so every one the bounds leave in is estimated; each ep's in turn): first
   every configuration with the `QUICK` plan (1F1B on the time-balanced partition, with the
   recompute that fits: tens of milliseconds each), until `QUICK_SHARE` of the budget left is
   spent; then with the other classic plans (every generator, every partition) until
   `SCREEN_SHARE` of what is left; a configuration whose lower bound is no shorter than the
   best plan simulated so far is dominated and not screened;
4. tune: in order of the best classic time, the pipeline tuner refines each configuration that
   can still win (its lower bound below the best plan so far), the budget left shared among at
   most `TUNED` of them at a time;
5. while budget is left and some configuration may still win, screen and tune again.
Ctrl-C stops it with the best plan so far, as `tune` does. docs/cluster.md says why each
configuration left out cannot win."""

from __future__ import annotations

import itertools
import math
import statistics
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field, replace

from ...errors import OctoError
from ...plan import Plan
from ...units import size
from ..clock import check_reserve
from ..pipeline.evaluate import Score, best_of
from ..pipeline.loop import RESTARTS, BudgetTooShort, TuneResult, tune
from ..problem import Problem
from ..reference.baselines import (
    NOT_RUN,
    PARTITIONS,
    SCHEDULES,
    Baseline,
    best_baseline,
    classic_baselines,
)
from ..warm import COMPILING, warm_up_tuner
from .baselines import MegatronBaseline, megatron_baselines
from .estimate import layout_estimate
from .space import (
    DOMINATED,
    INFEASIBLE,
    NOT_SCREENED,
    Cluster,
    Config,
    Skipped,
    Tables,
    configurations,
    ep_refusal,
    fewest_gpus,
    fixed_cause,
    meshes,
    over_limits,
    plan_ops,
    problem_of,
    tp_degrees,
)

RECIPE_SHARE = 0.2
"""Of the budget, what the Megatron-style recipe may take (its first depth always runs)."""
QUICK = SCHEDULES[:1]
QUICK_PARTITIONS = ("time",)
"""The classic plan every configuration the bounds leave in is screened with first: 1F1B
(Megatron-LM's default, which every configuration can run) on the time-balanced partition."""
QUICK_SHARE = 0.5
"""Of the budget left, what screening with the `QUICK` plan may take (the search always screens
its first configuration, and its first plan whatever the budget)."""
SCREEN_SHARE = 0.4
"""Of the budget left after that, what screening with the other classic plans may take."""
TUNED = 4
"""Configurations the budget left is shared among (at least `--top`)."""
MAX_CONFIGS = 20_000
"""Configurations one search enumerates (each a problem and its bounds, about 3 ms): the space
of a real cluster has hundreds to a few thousand; a larger one must fix some choices."""

Progress = Callable[[str, float, float], None]
"""progress(what it is doing, best iteration time so far (inf: none yet), seconds left)."""


class NoConfigurationFits(OctoError):
    """No configuration of the GPU count can run the model's global batch."""

    exit_code = 1


@dataclass
class Candidate:
    """A configuration some plan of which may fit."""

    config: Config
    problem: Problem
    bound: float
    """No plan of this configuration runs faster (`Problem.tight_lower_bound`)."""
    estimate: float
    """What an iteration may take (`layout_estimate`): the order of screening."""
    baselines: list[Baseline] = field(default_factory=list)
    """The classic plans it was screened with (empty: not screened)."""
    simulated: set[str] = field(default_factory=set)
    """The classic plans screening simulated, by name (the `QUICK` one first)."""
    complete: bool = False
    """Every classic plan it can run was simulated, not only the `QUICK` one."""
    tuned: TuneResult | None = None
    screen_seconds: float = 0.0
    untuned: str = ""
    """Screened and not tuned: why (DOMINATED..., or the budget; set when the search ends)."""

    @property
    def screened(self) -> bool:
        """Some of its classic plans were simulated (`baselines` may hold the Megatron-style
        plans before)."""
        return bool(self.simulated)

    @property
    def classic(self) -> Baseline | None:
        """Its fastest classic plan within the memory limit."""
        return best_baseline(self.baselines)

    @property
    def best(self) -> Score | None:
        """Its fastest plan within the memory limit, tuned or classic."""
        scores = [
            s
            for s in (
                self.tuned.best if self.tuned else None,
                self.classic.score if self.classic else None,
            )
            if s is not None and s.fits
        ]
        return min(scores, key=lambda s: s.time, default=None)


@dataclass
class ClusterResult:
    cluster: Cluster
    candidates: list[Candidate]
    """The feasible configurations, by lower bound."""
    skipped: list[Skipped]
    megatron: list[MegatronBaseline]
    excluded_tps: dict[int, str]
    """Divisors of the node the model does not split over, with why."""
    seconds: float = 0.0
    compiled: float = 0.0
    """Seconds spent compiling the tuner's kernels first (`warm_up_tuner`: 0 where numba's disk
    cache held them), left out of the budget and of `seconds`."""
    interrupted: bool = False
    budget_short: bool = False
    """The budget ran out before any configuration was tuned: the best is a classic plan."""

    def ranked(self) -> list[Candidate]:
        """The candidates with a plan that fits, fastest first (ties: by configuration)."""
        done = [c for c in self.candidates if c.best is not None]
        return sorted(done, key=lambda c: (c.best.time, c.config))  # type: ignore[union-attr]

    @property
    def best(self) -> Candidate:
        return self.ranked()[0]

    def classic_search(self) -> tuple[Candidate | None, Baseline | None]:
        """The configuration search without the pipeline tuner: the fastest classic plan of any
        configuration screened (those left out are dominated by a classic plan or the
        Megatron-style ones, or not screened for the budget)."""
        scored = [(c, c.classic) for c in self.candidates if c.classic is not None]
        return min(
            scored,
            key=lambda x: (x[1].score.time, x[0].config),  # type: ignore[union-attr]
            default=(None, None),
        )

    def tokens_per_gpu(self, seconds: float) -> float:
        return self.cluster.tokens() / (seconds * self.cluster.gpus)


def search(
    cluster: Cluster,
    *,
    budget: float,
    seed: int = 0,
    top: int = 1,
    progress: Progress | None = None,
    max_evaluations: int | None = None,
    searches: int = RESTARTS,
) -> ClusterResult:
    """The whole-cluster search within `budget` seconds (see the module's docstring);
    `max_evaluations`: the tuner stops after simulating that many plans of each configuration;
    `searches`: the tuner's searches of each configuration at most (`loop.tune`'s `restarts`).
    Raises NoConfigurationFits when no configuration is feasible, OctoError for a space too
    large."""
    began = time.perf_counter()
    why = ep_refusal(cluster)
    if why is not None:
        raise OctoError(why)
    # loading the compiled kernels counts, as all start-up does; compiling them does not
    compiled = warm_up_tuner(
        None if progress is None else lambda: progress(COMPILING, math.inf, budget)
    )
    began += compiled
    tables = Tables(cluster)
    tps, excluded = tp_degrees(cluster)
    result = ClusterResult(cluster, [], [], [], excluded, compiled=compiled)
    result.candidates, result.skipped = _enumerate(cluster, tps, tables, excluded)
    # writing and checking the `top` plans comes out of the budget: the likely winners' size
    likely = screen_order(result.candidates)[: max(TUNED, top)]
    t0 = time.perf_counter()
    ops = max(plan_ops(c.config.pp, c.config.microbatches) for c in likely)
    budget = max(budget - (t0 - began) - check_reserve(ops, top), 1e-3)
    deadline = t0 + 0.99 * budget  # 1% held back, as tune() does: the steps in flight at the end
    state = _State(result, progress, deadline)
    try:
        state.show("Megatron-style recipe")
        result.megatron = megatron_baselines(cluster, tables, t0 + RECIPE_SHARE * budget)
        _adopt(result)
        state.incumbent = min(
            [m.score.time for m in result.megatron if m.score is not None], default=math.inf
        )
        # Screen, tune, and while budget is left screen more (the tuning may have ended early:
        # every other configuration dominated, or the tuner finished).
        while True:
            now = time.perf_counter()
            screened = _screen(state, now + QUICK_SHARE * (deadline - now), quick=True)
            now = time.perf_counter()
            screened += _screen(state, now + SCREEN_SHARE * (deadline - now), quick=False)
            _tune(state, seed, max(TUNED, top), max_evaluations, searches)
            if (
                not screened
                or time.perf_counter() >= deadline
                or not any(not c.complete and not state.beaten(c) for c in result.candidates)
            ):
                break
    except KeyboardInterrupt:
        if not result.ranked():
            raise
        result.interrupted = True
    result.seconds = time.perf_counter() - began
    if not result.ranked():
        raise NoConfigurationFits(
            f"no plan simulated fits in {size(cluster.memory or 0)} per "
            "GPU: the memory bounds allowed some, the plans simulated "
            "none; try a longer --budget or more GPUs"
        )
    _finish(result)
    return result


def _finish(result: ClusterResult) -> None:
    """Why each candidate was not screened or not tuned, against the best plan found: one whose
    lower bound is no shorter cannot beat it (DOMINATED); the others the budget left out."""
    best = result.best.best
    assert best is not None, "a ranked candidate has a plan"
    for c in result.candidates:
        beaten = c.bound >= best.time
        dominated = (
            f"{DOMINATED}: its lower bound {c.bound * 1e3:,.1f} ms is no shorter than "
            f"the best plan's {best.time * 1e3:,.1f} ms"
        )
        if not c.screened:
            result.skipped.append(
                Skipped(
                    c.config,
                    DOMINATED if beaten else NOT_SCREENED,
                    dominated
                    if beaten
                    else f"estimated {c.estimate * 1e3:,.1f} ms; the budget ran out before it",
                )
            )
        elif c.tuned is None and c.config.pp > 1:
            c.untuned = dominated if beaten else "the budget ran out before it"
    result.budget_short = not any(c.tuned for c in result.candidates) and any(
        c.untuned and not c.untuned.startswith(DOMINATED) for c in result.candidates
    )


@dataclass
class _State:
    result: ClusterResult
    progress: Progress | None
    deadline: float
    incumbent: float = math.inf
    """The shortest iteration of a plan that fits, simulated so far."""

    def show(self, what: str) -> None:
        if self.progress:
            self.progress(what, self.incumbent, self.deadline - time.perf_counter())

    def beaten(self, c: Candidate) -> bool:
        """Whether a plan already simulated is as fast as any plan of `c` can be."""
        return c.bound >= self.incumbent


def _enumerate(
    cluster: Cluster, tps: list[int], tables: Tables, excluded: dict[int, str]
) -> tuple[list[Candidate], list[Skipped]]:
    """The feasible configurations by lower bound (ties by configuration), and the infeasible
    ones with why. A larger micro-batch of a mesh, ZeRO stage and ep whose smaller one does not
    fit does not fit either (it only adds activations): it is skipped without its own problem."""
    candidates: list[Candidate] = []
    skipped: list[Skipped] = []
    too_big: set[tuple[int, int, int, int, int]] = set()
    # counted before any is costed, so that a huge space is refused at once
    configs = list(itertools.islice(configurations(cluster, tps), MAX_CONFIGS + 1))
    if len(configs) > MAX_CONFIGS:
        raise OctoError(
            f"{cluster.gpus:,} GPUs and a global batch of {cluster.global_batch:,} "
            f"make more than {MAX_CONFIGS:,} configurations; fix some of the "
            "choices (--tp, --devices, --microbatch-size, --zero, --ep)"
        )
    for config in configs:
        key = (config.tp, config.pp, config.dp, config.zero, config.ep)
        if key in too_big:
            skipped.append(
                Skipped(
                    config,
                    INFEASIBLE,
                    "a smaller micro-batch of the same mesh, "
                    "ZeRO stage and ep does not fit in memory already",
                    memory=True,
                )
            )
            continue
        why = over_limits(config.pp, config.microbatches)
        if why is not None:
            skipped.append(Skipped(config, INFEASIBLE, why))
            continue
        problem = problem_of(cluster, config, tables)
        # the cause alone: the search itself tries the other levers (tp, ZeRO, micro-batches)
        why = problem.why_no_plan_fits(advice=False)
        if why is not None:
            too_big.add(key)
            skipped.append(Skipped(config, INFEASIBLE, why, memory=True))
            continue
        candidates.append(
            Candidate(config, problem, problem.tight_lower_bound(), layout_estimate(problem))
        )
    if not candidates:
        raise NoConfigurationFits(_no_configuration(cluster, tps, tables, excluded, skipped))
    candidates.sort(key=lambda c: (c.bound, c.config))
    return candidates, skipped


def _no_configuration(
    cluster: Cluster,
    tps: list[int],
    tables: Tables,
    excluded: dict[int, str],
    skipped: list[Skipped],
) -> str:
    """Why no configuration is feasible, and the fewest GPUs for which one would be."""
    c = cluster
    what = f"{c.model} with a global batch of {c.global_batch} on {c.gpus} GPU{'s' * (c.gpus > 1)}"
    cause = fixed_cause(cluster) if not skipped else None
    if cause is not None:
        return (
            f"no configuration runs {what}: {cause} rules out every one ({_why_fixed(c, excluded)})"
        )
    if not tps:
        why = "; ".join(f"tp {tp}: {m}" for tp, m in excluded.items()) or "none divides it"
        return (
            f"no tp of {c.gpus_per_node} GPUs per node splits {what} ({why}); fix --tp to "
            "a degree that does, or change --gpus-per-node"
        )
    more = fewest_gpus(cluster, tables, above=c.gpus)
    hint = (
        f"the fewest GPUs above {c.gpus} that could is {more.gpus} ({more})"
        if more
        else f"no GPU count above {c.gpus} would with this global batch"
    )
    if not skipped:
        dps = [dp for _, _, dp in meshes(cluster, tps)]
        batch = f"use a global batch that is a multiple of {min(dps)}, or " if dps else ""
        return (
            f"no configuration runs {what}: dp = GPUs / (tp x pp) must divide the global "
            f"batch (tp dividing {c.gpus_per_node}, pp at most the model's "
            f"{len(tables(tps[0], 1).layers)} layers); {batch}{hint}"
        )
    first = next((s for s in skipped if s.memory), None)
    if first is None:
        return (
            f"no configuration of {what} fits: e.g. {skipped[0].config}: "
            f"{skipped[0].detail}; {hint}"
        )
    # the memory bound's cause alone (its advice names devices and levers): then GPUs
    cause = problem_of(cluster, first.config, tables).why_no_plan_fits(advice=False)
    return f"no configuration of {what} fits: e.g. {first.config}: {cause}; {hint}"


def _why_fixed(c: Cluster, excluded: dict[int, str]) -> str:
    """What the fixed choices leave, for the one-line cause."""
    if c.tp is not None and c.tp in excluded:
        return f"tp {c.tp}: {excluded[c.tp]}"
    if c.tp is not None and (c.gpus_per_node % c.tp or c.gpus % c.tp):
        return f"tp must divide the {c.gpus_per_node} GPUs per node and the {c.gpus} GPUs"
    return (
        "tp x pp x dp = the GPUs, pp at most the layer count, dp x micro-batch size dividing "
        "the global batch, ZeRO 1 or 2 only with dp > 1, ep dividing dp"
    )


def _adopt(result: ClusterResult) -> None:
    """The Megatron-style plans as classic plans of their configurations (screening all the
    classic schedules simulates them again), so that the best plan is never slower."""
    by_config = {c.config: c for c in result.candidates}
    for m in result.megatron:
        c = by_config.get(m.config) if m.config is not None else None
        if c is not None and m.score is not None:
            c.baselines.append(Baseline(m.plan_name, m.score, recompute=m.recompute))


def screen_order(candidates: list[Candidate]) -> list[Candidate]:
    """The candidates in the order they are screened: by their rank among those of the same
    ep, then by layout estimate (then bound), so that each ep's most promising configurations
    come early. The estimates of different eps err by different amounts (at ep > 1 they count
    every all-to-all, which an overlap group may hide), and a space with several eps has
    several times the configurations a budget can screen. With one ep (a dense model), the order of
    the estimates."""
    rank: Counter[int] = Counter()
    keyed = []
    for c in sorted(candidates, key=lambda c: (c.estimate, c.bound, c.config)):
        keyed.append((rank[c.config.ep], c.estimate, c.bound, c.config, c))
        rank[c.config.ep] += 1
    return [k[-1] for k in sorted(keyed, key=lambda k: k[:4])]


def _screen(state: _State, until: float, quick: bool) -> int:
    """Simulate the classic plans of the candidates that can still win, in `screen_order`, until
    `until` (the first of the search whatever the time): with `quick`, the `QUICK` plan of
    those not screened yet; otherwise the others of those not screened completely. How many it
    screened."""
    r = state.result
    first = not any(c.screened for c in r.candidates)
    count = 0
    per_op: list[float] = []  # this pass's screens so far, seconds per op of their plans
    for i, c in enumerate(screen_order(r.candidates)):
        if c.complete or (quick and c.screened) or state.beaten(c):
            continue
        ops = plan_ops(c.config.pp, c.config.microbatches)
        now = time.perf_counter()
        if (count or not first) and now >= until:
            break
        # a screen runs its first plan whatever the deadline: none that would likely end past
        # it (by the median rate so far: the first screens pay for the caches they fill)
        if count and now + statistics.median(per_op) * ops > state.deadline:
            continue
        what = "quick screen" if quick else "screen"
        state.show(f"{what} {i + 1}/{len(r.candidates)}: {c.config.short()}")
        began = time.perf_counter()
        one_stage = c.config.pp == 1  # one plan: the partitions and schedules are all alike
        # the budget stops a screen too (its plans not run are NOT_RUN) after its first plan
        found = classic_baselines(
            c.problem,
            deadline=state.deadline,
            schedules=QUICK if quick or one_stage else SCHEDULES,
            partitions=QUICK_PARTITIONS if quick or one_stage else PARTITIONS,
            skip=c.simulated,
        )
        # a plan simulated again (the Megatron-style plans adopted before are classic plans)
        # counts once
        again = {b.name for b in found}
        c.baselines = [b for b in c.baselines if b.name not in again] + found
        c.simulated |= {b.name for b in found if b.error != NOT_RUN}
        c.complete = not quick or one_stage
        took = time.perf_counter() - began
        c.screen_seconds += took
        per_op.append(took / ops)
        count += 1
        if c.classic is not None:
            assert c.classic.score is not None, "a usable baseline is scored"
            state.incumbent = min(state.incumbent, c.classic.score.time)
    return count


def _tune(
    state: _State, seed: int, at_most: int, max_evaluations: int | None, searches: int
) -> None:
    """The tuner on each screened candidate not tuned yet that can still win: those with a
    classic plan that fits by its time, then those without (the tuner's memory moves may find
    one) by lower bound; starting from its best classic plan."""
    r = state.result

    def order(c: Candidate) -> tuple:
        fits = c.classic
        return (0, fits.score.time, c.config) if fits and fits.score else (1, c.bound, c.config)

    todo = sorted(
        (
            c
            for c in r.candidates
            if c.screened
            and c.tuned is None
            and c.config.pp > 1
            and any(b.score for b in c.baselines)
        ),
        key=order,
    )
    for i, c in enumerate(todo):
        if state.beaten(c):
            continue
        left = state.deadline - time.perf_counter()
        if left <= c.screen_seconds:  # a tuner's start costs about what screening did
            return
        share = left / min(at_most, sum(not state.beaten(x) for x in todo[i:]))
        state.show(f"tune {c.config.short()}")
        start = best_of(b.score for b in c.baselines if b.score is not None)
        try:
            c.tuned = tune(
                c.problem,
                budget=share,
                seed=seed,
                starts=[start.plan],
                progress=_within(state, c),
                max_evaluations=max_evaluations,
                restarts=searches,
            )
        except BudgetTooShort:
            continue
        if c.tuned.best.fits:
            state.incumbent = min(state.incumbent, c.tuned.best.time)
        if c.tuned.interrupted:
            raise KeyboardInterrupt


def _within(state: _State, c: Candidate) -> Progress | None:
    """The tuner's progress shown as the search's: which configuration, the best of all."""
    if state.progress is None:
        return None
    show = state.progress
    return lambda phase, best, left: show(
        f"tune {c.config.short()}: {phase}",
        min(best, state.incumbent),
        state.deadline - time.perf_counter(),
    )


def plan_of(c: Candidate) -> Plan:
    """The candidate's best plan, with its configuration's header."""
    best = c.best
    assert best is not None, "only ranked candidates have plans"
    return replace(best.plan, header=c.problem.header.model_copy())
