"""What `octodsl tune` reports: the tuned plan's figures next to every baseline's, as a table or
as JSON, and the tuner's rounds for `--explain`."""

from __future__ import annotations

import math
from dataclasses import dataclass

from rich.table import Table
from rich.text import Text

from ...plan import Recompute
from ...units import milliseconds as _ms
from ...units import size
from ..bounds import tight_terms
from ..pipeline.evaluate import Score
from ..pipeline.loop import Round, TuneResult
from ..problem import Problem
from .baselines import NOT_RUN, Baseline, best_baseline


@dataclass(frozen=True)
class Figures:
    """One plan's simulated figures."""

    iteration_time: float
    throughput: float | None
    """Tokens per GPU per second (SimResult.throughput)."""
    bubble_ratio: float
    peak_memory: list[float]
    """Per device, bytes."""
    efficiency: float
    """The problem's lower bound over the iteration time."""
    fits: bool

    @classmethod
    def of(cls, score: Score, problem: Problem) -> Figures:
        r = score.result
        assert r is not None, "a plan that deadlocks has no figures"
        return cls(
            score.time,
            r.throughput,
            r.bubble_ratio,
            [float(x) for x in score.peak],
            problem.lower_bound() / score.time,
            score.fits,
        )


def to_json(
    problem: Problem,
    tuned: TuneResult,
    baselines: list[Baseline],
    plan_path: str | None,
    extra: dict[str, Score | None] | None = None,
    compiled: float = 0.0,
) -> dict:
    """At least: plan, iteration_time, lower_bound, efficiency, peak_memory (per device),
    baselines (name -> iteration time, null when the schedule could not be built, was not run
    for the budget (those are listed in not_run) or does not fit in memory). `compiled`: the
    seconds spent compiling before the search (`Outcome.compiled`)."""
    f = Figures.of(tuned.best, problem)
    others = _others(baselines, extra)
    best = best_baseline(baselines)
    tight = problem.tight_lower_bound()
    return {
        "plan": plan_path,
        "model": problem.header.model,
        "devices": problem.devices,
        "microbatches": problem.microbatches,
        "memory_limit": problem.memory,
        "iteration_time": f.iteration_time,
        "lower_bound": problem.lower_bound(),
        "efficiency": f.efficiency,
        "tight_lower_bound": tight,
        "tight_efficiency": tight / f.iteration_time,
        "throughput": f.throughput,
        "bubble_ratio": f.bubble_ratio,
        "peak_memory": f.peak_memory,
        "baselines": {
            name: (s.time if s is not None and s.fits else None) for name, s in others.items()
        },
        "speedup": {
            name: (s.time / f.iteration_time if s is not None and s.fits else None)
            for name, s in others.items()
        },
        "best_baseline": best.name if best else None,
        "baseline_recompute": {b.name: b.recompute.value for b in baselines if b.score is not None},
        "dp": problem.header.dp,
        "zero": problem.header.zero,
        "tp": problem.header.tp,
        "sequence_parallel": problem.header.sp,
        "gpus_per_node": problem.header.gpus_per_node,
        "recompute": str(problem.recompute),
        "tuned_recompute": [m.value for m in tuned.best.plan.recompute()],
        "not_run": [b.name for b in baselines if b.error == NOT_RUN],
        "tuner": {
            "seconds": tuned.seconds,
            "evaluations": tuned.evaluations,
            "finished": tuned.finished,
            "interrupted": tuned.interrupted,
            "rounds": len(tuned.rounds),
            "searches": search_times(tuned),
            "compile_seconds": compiled,
        },
    }


def search_times(tuned: TuneResult) -> list[float | None]:
    """Each search's best iteration time, in the order they ran (None: none of its plans fit
    in memory)."""
    return [s.time if s.fits else None for s, _ in tuned.finalists]


def searches_spread(tuned: TuneResult) -> str:
    """How far apart the searches' best plans ended (each in a local optimum of its own),
    for a tune of two or more searches; '' otherwise."""
    times = [t for t in search_times(tuned) if t is not None]
    if len(times) < 2:
        return ""
    lo, hi = min(times), max(times)
    unfit = len(tuned.finalists) - len(times)
    return (
        f"{len(times)} searches ended between {_ms(lo)} and {_ms(hi)} "
        f"({(hi / lo - 1) * 100:.1f}% apart)"
        + (f" and {unfit} with no plan that fits" if unfit else "")
        + ", each in a local optimum of its own: more (--searches, with the --budget for "
        "them) may find a faster plan"
    )


def _others(baselines: list[Baseline], extra: dict[str, Score | None] | None) -> dict:
    out = {b.name: b.score for b in baselines}
    out.update(extra or {})
    return out


def _label(baselines: list[Baseline]) -> dict[str, str]:
    """A baseline's name in the table, with the recompute it ran with when not none."""
    return {
        b.name: b.name + ("" if b.recompute is Recompute.NONE else f" ({b.recompute})")
        for b in baselines
    }


def comparison_table(
    problem: Problem,
    tuned: TuneResult,
    baselines: list[Baseline],
    extra: dict[str, Score | None] | None = None,
) -> Table:
    """One row for the tuned plan, one per baseline, fastest first; baselines that cannot run
    or do not fit at the bottom."""
    f_tuned = Figures.of(tuned.best, problem)
    h = problem.header
    mesh = f" (tp {h.tp} x pp {h.devices} x dp {h.dp})" if h.tp > 1 or h.dp > 1 else ""
    table = Table(
        title=f"{problem.header.model}: {problem.devices} devices x "
        f"{problem.microbatches} micro-batches{mesh} (lower bound {_ms(problem.lower_bound())}"
        + _tight(problem)
        + ")",
        header_style="bold",
        title_justify="left",
    )
    table.add_column("plan", no_wrap=True, min_width=20)
    for col in ("iteration", "tok/GPU/s", "bubble", "peak mem", "eff.", "speed-up"):
        table.add_column(col, justify="right", no_wrap=True)
    table.add_row(*_cells("tuned", f_tuned, f_tuned), style="bold green")
    rows: list[tuple[float, str, Figures | None]] = []
    not_run = {b.name for b in baselines if b.error == NOT_RUN}
    label = _label(baselines)
    for name, s in _others(baselines, extra).items():
        name = label.get(name, name)
        if s is None:
            rows.append((math.inf, name, None))
        else:
            rows.append((s.time if s.fits else math.inf, name, Figures.of(s, problem)))
    for _, name, f in sorted(rows, key=lambda r: (r[0], r[1])):
        if f is None:
            table.add_row(
                name,
                Text("not run (budget)" if name in not_run else "cannot be built", style="dim"),
                *[""] * 5,
            )
        else:
            table.add_row(*_cells(name, f, f_tuned))
    return table


def _tight(problem: Problem) -> str:
    """The tighter bound, when it differs: efficiency 1 is out of reach then."""
    terms = tight_terms(problem)
    why = max(terms, key=terms.__getitem__)
    if terms[why] <= problem.lower_bound() * 1.001:
        return ""
    return f"; {_ms(terms[why])} counting {why}"


def _cells(name: str, f: Figures, tuned: Figures) -> list:
    peak = Text(size(max(f.peak_memory)), style="" if f.fits else "bold red")
    return [
        name,
        _ms(f.iteration_time),
        f"{f.throughput:,.0f}" if f.throughput is not None else "",
        f"{f.bubble_ratio:.1%}",
        peak,
        f"{f.efficiency:.3f}",
        f"{f.iteration_time / tuned.iteration_time:.2f}x" if f.fits else "over mem.",
    ]


def explain(rounds: list[Round]) -> list[str]:
    """One line per round: number, phase, iteration time before and after, move (and for a
    memory move, such as each recompute move, the highest peak before and after)."""
    out = []
    for r in rounds:
        before = "-" if math.isinf(r.before) else _ms(r.before)
        peaks = f" (peak {size(r.peaks[0])} -> {size(r.peaks[1])})" if r.peaks else ""
        out.append(f"{r.number:4} {r.phase:<9} {before:>11} -> {_ms(r.after):>11}  {r.move}{peaks}")
    return out
