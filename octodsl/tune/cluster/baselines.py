"""The Megatron-style recipe `tune --gpus` is measured against, as a practitioner would try it
(docs/parallelism.md, "What practitioners run"): tp 8 inside a node (the largest tp up to 8 the
node and the model allow), interleaved 1F1B with 2 chunks per device, micro-batches of one
sequence, dp filling the rest of the GPUs with ZeRO 1 (the distributed optimizer), no recompute
or full recompute on every stage when it does not fit otherwise; with equal layer counts
(Megatron's own split) and with the time-balanced one. A practitioner tries each pipeline depth:
the recipe's figure is its fastest one that fits."""

from __future__ import annotations

import time
from dataclasses import dataclass, replace

from ...plan import Recompute
from ..pipeline.evaluate import Evaluator, Score
from ..problem import AUTO, Problem, recompute_everywhere
from ..reference.baselines import baseline_name, classic_plans
from .space import Cluster, Config, Tables, meshes, over_limits, problem_of, tp_degrees

RECIPE = ("interleaved", 2)
RECIPE_TP = 8
PARTITIONS = ("equal", "time")


@dataclass(frozen=True)
class MegatronBaseline:
    name: str
    """'megatron-equal' or 'megatron-time'."""
    config: Config | None
    """The pipeline depth that ran fastest (None: none fits)."""
    score: Score | None
    recompute: Recompute = Recompute.NONE
    why: str = ""
    """Why there is none, when score is None."""
    depths: tuple[int, int] = (0, 0)
    """Pipeline depths looked at (tried, or ruled out by their bound) of those some plan of which
    may fit: fewer when the budget stopped it."""

    @property
    def plan_name(self) -> str:
        """The classic plan it is: 'interleaved-v2-equal'."""
        return baseline_name(*RECIPE, self.name.removeprefix("megatron-"))


def recipe_tp(cluster: Cluster, tps: list[int]) -> int | None:
    """The recipe's tp: 8, else the largest of `tps` below it (None: none)."""
    return max((t for t in tps if t <= RECIPE_TP), default=None)


def megatron_baselines(
    cluster: Cluster, tables: Tables, deadline: float | None = None
) -> list[MegatronBaseline]:
    """The recipe with each partition, at its fastest pipeline depth. Depths are tried by their
    lower bound, and one whose bound is no shorter than the partition's fastest plan so far is
    not simulated (it cannot be faster); with a `deadline` (time.perf_counter()), no depth
    starts past it once one was simulated (`depths` says how many of how many were tried)."""
    tps, _ = tp_degrees(replace(cluster, tp=None, pp=None))
    chosen = recipe_tp(cluster, tps)
    depths: list[tuple[float, Config, Problem]] = []
    ruled_out = 0  # depths the memory bound rules out: tried, no plan of them fits
    for tp, pp, dp in meshes(replace(cluster, pp=None), [chosen] if chosen else []):
        if pp < 2 or cluster.global_batch % dp:
            continue
        config = Config(tp, pp, dp, 1, cluster.global_batch // dp, 1 if dp > 1 else 0)
        # over octodsl's limits (checked before the header, which would refuse it) or memory
        problem = (
            None if over_limits(pp, config.microbatches) else problem_of(cluster, config, tables)
        )
        if problem is None or problem.why_no_plan_fits() is not None:
            ruled_out += 1
        else:
            depths.append((problem.tight_lower_bound(), config, problem))
    depths.sort(key=lambda d: (d[0], d[1]))
    best: dict[str, MegatronBaseline] = {}
    built = 0
    for i, (bound, config, problem) in enumerate(depths):
        if deadline is not None and built and time.perf_counter() > deadline:
            break
        evaluate = Evaluator(problem)
        for partition in PARTITIONS:
            name = f"megatron-{partition}"
            held = best.get(name)
            if held is not None and held.score is not None and bound >= held.score.time:
                continue
            plans = [p for _, p, _ in classic_plans(problem, (RECIPE,), (partition,)) if p]
            if not plans:  # too few layers or micro-batches for 2 chunks per device
                continue
            built += 1
            for mode in _modes(cluster):
                s = evaluate(recompute_everywhere(plans[0], mode))
                if s.fits:
                    if held is None or held.score is None or s.time < held.score.time:
                        best[name] = MegatronBaseline(name, config, s, mode)
                    break
        for name in best:
            best[name] = replace(best[name], depths=(i + 1, len(depths)))
    tried = built or ruled_out
    return [
        best.get(name)
        or MegatronBaseline(
            name,
            None,
            None,
            why=f"no pipeline depth at tp {chosen} fits"
            if tried
            else "no configuration of the recipe can be built"
            if chosen
            else "the model splits over no tp up to 8",
        )
        for name in (f"megatron-{p}" for p in PARTITIONS)
    ]


def _modes(cluster: Cluster) -> tuple[Recompute, ...]:
    """No recompute, else full on every stage; a fixed mode alone."""
    if cluster.recompute == AUTO:
        return (Recompute.NONE, Recompute.FULL)
    return (Recompute(cluster.recompute),)
