"""The tuner's loop (OctoPipe's iterative, bubble-aware search).

1. Starts: each regular placement (V, looped with 1-4 chunks) with bubble-aware cuts and a list
   scheduled order, plus any plans given (a hand-written one, a baseline), and on every such
   layout of one stage per device ZeroBubble's own greedy order too (zb_auto.py); best first.
   When the tuner picks recompute under a memory limit, three of every six seeds also start
   each placement with full recompute before a layer and selective after it (`SPLITS`).
2. Rounds: simulate the current plan, find where it loses time (diagnose.py), and try that
   phase's moves (propose.py), most promising first; the first move that shortens the iteration
   (or, over the memory limit, lowers the peak) is kept and the next round starts. When no move
   of any phase helps, the search goes on from the next start. Recompute is a memory move: over
   the limit it comes first, and when the tuner picks it (`--recompute auto`) it is also tried
   last within the limit, where more micro-batches in flight may pay for the recompute time.
3. Kicks: once every start is refined, a random placement or partition change of the best plan
   (seeded), refined in turn; the search ends after `PATIENCE` kicks in a row find nothing better.
4. Restarts: the whole search again with the next seeds, `RESTARTS` searches in all while the
   budget lasts (less the time to polish the best plan, up to a `POLISH_SHARE` of it); each
   ends in its own local optimum, the one it finds alone. With `jobs`, that many run at once,
   each in a worker process (parallel.py), and all leave the polish its share.
5. Polish: the layouts the searches ended on, best first, get the pilot method's order
   (construct.py), too slow for every plan of a search: the best plan's with the time left,
   the others' where their estimate fits; each stops at the deadline.
The best plan that fits in memory wins. Every plan is timed by the simulator. Under the
problem's `keep`, only layouts it allows are tried. Ctrl-C stops the search as the end of the
budget does (`TuneResult.interrupted`), so the best plan is kept. A machine's first search
compiles the kernels before its budget starts (octodsl.tune.warm).

Deterministic for a seed as long as the searches and the polish end before the budget
(`TuneResult.finished`); a budget that cuts them short stops at a point that depends on the
machine's speed.
"""

from __future__ import annotations

import functools
import math
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace

from ...errors import OctoError
from ...gcpause import paused_collection
from ...plan import Plan, Recompute
from ..problem import AUTO, Problem
from .diagnose import diagnose
from .estimate import FillModel
from .evaluate import Evaluator, Score
from .layout import StageLayout, even_cuts
from .moves.partition import fitting, rebalance
from .moves.placement import families
from .moves.recompute import fit_modes
from .moves.schedule import pilot_seconds, rebuild
from .propose import State, kick, proposals
from .zb_auto import zb_starts

PATIENCE = 8
"""Kicks in a row without a better plan before the search ends."""

RESTARTS = 6
"""Searches with seeds seed, seed + 1, ...: the best of three was 0.5-1.5% faster than one on
the benchmark's hard cases (16 devices, jamba), where more kicks of one search gained less;
three left two thirds of a 60 s budget unused on many (llama3-8b on 16 devices x 64
micro-batches: 18 s), where the fourth search found a plan 2.9% faster (1,863.0 ms against
1,919.5)."""

SPLITS = (1 / 3, 1 / 2, 2 / 3)
"""Where the extra starts of the last three of every six seeds' searches turn from full to
selective recompute, as a share of the layers (seed k: SPLITS[k mod 6 - 3]); the first three
start as before. So `RESTARTS` searches from seed 0 try each once, a seed's search is the same
in any run, and a problem whose budget ends within its first three searches (16 devices) runs
as before. A micro-batch holds an early layer's activations longest (until its backward comes
back through every later layer), so full recompute saves the most byte-seconds per second it
costs there, and selective is enough late. Neither the bubble-aware model's per-stage choice
(`fit_modes`) nor one stage's mode at a time reaches such plans from the full- and
selective-everywhere starts on jamba-v0.1 (4 devices x 8 micro-batches, 80 GiB, dp 8, ZeRO 1;
benchmarks/tuner_levers.md). Tried and not kept: the extra starts in seeds 1 to 5, whose
refinements took the budget from problems whose six searches had ended within it
(qwen3-next-80b on 8 devices x 32 micro-batches: 2,934.1 ms, 2,978.4 with them; benchmarks/
tuner.py's case at commit c7be5ec); and a split start in place of the selective-everywhere one
(as many starts as before, commit bd6d2fe), which ended 6 of benchmarks/tuner_levers.md's 28
cases faster and 6 slower (qwen3-next-80b 8 x 16 +1.7%, nemotron-h-56b 8 x 32 +1.2%), where
these extra starts end 6 faster and 3 slower (at most +0.6%: nemotron-h-56b 16 x 32, whose
six searches no longer end within the budget)."""

POLISH_SHARE = 0.1
"""The most of the budget that later searches leave for the polish of the best plan so far
(they end by themselves before it on most problems)."""

POLISHED = 3
"""Layouts polished at most: the best plan of as many searches."""

Progress = Callable[[str, float, float], None]
"""progress(phase, best iteration time so far (inf: none yet), seconds left)."""


@dataclass(frozen=True)
class Round:
    number: int
    phase: str
    move: str
    before: float
    """Iteration time before the move, seconds (inf when there was no plan yet)."""
    after: float
    peaks: tuple[float, float] | None = None
    """Highest peak memory of any device before and after, bytes (memory moves)."""


@dataclass
class TuneResult:
    best: Score
    rounds: list[Round]
    evaluations: int
    finished: bool
    """The search ended by itself (every start refined until no move helped), not by budget."""
    starts: list[tuple[str, Score]] = field(default_factory=list)
    interrupted: bool = False
    """Ctrl-C stopped the search; `best` is the best plan found until then."""
    seconds: float = 0.0
    """Wall time of the whole `tune()` call, all searches and the budget's stops included."""
    finalists: list[tuple[Score, bool]] = field(default_factory=list)
    """Each search's best plan, and whether the list scheduler held W for gaps in it."""


class _OutOfBudget(Exception):
    pass


class _NothingSimulated(Exception):
    """The budget ran out before a search simulated one plan."""


class BudgetTooShort(OctoError):
    """The budget ran out before the tuner simulated one plan."""


def tune(
    problem: Problem,
    *,
    budget: float = 60.0,
    seed: int = 0,
    starts: Sequence[Plan] = (),
    max_evaluations: int | None = None,
    progress: Progress | None = None,
    restarts: int = RESTARTS,
    jobs: int = 1,
) -> TuneResult:
    """Search for the fastest plan that fits the problem's memory limit within `budget` seconds
    (and `max_evaluations` simulations, when given). `starts`: plans to refine, besides the
    tuner's own starting points. The searches share the budget; a later one runs only while
    budget is left, and never changes what an earlier one found. `jobs`: searches run at once,
    each in a process of its own (parallel.py; with `max_evaluations` only 1)."""
    if restarts < 1:
        raise ValueError(f"restarts must be at least 1, not {restarts}")
    if jobs < 1 or (jobs > 1 and max_evaluations is not None):
        raise ValueError(f"jobs must be at least 1, and 1 with max_evaluations, not {jobs}")
    # Here and not only at the front door, so every caller's budget is the search's: a test's
    # or a benchmark's first tune() would compile in it. Imported here: warm's tiny search is a
    # tune().
    from ..warm import warm_up_tuner

    warm_up_tuner()
    t0 = time.perf_counter()
    # 1% held back: the moves being built when the searches stop take time too.
    deadline = t0 + 0.99 * budget
    # One evaluator for the searches one after another and the polish: they come back to the
    # same placements, whose compiled programs it keeps; a program reordered for a later plan times it as a
    # fresh compile does (the walk's ties go by the plan's order), so each search finds what
    # it finds alone.
    evaluate = Evaluator(problem)
    if jobs > 1 and restarts > 1:
        from .parallel import side_by_side

        # the searches run at once, so none knows the best plan's polish before it starts:
        # each leaves the polish its share
        out, step = side_by_side(
            problem,
            starts,
            range(seed, seed + restarts),
            jobs,
            deadline - POLISH_SHARE * budget,
            progress,
        )
    else:
        out, step = _one_after_another(
            problem, evaluate, starts, seed, restarts, budget, deadline, max_evaluations, progress
        )
    if not out.interrupted:
        try:
            # a polish step costs its pilot method and a step of the search (a simulation
            # and what was built around it), at most
            _polish(problem, evaluate, out, deadline - step, max_evaluations)
        except KeyboardInterrupt:
            out.finished, out.interrupted = False, True
    out.seconds = time.perf_counter() - t0
    return out


def _one_after_another(
    problem: Problem,
    evaluate: Evaluator,
    starts: Sequence[Plan],
    seed: int,
    restarts: int,
    budget: float,
    deadline: float,
    max_evaluations: int | None,
    progress: Progress | None,
) -> tuple[TuneResult, float]:
    """The searches of seeds seed, seed + 1, ..., one after another while the budget lasts
    (tune()): their results in order and the most seconds one of their steps took."""
    searches_end = deadline  # until a search's best plan says how long its polish takes
    # `fitting`'s cuts by the layout it starts from (its hint), which a search's seed sets:
    # keyed by the placement alone, a later search would start from an earlier one's
    fitted: dict[StageLayout, StageLayout | None] = {}
    step_cost: dict[str, float] = {}
    out: TuneResult | None = None
    for k in range(restarts):
        if out is not None and (
            not out.finished
            or time.perf_counter() >= searches_end
            or (max_evaluations is not None and out.evaluations >= max_evaluations)
        ):
            break
        if out is not None:  # said before the search: Ctrl-C may end it with nothing found
            _restart(out, seed + k)
        shown = _best_shown(progress, out.best.time if out else math.inf)
        try:
            # The cyclic collector paused: a search makes hundreds of thousands of short-lived
            # objects, which reference counting frees, and next to no cycles (7 objects left
            # after 3,000 evaluations of nemotron-h-8b on 16 devices); the collector's passes
            # over them and the problem's live tables and programs took about 5% of it.
            with paused_collection():
                r = _Search(
                    problem,
                    evaluate,
                    searches_end,
                    seed + k,
                    max_evaluations,
                    shown,
                    fitted,
                    step_cost,
                ).run(starts)
        except _NothingSimulated:
            if out is None:
                raise BudgetTooShort(
                    f"the budget of {budget:.3g} s ran out before the tuner "
                    "could simulate one plan; give it more time"
                ) from None
            out.finished = False
            break
        except KeyboardInterrupt:
            if out is None:  # nothing found yet: nothing to keep
                raise
            out.finished, out.interrupted = False, True
            break
        out = r if out is None else _merge(out, r)
        # Later searches leave time to polish the best plan, up to POLISH_SHARE of the budget:
        # a pilot method cut short at the deadline keeps what its steps found (it changed 3 of
        # 12 memory-bound cases: 2 faster by 0.4-0.6%, 1 slower by 0.1%; CHANGELOG.md).
        best_w_gap = next(w_gap for s, w_gap in out.finalists if s is out.best)
        polish = _polish_seconds(problem, out.best, best_w_gap) + max(step_cost.values())
        searches_end = deadline - min(polish, POLISH_SHARE * budget)
    assert out is not None
    return out, max(step_cost.values(), default=0.0)


def one_search(
    problem: Problem,
    starts: Sequence[Plan],
    seed: int,
    deadline: float,
    progress: Progress | None,
) -> tuple[TuneResult, float] | None:
    """The search of `seed` alone, as `tune` runs each (in a worker process of parallel.py):
    its result and the most seconds one of its steps took; None when the deadline came before
    it simulated a plan. Ctrl-C ends it as the budget does (raised only before its first
    plan)."""
    step_cost: dict[str, float] = {}
    try:
        with paused_collection():  # as in tune()
            r = _Search(
                problem, Evaluator(problem), deadline, seed, None, progress, {}, step_cost
            ).run(starts)
    except _NothingSimulated:
        return None
    return r, max(step_cost.values(), default=0.0)


def _polish_seconds(problem: Problem, score: Score, w_gap: bool) -> float:
    return pilot_seconds(problem.skeleton(StageLayout.of(score.plan)), problem, w_gap)


def _polish(
    problem: Problem,
    evaluate: Evaluator,
    out: TuneResult,
    deadline: float,
    max_evaluations: int | None,
) -> None:
    """The pilot method's orders for the layouts of the searches' best plans, best first: the
    best plan's with whatever time is left, the others' while their pilot method (about a walk
    of the list scheduler per op of the plan) is expected to end by `deadline`. Each stops at
    `deadline` if it has not ended (construct.build_schedule: the estimate is rough, and a
    pilot method cut short still gains what its steps found); `out` keeps the best plan."""
    seen: set[tuple[StageLayout, bool]] = set()
    for score, w_gap in sorted(out.finalists, key=lambda f: functools.cmp_to_key(_order)(f[0])):
        layout = StageLayout.of(score.plan)
        if score.result is None or (layout, w_gap) in seen:
            continue
        if len(seen) == POLISHED or (
            max_evaluations is not None and out.evaluations >= max_evaluations
        ):
            return
        seen.add((layout, w_gap))
        left = deadline - time.perf_counter()
        if left <= 0 or (len(seen) > 1 and _polish_seconds(problem, score, w_gap) > left):
            out.finished = False
            return
        s = evaluate(rebuild(problem.skeleton(layout), problem, w_gap, True, deadline))
        if time.perf_counter() >= deadline:  # the pilot method may have been cut short
            out.finished = False
        out.evaluations += 1
        out.rounds.append(
            Round(
                len(out.rounds),
                "polish",
                "the pilot method's order for the layout of a search's best plan",
                out.best.time,
                s.time,
            )
        )
        if s.better_than(out.best):
            out.best = s


def _best_shown(progress: Progress | None, before: float) -> Progress | None:
    """The progress display of a later search: the best time of all searches so far."""
    if progress is None:
        return None
    return lambda phase, best, left: progress(phase, min(best, before), left)


def then(out: TuneResult | None, r: TuneResult, seed: int) -> TuneResult:
    """The result of search `seed`, `r`, after those of the searches before it, `out`, as
    tune() runs them one after another."""
    if out is None:
        return r
    _restart(out, seed)
    return _merge(out, r)


def _restart(out: TuneResult, seed: int) -> None:
    """The round that says search `seed` starts after those of `out`."""
    t = out.best.time
    out.rounds.append(Round(len(out.rounds), "restart", f"search again, seed {seed}", t, t))


def _merge(a: TuneResult, b: TuneResult) -> TuneResult:
    """Two searches as one result: the better plan (the earlier on a tie), all rounds."""
    offset = len(a.rounds)
    rounds = a.rounds + [replace(r, number=r.number + offset) for r in b.rounds]
    best = b.best if b.best.better_than(a.best) else a.best
    return TuneResult(
        best,
        rounds,
        a.evaluations + b.evaluations,
        b.finished,
        a.starts,
        b.interrupted,
        finalists=a.finalists + b.finalists,
    )


def _modes_text(modes: tuple[Recompute, ...]) -> str:
    """', recompute 3 full, 2 selective' for the stages' modes; '' for none."""
    counts = [(modes.count(m), m) for m in (Recompute.FULL, Recompute.SELECTIVE)]
    shown = [f"{n} {m}" for n, m in counts if n]
    return ", recompute " + ", ".join(shown) if shown else ""


def _order(a: Score, b: Score) -> int:
    return -1 if a.better_than(b) else (1 if b.better_than(a) else 0)


class _Search:
    def __init__(
        self,
        problem: Problem,
        evaluate: Evaluator,
        deadline: float,
        seed: int,
        max_evaluations: int | None,
        progress: Progress | None,
        fitted: dict[StageLayout, StageLayout | None],
        step_cost: dict[str, float],
    ) -> None:
        self.problem = problem
        self.seed = seed
        self.deadline = deadline
        self.max_evaluations = max_evaluations
        """Of all searches together (the evaluator counts them all)."""
        self.progress = progress
        self.evaluate = evaluate
        self.count0 = evaluate.count
        self.fitted = fitted
        """Per family placement, `fitting`'s cuts (the same for every search)."""
        self.best: Score | None = None
        self.best_w_gap = False
        """How the best plan's order was built (its kicks rebuild orders the same way)."""
        self.rounds: list[Round] = []
        self.tried: set[tuple[StageLayout, bool | None]] = set()
        """The layouts tried, with the list scheduler's setting (None: the proposal's default)."""
        self.last_cost = 0.0
        """Seconds the last simulation took."""
        self.step_cost = step_cost
        """Per phase: the most seconds one step took, from the end of the step before (or the
        start) to the end of its simulation, building the plan and the moves included (of
        all searches: a later one starts as dear)."""
        self.step_start = time.perf_counter()
        self.recompute_within = problem.recompute == AUTO and problem.memory is not None
        """Whether the memory phase (recompute) runs for plans within the limit too."""

    def ready(self, phase: str) -> None:
        """Raise _OutOfBudget before building a plan of `phase` that would likely be finished
        past the deadline (by the cost of that phase's slowest step so far, else of any
        phase's): the budget is a limit, not a target, and building a start or a placement
        move of a large problem takes longer than simulating it."""
        cost = self.step_cost.get(phase, max(self.step_cost.values(), default=0.0))
        if time.perf_counter() + cost > self.deadline:
            raise _OutOfBudget

    def score(self, plan: Plan, phase: str, w_gap: bool) -> Score:
        now = time.perf_counter()
        # Stop when the next simulation (and the moves around it) would likely end past the
        # deadline.
        if now + 2 * self.last_cost > self.deadline or (
            self.max_evaluations is not None and self.evaluate.count >= self.max_evaluations
        ):
            raise _OutOfBudget
        if self.progress:
            self.progress(phase, self.best.time if self.best else math.inf, self.deadline - now)
        s = self.evaluate(plan)
        end = time.perf_counter()
        self.last_cost = end - now
        self.step_cost[phase] = max(self.step_cost.get(phase, 0.0), end - self.step_start)
        self.step_start = end
        if s.better_than(self.best):
            self.best, self.best_w_gap = s, w_gap
        return s

    def run(self, given: Sequence[Plan]) -> TuneResult:
        starts: list[tuple[str, Score, StageLayout, bool]] = []
        finished, interrupted = True, False
        try:
            starts = self._starts(given)
            for name, s, layout, w_gap in starts:
                self.rounds.append(Round(len(self.rounds), "start", name, math.inf, s.time))
                self._refine(s, layout, w_gap)
            self._kicks()
        except _OutOfBudget:
            finished = False
        except KeyboardInterrupt:
            # Ctrl-C ends the search as the budget does: the best plan so far is the result.
            if self.best is None:
                raise
            finished, interrupted = False, True
        if self.best is None:
            raise _NothingSimulated
        return TuneResult(
            self.best,
            self.rounds,
            self.evaluate.count - self.count0,
            finished,
            [(name, s) for name, s, _, _ in starts],
            interrupted,
            finalists=[(self.best, self.best_w_gap)],
        )

    def _starts(self, given: Sequence[Plan]) -> list[tuple[str, Score, StageLayout, bool]]:
        p = self.problem
        out: list[tuple[str, Score, StageLayout, bool]] = []
        for plan in given:
            if not p.allows(StageLayout.of(plan)):  # the best baseline under --keep
                continue
            # The given order is kept; the schedule phase may rebuild it (w_gap=True makes its
            # first proposal the usually better rebuild without W held back).
            out.append(
                (
                    f"given plan {plan.header.name!r}",
                    self.score(plan, "start", True),
                    StageLayout.of(plan),
                    True,
                )
            )
        given_starts = len(out)
        for name, layout, cuts in self._start_layouts(list(out)):
            for w_gap in (False, True):
                self.ready("start")
                self.tried.add((layout, w_gap))
                plan = rebuild(p.skeleton(layout), p, w_gap)
                out.append(
                    (
                        f"{name}, {cuts}" + (", W held for gaps" if w_gap else ""),
                        self.score(plan, "start", w_gap),
                        layout,
                        w_gap,
                    )
                )
        given_layouts = [layout for _, _, layout, _ in out[:given_starts]]
        by_score = functools.cmp_to_key(_order)
        out.sort(key=lambda start: by_score(start[1]))
        # ZeroBubble's greedy orders the given plans' layouts (under --keep, the kept one) and
        # the best start's, when one stage per device: where its order beats the list
        # scheduler's, the search starts from it
        for layout in dict.fromkeys([*given_layouts, *(out[0][2:3] if out else ())]):
            for name, plan in zb_starts(p, layout):
                self.ready("start")
                out.append((name, self.score(plan, "start", True), layout, True))
        out.sort(key=lambda start: by_score(start[1]))
        return out

    def _start_layouts(self, given: list[tuple[str, Score, StageLayout, bool]]):
        """(name, layout, how its cuts were found) of each start to list-schedule: the family
        placements with bubble-aware cuts (when the tuner picks recompute under a memory
        limit, also with selective recompute on every stage: the bubble-aware model misses
        much of how memory throttles a plan that keeps everything, and selective saves much
        for little); under `keep`, the given plans' layouts and the families with the kept
        cuts (with the modes that fit)."""
        p = self.problem
        if p.keep is None:
            also = (Recompute.SELECTIVE,) if (p.recompute == AUTO and p.memory is not None) else ()
            split = self.seed % (2 * len(SPLITS)) - len(SPLITS)  # >= 0: a split search
            for name, devices in families(p.devices, p.num_layers):
                for mode in (None, *also):
                    self.ready("start")
                    yield (f"placement {name}", *self._start_cuts(devices, mode))
                if also and split >= 0:
                    self.ready("start")
                    layer = round(SPLITS[split] * p.num_layers)
                    yield (f"placement {name}", *self._split_cuts(devices, layer))
            return
        for _, _, layout, _ in given:
            yield "the given plan's layout", layout, "kept cuts"
        if p.keep.devices is None:
            S = len(p.keep.cuts) - 1
            for name, devices in families(p.devices, p.num_layers):
                if len(devices) == S:
                    self.ready("start")
                    layout = fit_modes(StageLayout(p.keep.cuts, devices), p)
                    yield f"placement {name}", layout, "kept cuts" + _modes_text(p.modes_of(layout))

    def _start_cuts(
        self, devices: tuple[int, ...], mode: Recompute | None = None
    ) -> tuple[StageLayout, str]:
        """Bubble-aware cuts for a family placement, and what they are: with `mode` on every
        stage; else when the tuner picks recompute, cuts and modes in turn (twice). Where
        shifts found none that fit in memory, from the cuts `fitting` finds."""
        p = self.problem
        even = StageLayout(even_cuts(p.num_layers, len(devices)), devices)
        layout = rebalance(
            even if mode is None else even.with_recompute((mode,) * len(devices)), p, seed=self.seed
        )
        for _ in range(2 if len(p.modes) > 1 and mode is None else 0):
            layout = rebalance(fit_modes(layout, p), p, seed=self.seed)
        model = FillModel(p, devices, p.modes_of(layout))
        if model.fits(model(layout.cuts)):
            return layout, "bubble-aware cuts" + _modes_text(p.modes_of(layout))
        if layout not in self.fitted:
            self.fitted[layout] = fitting(layout, p)
        fit = self.fitted[layout]
        if fit is None:
            return layout, "bubble-aware cuts" + _modes_text(p.modes_of(layout))
        # Shifts from cuts that fit keep them fitting: the model ranks any overflow last.
        fit = rebalance(fit_modes(fit, p), p, seed=self.seed)
        return fit, "cuts that fit, then bubble-aware" + _modes_text(p.modes_of(fit))

    def _split_cuts(self, devices: tuple[int, ...], layer: int) -> tuple[StageLayout, str]:
        """Bubble-aware cuts for a family placement with full recompute on the stages that
        start before `layer` and selective on the others (`SPLITS`), the modes following the
        cuts as they move."""
        p = self.problem

        def split(cuts: tuple[int, ...]) -> tuple[Recompute, ...]:
            return tuple(Recompute.FULL if a < layer else Recompute.SELECTIVE for a in cuts[:-1])

        cuts = even_cuts(p.num_layers, len(devices))
        layout = rebalance(StageLayout(cuts, devices, split(cuts)), p, seed=self.seed)
        layout = layout.with_recompute(split(layout.cuts))
        return layout, f"bubble-aware cuts, full recompute before layer {layer}, selective after"

    def _kicks(self) -> None:
        rng = random.Random(self.seed)
        misses = 0
        while misses < PATIENCE:
            best = self.best
            # the starts' family placements are list-scheduled, so some start simulated; and a
            # plan without a simulation is never better than another (Score.better_than)
            assert best is not None and best.result is not None
            self.ready("kick")
            st = State(
                self.problem,
                best,
                StageLayout.of(best.plan),
                self.best_w_gap,
                diagnose(best.result),
                self.seed,
            )
            prop = kick(st, rng)
            assert prop.layout is not None and prop.w_gap is not None, "a kick sets both"
            s = self.score(prop.build(), "kick", prop.w_gap)
            self.rounds.append(Round(len(self.rounds), "kick", prop.move, best.time, s.time))
            self._refine(s, prop.layout, prop.w_gap)
            misses = 0 if self.best is not best else misses + 1

    def _refine(self, cur: Score, layout: StageLayout, w_gap: bool) -> None:
        """Rounds from one start until no move of any phase improves it."""
        while cur.result is not None:  # a given plan may deadlock: nothing to refine
            st = State(
                self.problem, cur, layout, w_gap, diagnose(cur.result), self.seed + len(self.rounds)
            )
            for phase in st.bottleneck.phases(not cur.fits, self.recompute_within):
                found = self._round(phase, st)
                if found is not None:
                    cur, layout, w_gap = found
                    break
            else:
                return

    def _round(self, phase: str, st: State) -> tuple[Score, StageLayout, bool] | None:
        for prop in proposals(phase, st):
            # Layouts are remembered (many moves lead to the same one); order edits are not
            # (each comes from the current plan, and only improvements are kept).
            if prop.layout is not None:
                if (prop.layout, prop.w_gap) in self.tried or not self.problem.allows(prop.layout):
                    continue
                self.tried.add((prop.layout, prop.w_gap))
            self.ready(phase)
            plan = prop.build()
            w_gap = st.w_gap if prop.w_gap is None else prop.w_gap
            s = self.score(plan, phase, w_gap)
            if s.better_than(st.score):
                peaks = (
                    (float(st.score.peak.max()), float(s.peak.max())) if phase == "memory" else None
                )
                self.rounds.append(
                    Round(len(self.rounds), phase, prop.move, st.score.time, s.time, peaks)
                )
                return s, prop.layout or st.layout, w_gap
        return None
