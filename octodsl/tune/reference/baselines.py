"""The classic schedules the tuner must beat, each with three partitions, on the same simulator.

Schedules and partitions as `octodsl gen --model` makes them: 1F1B, interleaved with 2 and 4
chunks, ZB-H1, ZB-H2, ZB-V, DualPipeV; equal layer counts (`equal`), DeepSpeed's parameter
balance (`parameters`) and the time-balanced optimum by dynamic programming (`time`).
A baseline is named `SCHEDULE[-vCHUNKS]-PARTITION`, e.g. `1f1b-equal`, `interleaved-v4-time`.

Baselines get the tuner's levers: the problem's header (ZeRO over its dp copies) and its
recompute choice. With a fixed mode every stage recomputes that way; with the tuner's choice
(`auto`) each baseline runs with no recompute, selective on every stage and full on every stage
(as Megatron users run it) and counts with the best of the three (fitting first, then fastest;
without a memory limit, none alone).
"""

from __future__ import annotations

import functools
import math
import time
from collections.abc import Callable, Collection, Iterable, Iterator, Sequence
from dataclasses import dataclass

from ...gen import ScheduleError, phased_schedule
from ...gen.model_partition import model_stages
from ...gen.phases import PhasedSchedule
from ...plan import Plan, Recompute, Stage
from ..pipeline.evaluate import Evaluator, Score
from ..problem import Problem, recompute_everywhere

SCHEDULES: tuple[tuple[str, int | None], ...] = (
    ("1f1b", None),
    ("interleaved", 2),
    ("interleaved", 4),
    ("zb-h1", None),
    ("zb-h2", None),
    ("zb-v", None),
    ("dualpipev", None),
)


@dataclass(frozen=True)
class Baseline:
    name: str
    score: Score | None
    """None when the schedule cannot be built for this problem or was not run (`error` says
    why)."""
    error: str | None = None
    seconds: float = 0.0
    """Wall time of building and simulating it (each recompute mode tried)."""
    recompute: Recompute = Recompute.NONE
    """What every stage of its plan recomputes."""

    @property
    def usable(self) -> bool:
        """Built and within the memory limit."""
        return self.score is not None and self.score.fits


PARTITIONS = ("time", "parameters", "equal")
"""The partitions every classic baseline is tried with (`gen --partition`'s balancing methods;
the Megatron splits are the cluster search's Megatron-style recipe's business)."""


def baseline_name(schedule: str, chunks: int | None, partition: str) -> str:
    return f"{schedule}{f'-v{chunks}' if chunks else ''}-{partition}"


def partition_stages(problem: Problem, method: str, num_stages: int) -> list[Stage]:
    """The stages of `gen --model --partition METHOD`, on the problem's device, shape and tp
    (one GPU's costs: time and parameter balances at tp > 1 are of its share)."""
    h = problem.header
    assert h.model is not None, "Problem.create names the model in the header"
    stages, _ = model_stages(
        h.model,
        num_stages,
        method,
        device=problem.table.meta["device"],
        microbatch_size=h.microbatch_size,
        seq_len=h.seq_len,
        tp=h.tp,
        sp=h.sp,
    )
    return stages


def classic_plans(
    problem: Problem,
    schedules: Sequence[tuple[str, int | None]] = SCHEDULES,
    partitions: Sequence[str] = PARTITIONS,
    skip: Collection[str] = (),
) -> Iterator[tuple[str, Plan | None, str | None]]:
    """(name, plan, None) for each schedule and partition, or (name, None, why not); none for
    the names in `skip`."""
    for schedule, chunks in schedules:
        methods = [m for m in partitions if baseline_name(schedule, chunks, m) not in skip]
        if not methods:
            continue
        try:
            phased = _phased(schedule, problem.devices, problem.microbatches, chunks)
            if phased.num_stages > problem.num_layers:
                raise ScheduleError(f"{phased.num_stages} stages for {problem.num_layers} layers")
        except ScheduleError as e:
            for method in methods:
                yield baseline_name(schedule, chunks, method), None, str(e)
            continue
        orders, _ = phased.orders()
        for method in methods:
            name = baseline_name(schedule, chunks, method)
            header = problem.header.model_copy(update={"name": name})
            yield (
                name,
                Plan(
                    header,
                    partition_stages(problem, method, phased.num_stages),
                    list(phased.placement),
                    [list(order) for order in orders],  # its own: `_phased` keeps the schedule
                ),
                None,
            )


@functools.lru_cache(maxsize=16)
def _phased(schedule: str, devices: int, microbatches: int, chunks: int | None) -> PhasedSchedule:
    """`phased_schedule`, kept for the next configurations of the same pipeline depth and
    micro-batches (the cluster search screens them in turn: another ZeRO stage, another tp
    and micro-batch size); `classic_plans` gives each plan its own lists. A few only: a large
    one holds hundreds of thousands of ops."""
    return phased_schedule(schedule, devices, microbatches, chunks)


NOT_RUN = "not run: the budget ran out"
"""The error of a baseline left out for the deadline."""


def classic_baselines(
    problem: Problem,
    evaluate: Evaluator | None = None,
    on_each: Callable[[str], None] | None = None,
    deadline: float | None = None,
    schedules: Sequence[tuple[str, int | None]] = SCHEDULES,
    partitions: Sequence[str] = PARTITIONS,
    skip: Collection[str] = (),
) -> list[Baseline]:
    """Every baseline of `schedules` and `partitions` (default all) but those named in `skip`,
    in their order; with a `deadline` (time.perf_counter()), those that would likely end past it
    (by the slowest one so far, built and simulated) are not run; the first always runs."""
    evaluate = evaluate or Evaluator(problem)
    names = [baseline_name(s, c, m) for s, c in schedules for m in partitions]
    names = [name for name in names if name not in skip]
    out: list[Baseline] = []
    slowest = 0.0
    plans = classic_plans(problem, schedules, partitions, skip)
    while len(out) < len(names):
        began = time.perf_counter()
        if deadline is not None and out and began + slowest > deadline:
            out += [Baseline(name, None, NOT_RUN) for name in names[len(out) :]]
            break
        name, plan, error = next(plans)
        if on_each:
            on_each(name)
        score, mode = (
            _best_mode(problem, plan, evaluate) if plan is not None else (None, Recompute.NONE)
        )
        seconds = time.perf_counter() - began
        out.append(Baseline(name, score, error, seconds, mode))
        slowest = max(slowest, seconds)
    return out


def _best_mode(problem: Problem, plan: Plan, evaluate: Evaluator) -> tuple[Score, Recompute]:
    """The plan with each recompute mode the problem allows on every stage: the best score
    (the least saving mode on a tie) and its mode. Without a memory limit recompute only adds
    time: the tuner's choice is then none."""
    best: tuple[Score, Recompute] | None = None
    modes = problem.modes if problem.memory is not None else problem.modes[:1]
    for mode in modes:
        s = evaluate(recompute_everywhere(plan, mode))
        if best is None or s.better_than(best[0]):
            best = (s, mode)
    assert best is not None, "a problem allows at least one mode"
    return best


def best_baseline(baselines: Iterable[Baseline]) -> Baseline | None:
    """The fastest baseline within the memory limit."""
    best: Baseline | None = None
    best_time = math.inf
    for b in baselines:
        # b.usable, spelled out so that the type of b.score narrows
        if b.score is not None and b.score.fits and (best is None or b.score.time < best_time):
            best, best_time = b, b.score.time
    return best
