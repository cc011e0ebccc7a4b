"""The Megatron-style recipe `tune --gpus` is measured against, as a practitioner would try it
(docs/parallelism.md, "What practitioners run"): tp 8 inside a node (the largest tp up to 8 the
node and the model allow), interleaved 1F1B with 2 chunks per device, micro-batches of one
sequence, dp filling the rest of the GPUs with ZeRO 1 (the distributed optimizer), no recompute
or full recompute on every stage when it does not fit otherwise; with equal layer counts
(Megatron's own split) and with the time-balanced one. A practitioner tries each pipeline depth:
the recipe's figure is its fastest one that fits."""

from __future__ import annotations

from dataclasses import dataclass, replace

from ..plan import Recompute
from .baselines import baseline_name, classic_plans
from .evaluate import Evaluator, Score
from .problem import AUTO, recompute_everywhere
from .space import Cluster, Config, Tables, infeasible, meshes, problem_of, tp_degrees

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

    @property
    def plan_name(self) -> str:
        """The classic plan it is: 'interleaved-v2-equal'."""
        return baseline_name(*RECIPE, self.name.removeprefix("megatron-"))


def recipe_tp(cluster: Cluster, tps: list[int]) -> int | None:
    """The recipe's tp: 8, else the largest of `tps` below it (None: none)."""
    return max((t for t in tps if t <= RECIPE_TP), default=None)


def megatron_baselines(cluster: Cluster, tables: Tables) -> list[MegatronBaseline]:
    """The recipe with each partition, at its fastest pipeline depth."""
    tps, _ = tp_degrees(replace(cluster, tp=None, pp=None))
    tp = recipe_tp(cluster, tps)
    out = []
    for partition in PARTITIONS:
        name = f"megatron-{partition}"
        best: MegatronBaseline | None = None
        tried = 0
        for mesh_tp, pp, dp in meshes(replace(cluster, pp=None), [tp] if tp else []):
            if pp < 2 or cluster.global_batch % dp:
                continue
            config = Config(mesh_tp, pp, dp, 1, cluster.global_batch // dp, 1 if dp > 1 else 0)
            problem = problem_of(cluster, config, tables)
            if infeasible(problem) is not None:
                continue
            plans = [p for _, p, _ in classic_plans(problem, (RECIPE,), (partition,)) if p]
            if not plans:  # too few layers or micro-batches for 2 chunks per device
                continue
            tried += 1
            evaluate = Evaluator(problem)
            modes = ((Recompute.NONE, Recompute.FULL) if cluster.recompute == AUTO
                     else (Recompute(cluster.recompute),))
            for mode in modes:
                s = evaluate(recompute_everywhere(plans[0], mode))
                if s.fits:
                    if best is None or best.score is None or s.time < best.score.time:
                        best = MegatronBaseline(name, config, s, mode)
                    break
        out.append(best or MegatronBaseline(
            name, None, None, why=f"no pipeline depth at tp {tp} fits" if tried else
            "no configuration of the recipe can be built" if tp else
            "the model splits over no tp up to 8"))
    return out
