"""Expert parallelism in `tune --gpus` (issue 29): the search chooses ep beside tp, pp, dp,
micro-batching and ZeRO for a model with MoE layers, and picks ep > 1 where the experts fit no
other way; a dense model is searched at ep 1 alone; the memory proof shards the experts as the
simulator does; the lower bound holds for plans whose overlap groups hide the all-to-alls; bad
values of --ep are one line."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
from rich.console import Console

from octodsl.cli import main
from octodsl.gen import render_plan
from octodsl.lint import lint_source
from octodsl.plan import Recompute
from octodsl.tune.cluster.report import cluster_table, to_json
from octodsl.tune.cluster.search import (
    Candidate,
    NoConfigurationFits,
    plan_of,
    screen_order,
    search,
)
from octodsl.tune.cluster.space import (
    Cluster,
    Config,
    Tables,
    configurations,
    problem_of,
    tp_degrees,
)
from octodsl.tune.pipeline.evaluate import Evaluator
from octodsl.tune.problem import recompute_everywhere
from octodsl.tune.reference.baselines import classic_plans

from .test_cli_cluster import one_line_error
from .test_space import model_bytes

HEAVY = str(Path(__file__).parent / "data" / "moe-heavy-tiny.yaml")
"""qwen3-next-tiny with 64 experts of 512: its experts hold most of its bytes."""
NO_ROOM = Cluster(HEAVY, 16, 16, pp=2, memory=int(0.15 * model_bytes(HEAVY)))
"""Two pipeline devices of 8 copies whose GPUs hold 15% of the model's bytes: at ep 1 every
GPU holds its stage's experts whole and none fits; at ep 4 each holds a quarter of them."""


def test_ep_wins_where_the_experts_fit_no_other_way():
    with pytest.raises(NoConfigurationFits):
        search(replace(NO_ROOM, ep=1), budget=600, max_evaluations=20)
    result = search(NO_ROOM, budget=600, max_evaluations=20)
    best = result.best
    assert best.config.ep > 1 and all(c.config.ep > 1 for c in result.ranked())
    assert f"ep{best.config.ep}" in best.config.short()
    # the plan written says so, and lints clean
    plan = plan_of(best)
    assert plan.header.ep == best.config.ep and plan.header.dp == best.config.dp
    text = render_plan(plan)
    assert not [d for d in lint_source(text, "best.octo")[1] if d.is_error]
    # and the report shows it
    assert to_json(result, [])["best"]["ep"] == best.config.ep
    console = Console(width=250, record=True)
    console.print(cluster_table(result))
    header = next(line for line in console.export_text().splitlines() if "mb size" in line)
    assert "┃ dp ┃ ep ┃" in header


def test_a_model_without_experts_is_searched_at_ep_1_alone():
    c = Cluster("nemotron-h-tiny", 64, 64)
    space = list(configurations(c, tp_degrees(c)[0]))
    assert space and {x.ep for x in space} == {1}
    assert any(x.dp == 64 for x in space)
    moe = Cluster("jamba-tiny", 64, 64)
    assert {x.ep for x in configurations(moe, tp_degrees(moe)[0])} == {1, 2, 4, 8, 16}


@pytest.mark.parametrize("zero", [0, 1, 2])
def test_the_memory_proof_shards_the_experts_as_the_simulator_does(zero):
    """The static bytes the memory bound counts per device are what the simulator holds: the
    routed experts' sharded over the dp / ep copies that hold them, the rest over dp."""
    c = Cluster(HEAVY, 16, 16, target="megatron")
    problem = problem_of(c, Config(1, 2, 8, 1, 2, zero, 4), Tables(c))
    [(_, plan, _)] = classic_plans(problem, (("1f1b", None),), ("equal",))
    assert plan is not None
    static = Evaluator(problem)(plan).result.memory.static
    layers = problem.layer_static()
    want = [sum(layers[a : b + 1]) for a, b in problem.table.stage_ranges(plan)]
    assert static.tolist() == pytest.approx(want, rel=1e-9)
    # ep shards the experts' weights whatever the ZeRO stage: fewer bytes than at ep 1
    one = problem_of(c, Config(1, 2, 8, 1, 2, zero, 1), Tables(c))
    assert layers.sum() < 0.6 * one.layer_static().sum()


@pytest.mark.parametrize(
    "model,gpus,config",
    [
        (HEAVY, 8, Config(1, 1, 8, 1, 8, 1, 8)),
        (HEAVY, 16, Config(1, 2, 8, 1, 8, 1, 4)),
        ("jamba-tiny", 16, Config(8, 1, 2, 1, 8, 1, 2)),
    ],
)
def test_no_classic_plan_beats_the_bound_when_groups_hide_all_to_alls(model, gpus, config):
    """DualPipeV's overlap groups run the expert all-to-alls under the other op's compute: the
    lower bound leaves them out of the work, so no plan, grouped or not, is faster (with them
    in, DualPipeV on one device beat the first and third cases' bounds)."""
    c = Cluster(model, gpus, config.dp * config.microbatches)
    problem = problem_of(c, config, Tables(c))
    bound = problem.tight_lower_bound()
    evaluate = Evaluator(problem)
    grouped = 0
    for name, plan, _ in classic_plans(problem):
        if plan is None:
            continue
        grouped += any(len(s.ops) > 1 for slots in plan.schedule for s in slots)
        for mode in (Recompute.NONE, Recompute.FULL):
            score = evaluate(recompute_everywhere(plan, mode))
            assert score.time >= bound * (1 - 1e-9), f"{name} {mode}"
    assert grouped


@pytest.mark.parametrize(
    "args,message",
    [
        (["--ep", "0"], "--ep: must be at least 1"),
        (["--ep", str(10**9)], "--ep: must be at most"),
        (["--ep", "2"], "nemotron-h-tiny has no MoE layers"),
        (["--model", "jamba-tiny", "--ep", "3"], "does not divide the 16 experts"),
    ],
)
def test_hostile_ep(tmp_path, capsys, args, message):
    base = ["tune", "--model", "nemotron-h-tiny", "--gpus", "8", "--global-batch", "8"]
    assert main(base + args + ["-o", str(tmp_path / "t.octo")]) == 2
    assert message in one_line_error(capsys)


@pytest.mark.parametrize(
    "args,message",
    [
        (["--dp", "3", "--ep", "2"], "ep 2 does not divide dp 3"),
        (["--dp", "6", "--ep", "3"], "does not divide the 16 experts"),
    ],
)
def test_hostile_ep_of_a_single_plan(tmp_path, capsys, args, message):
    base = ["tune", "--model", "jamba-tiny", "-p", "2", "-m", "4"]
    assert main(base + args + ["-o", str(tmp_path / "t.octo")]) == 2
    assert message in one_line_error(capsys)


def test_each_ep_is_screened_in_turn_and_a_dense_model_by_estimate():
    def cand(ep: int, estimate: float, bound: float = 0.0) -> Candidate:
        config = Config(1, 2, 8, 1, 2, 1, ep)
        return Candidate(config, None, bound, estimate)  # type: ignore[arg-type]

    by_estimate = [
        cand(1, 1.0),
        cand(1, 2.0),
        cand(1, 3.0),
        cand(4, 4.0),
        cand(2, 5.0),
        cand(4, 6.0),
    ]
    order = [(c.config.ep, c.estimate) for c in screen_order(by_estimate[::-1])]
    assert order == [(1, 1.0), (4, 4.0), (2, 5.0), (1, 2.0), (4, 6.0), (1, 3.0)]
    dense = [c for c in by_estimate if c.config.ep == 1]
    assert screen_order(dense[::-1]) == dense
    # the bound orders configurations of equal estimate
    tied = [cand(1, 1.0, 2.0), cand(1, 1.0, 1.0)]
    assert screen_order(tied) == tied[::-1]


def test_a_single_plan_is_tuned_at_the_ep_given(tmp_path, capsys):
    out = tmp_path / "t.octo"
    args = ["tune", "--model", "jamba-tiny", "-p", "2", "-m", "4", "--dp", "4", "--ep", "4"]
    assert main(args + ["--evaluations", "10", "--budget", "10m", "-o", str(out)]) == 0
    capsys.readouterr()
    plan, diags = lint_source(out.read_text(), str(out))
    assert plan.header.ep == 4 and plan.header.dp == 4
    assert not [d for d in diags if d.is_error]
