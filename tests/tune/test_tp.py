"""The tuner at tp > 1 and on a mesh of nodes: the problem's costs are one GPU's share, the
no-fit message names the tp that fits, the search's estimates time each cut on its link, and
the bounds hold when devices' dp groups sit on different links."""

from __future__ import annotations

import numpy as np
import pytest

from octodsl.costs.table import Link
from octodsl.tune.advice import tp_that_fits
from octodsl.tune.bounds import dp_seconds, fastest_dp_links
from octodsl.tune.pipeline.estimate import FillModel
from octodsl.tune.pipeline.evaluate import Evaluator
from octodsl.tune.pipeline.loop import tune
from octodsl.tune.problem import Problem
from octodsl.tune.reference.baselines import classic_baselines

GIB = 2**30
SLOW = Link("slow", 1e-3, 1e7)


def test_the_problem_at_tp_costs_one_gpu_s_share():
    one = Problem.create("nemotron-h-8b", 4, 8)
    four = Problem.create("nemotron-h-8b", 4, 8, tp=4)
    assert (four.header.tp, four.header.sp, four.table.meta["tp"]) == (4, True, 4)
    # Parameters split over the group but for the norms (and a vocabulary padded to tp).
    assert float(four.layer_static().sum()) == pytest.approx(
        float(one.layer_static().sum()) / 4, rel=0.01
    )
    assert four.lower_bound() < one.lower_bound()
    # The baselines and the tuner's plans carry the problem's tp.
    evaluate = Evaluator(four)
    built = [b for b in classic_baselines(four, evaluate) if b.score is not None]
    assert built and all(b.score.plan.header.tp == 4 for b in built)


def test_no_fit_names_the_smallest_tp_that_fits():
    pr = Problem.create("nemotron-h-56b", 4, 8, memory=80 * GIB, dp=2, zero=1)
    reason = pr.why_no_plan_fits()
    assert reason is not None and "tensor parallelism (`--tp 2` splits every layer" in reason
    assert tp_that_fits(pr) == 2 and pr.at_tp(2).why_no_plan_fits() is None
    at2 = Problem.create("llama3-70b", 4, 8, memory=80 * GIB, dp=2, zero=1, tp=2)
    assert "(zero 1, dp 2, tp 2)" in at2.why_no_plan_fits() and tp_that_fits(at2) == 4
    # Within a node only: 2 GPUs per node leave no larger tp to try.
    narrow = Problem.create(
        "llama3-70b", 4, 8, memory=80 * GIB, dp=2, zero=1, tp=2, gpus_per_node=2
    )
    assert tp_that_fits(narrow) is None and "--tp" not in narrow.why_no_plan_fits()


def test_the_fill_estimate_times_each_cut_on_its_link():
    pr = Problem.create("nemotron-h-8b", 16, 32, inter_link=SLOW)
    model = FillModel(pr, tuple(range(16)))
    out = np.array([layer.message_bytes for layer in pr.table.layers])
    extra = pr.table.meta["message_overhead"]  # each message's cost beyond its link's time
    assert model.inputs.hop[7] == pytest.approx(SLOW.latency + out / SLOW.bandwidth + extra)
    assert model.inputs.hop[6] == pytest.approx(pr.link.latency + out / pr.link.bandwidth + extra)


@pytest.mark.parametrize("zero", [0, 1, 2])
def test_bounds_hold_with_dp_groups_on_different_links(zero):
    # dp 3 on 8 GPUs per node: device 2's dp group (ranks 6, 7 | 8) spans two nodes, on the
    # slow link; the others stay in theirs.
    pr = Problem.create("nemotron-h-tiny", 4, 8, dp=3, zero=zero, inter_link=SLOW)
    assert [link.latency for link in fastest_dp_links(pr)] == [pr.link.latency] * 2 + [
        SLOW.latency,
        pr.link.latency,
    ]
    bound = pr.tight_lower_bound()
    assert dp_seconds(pr)[0 if zero < 2 else 1] > 0
    result = tune(pr, budget=30, max_evaluations=40, seed=0)
    scores = [result.best] + [b.score for b in classic_baselines(pr) if b.score is not None]
    for s in scores:
        assert s.time >= bound * (1 - 1e-9)
