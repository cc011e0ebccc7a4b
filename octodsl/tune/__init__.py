"""The tuner: partition, placement and schedule searched together, round by round, each round
working on where the simulated timeline loses time (after OctoPipe's tuner).

    problem = Problem.create("nemotron-h-8b", devices=8, microbatches=32, memory=80 * 2**30)
    result = tune(problem, budget=60, seed=0)   # result.best.plan, result.rounds
    outcome = tune_and_compare(problem, budget=60, others=("random", "milp"))
    found = search(Cluster("nemotron-h-56b", gpus=128, global_batch=512, memory=80 * 10**9),
                   budget=600)                 # found.best.config, found.ranked()

Modules, one job each:
- problem.py: costs, devices, micro-batches, memory limit, link; the lower bound;
- layout.py: a plan's partition and placement as two tuples;
- construct.py: each device's order by list scheduling (ZeroBubble-style priorities, memory
  aware);
- estimate.py: the closed-form bubble-aware bound the partition search ranks cuts with;
- moves/: partition, placement, schedule and memory moves, small functions over plans;
- diagnose.py, propose.py, loop.py: which phase a round works on, its candidate moves, the loop;
- evaluate.py: every plan is timed by octodsl.sim;
- baselines.py, random_search.py, milp.py, compare.py, report.py: what the tuner is measured
  against, and how it is shown;
- space.py, cluster.py, cluster_baselines.py, cluster_report.py: `tune --gpus`, the whole
  configuration (tp x pp x dp, micro-batching, ZeRO) searched around the tuner, its
  Megatron-style baselines and its tables (docs/cluster.md).
"""

from .baselines import Baseline, best_baseline, classic_baselines
from .cluster import ClusterResult, NoConfigurationFits, search
from .compare import NoPlanFits, Outcome, tune_and_compare
from .evaluate import Evaluator, Score
from .layout import StageLayout
from .loop import Round, TuneResult, tune
from .problem import Problem
from .space import Cluster, Config

__all__ = ["Baseline", "Cluster", "ClusterResult", "Config", "Evaluator", "NoConfigurationFits",
           "NoPlanFits", "Outcome", "Problem", "Round", "Score", "StageLayout", "TuneResult",
           "best_baseline", "classic_baselines", "search", "tune", "tune_and_compare"]
