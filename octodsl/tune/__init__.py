"""The tuner: partition, placement and schedule searched together, round by round, each round
working on where the simulated timeline loses time (after OctoPipe's tuner).

    problem = Problem.create("nemotron-h-8b", devices=8, microbatches=32, memory=80 * 2**30)
    result = tune(problem, budget=60, seed=0)   # result.best.plan, result.rounds
    outcome = tune_and_compare(problem, budget=60, others=("random", "milp"))
    found = search(Cluster("nemotron-h-56b", gpus=128, global_batch=512, memory=80 * 10**9),
                   budget=600)                 # found.best.config, found.ranked()

Rooms, one job each:
- problem.py: what the tuner is asked (costs, devices, micro-batches, memory limit, links,
  the levers it may pull) and how a layout becomes a plan; bounds.py: the lower bounds on
  every plan of a problem; advice.py: what to tell the user when no plan fits;
  clock.py: the clock `--budget` runs on;
- pipeline/: the pipeline tuner: layouts, list scheduling, the closed-form estimate, the
  moves, diagnosis and the round loop, every plan timed by octodsl.sim (evaluate.py);
- reference/: what the tuner is measured against (the classic baselines, random search,
  CP-SAT) and the comparison `octodsl tune` prints;
- cluster/: `tune --gpus`, the whole configuration (tp x pp x dp, micro-batching, ZeRO)
  searched around the tuner, its Megatron-style baselines, the runtimes it targets and its
  tables (docs/cluster.md).
"""

from .cluster.search import ClusterResult, NoConfigurationFits, search
from .cluster.space import Cluster, Config
from .pipeline.evaluate import Evaluator, Score
from .pipeline.layout import StageLayout
from .pipeline.loop import Round, TuneResult, tune
from .problem import Problem
from .reference.baselines import Baseline, best_baseline, classic_baselines
from .reference.compare import NoPlanFits, Outcome, tune_and_compare

__all__ = [
    "Baseline",
    "Cluster",
    "ClusterResult",
    "Config",
    "Evaluator",
    "NoConfigurationFits",
    "NoPlanFits",
    "Outcome",
    "Problem",
    "Round",
    "Score",
    "StageLayout",
    "TuneResult",
    "best_baseline",
    "classic_baselines",
    "search",
    "tune",
    "tune_and_compare",
]
