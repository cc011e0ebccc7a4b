"""What `tune --gpus` reports: the configurations it tuned, best first, the baselines beside the
best, and what it left out and why; as tables or as JSON."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from rich.table import Table

from ...models import load_model
from ...models.ep import moe_layers
from ...plan import Recompute
from ...units import milliseconds, size
from ..pipeline.evaluate import Score
from .search import Candidate, ClusterResult
from .space import DOMINATED, INFEASIBLE, NOT_SCREENED, Config
from .target import runtimes

ROWS = 12
"""Configurations the table shows (--json lists every one simulated)."""


@dataclass(frozen=True)
class Row:
    """One plan's figures in the cluster's terms."""

    config: Config
    how: str
    """'tuned', or the classic plan's name."""
    time: float
    throughput: float
    """Tokens per GPU per second."""
    peak: float
    """The highest peak of any GPU, bytes."""
    efficiency: float
    """The configuration's lower bound over the iteration time."""
    recompute: str
    """How many stages recompute: '3 s, 1 f', or 'none'."""

    @classmethod
    def of(cls, result: ClusterResult, c: Candidate, score: Score, how: str) -> Row:
        modes = score.plan.recompute()
        counts = [
            f"{modes.count(m)} {m.value[0]}"
            for m in (Recompute.SELECTIVE, Recompute.FULL)
            if modes.count(m)
        ]
        return cls(
            c.config,
            how,
            score.time,
            result.tokens_per_gpu(score.time),
            float(score.peak.max()),
            c.problem.lower_bound() / score.time,
            ", ".join(counts) or "none",
        )

    def to_json(self) -> dict:
        c = self.config
        return {
            "tp": c.tp,
            "pp": c.pp,
            "dp": c.dp,
            "ep": c.ep,
            "microbatch_size": c.microbatch_size,
            "microbatches": c.microbatches,
            "zero": c.zero,
            "plan": self.how,
            "iteration_time": self.time,
            "tokens_per_gpu_per_s": self.throughput,
            "peak_memory": self.peak,
            "efficiency": self.efficiency,
            "recompute": self.recompute,
            "runtimes": list(runtimes(c.zero)),
        }


def rows(result: ClusterResult) -> list[Row]:
    """Each configuration with a plan that fits, its best plan, fastest first."""
    out = []
    for c in result.ranked():
        best = c.best
        assert best is not None, "ranked candidates have a plan"
        tuned = c.tuned is not None and c.tuned.best is best
        classic = c.classic
        out.append(Row.of(result, c, best, "tuned" if tuned or classic is None else classic.name))
    return out


def baselines(result: ClusterResult) -> list[tuple[str, Row | None, str]]:
    """(what, its plan's row or None, why none) of each baseline."""
    out: list[tuple[str, Row | None, str]] = []
    for m in result.megatron:
        cand = next((c for c in result.candidates if c.config == m.config), None)
        if m.score is None or m.config is None or cand is None:
            out.append((f"{m.name} (Megatron-style)", None, m.why))
        else:
            label = m.plan_name + ("" if m.recompute is Recompute.NONE else f" ({m.recompute})")
            tried, depths = m.depths
            if tried < depths:  # the budget stopped the recipe before every depth
                label += f" ({tried} of {depths} depths)"
            out.append(
                (
                    "Megatron-style, "
                    + ("equal layers" if m.name.endswith("equal") else "time-balanced"),
                    Row.of(result, cand, m.score, label),
                    "",
                )
            )
    best = result.best
    classic = best.classic
    out.append(
        (
            "best classic schedule, same configuration",
            Row.of(result, best, classic.score, classic.name)  # type: ignore[arg-type]
            if classic is not None
            else None,
            "none fits",
        )
    )
    cand, b = result.classic_search()
    out.append(
        (
            "configuration search, classic only",
            Row.of(result, cand, b.score, b.name)  # type: ignore[arg-type]
            if cand is not None and b is not None
            else None,
            "none fits",
        )
    )
    return out


def skipped_counts(result: ClusterResult) -> dict[str, int]:
    """Configurations per status: tuned; screened (its classic plans simulated) and not tuned;
    and each reason for leaving one out (INFEASIBLE, DOMINATED, NOT_SCREENED)."""
    counts = Counter(s.why for s in result.skipped)
    return {
        "tuned": sum(c.tuned is not None for c in result.candidates),
        "screened": sum(c.screened and c.tuned is None for c in result.candidates),
        **{why: counts[why] for why in (INFEASIBLE, DOMINATED, NOT_SCREENED) if counts[why]},
    }


def cluster_table(result: ClusterResult) -> Table:
    c = result.cluster
    table = Table(
        title=f"{c.model}: {c.gpus} GPUs, global batch {c.global_batch} "
        f"({result.cluster.tokens():,} tokens), {size(c.memory) if c.memory else 'no limit'}"
        " per GPU",
        header_style="bold",
        title_justify="left",
    )
    experts = has_experts(result)
    for col in (
        "tp",
        "pp",
        "dp",
        *(("ep",) if experts else ()),
        "mb size",
        "micro-b.",
        "zero",
        "recompute",
        "iteration",
        "tok/GPU/s",
        "peak mem",
        "eff.",
        "plan",
        "runs on",
    ):
        table.add_column(
            col,
            justify="left" if col in ("recompute", "plan", "runs on") else "right",
            no_wrap=True,
        )
    for i, r in enumerate(rows(result)[:ROWS]):
        table.add_row(*_cells(r, experts), style="bold green" if i == 0 else "")
    return table


def baselines_table(result: ClusterResult) -> Table:
    best = rows(result)[0]
    table = Table(
        title="baselines (speed-up: the best plan's tokens per GPU per second over the baseline's)",
        header_style="bold",
        title_justify="left",
    )
    for col in (
        "baseline",
        "configuration",
        "plan",
        "iteration",
        "tok/GPU/s",
        "peak mem",
        "speed-up",
    ):  # configuration: tp, pp, dp, ep (when over 1), micro-batches x size, ZeRO
        table.add_column(
            col,
            justify="left" if col in ("baseline", "configuration", "plan") else "right",
            no_wrap=True,
        )
    for what, r, why in baselines(result):
        if r is None:
            table.add_row(what, why, "", "", "", "", "")
        else:
            table.add_row(
                what,
                r.config.short(),
                r.how,
                milliseconds(r.time),
                f"{r.throughput:,.0f}",
                size(r.peak),
                f"{best.throughput / r.throughput:.2f}x",
            )
    return table


def to_json(result: ClusterResult, written: list[str]) -> dict:
    c = result.cluster
    out_rows = rows(result)
    return {
        "model": c.model,
        "gpus": c.gpus,
        "global_batch": c.global_batch,
        "tokens_per_iteration": c.tokens(),
        "memory_limit": c.memory,
        "gpus_per_node": c.gpus_per_node,
        "device": c.device,
        "target": c.target,
        "plans": written,
        "best": out_rows[0].to_json(),
        "configurations": [r.to_json() for r in out_rows],
        "baselines": {
            what: (r.to_json() | {"speedup": out_rows[0].throughput / r.throughput})
            if r is not None
            else None
            for what, r, _ in baselines(result)
        },
        "counts": skipped_counts(result),
        "excluded_tp": {str(k): v for k, v in result.excluded_tps.items()},
        "search": {
            "seconds": result.seconds,
            "compile_seconds": result.compiled,
            "interrupted": result.interrupted,
            "budget_short": result.budget_short,
        },
    }


def has_experts(result: ClusterResult) -> bool:
    """Whether the model has MoE layers, whose configurations have an ep to show."""
    return bool(moe_layers(load_model(result.cluster.model)))


def _cells(r: Row, experts: bool) -> list[str]:
    c = r.config
    return [
        str(c.tp),
        str(c.pp),
        str(c.dp),
        *((str(c.ep),) if experts else ()),
        str(c.microbatch_size),
        str(c.microbatches),
        str(c.zero),
        r.recompute,
        milliseconds(r.time),
        f"{r.throughput:,.0f}",
        size(r.peak),
        f"{r.efficiency:.3f}",
        r.how,
        ", ".join(runtimes(c.zero)),
    ]
