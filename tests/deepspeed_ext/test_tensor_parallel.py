"""Tensor parallelism in the executor on real processes (gloo, 4 CPU processes): tp 2 trains as
tp 1 does, from the same weights (the layers shard the tp 1 init) on the same data.

Not bit for bit: tp changes the order of the sums (a projection's partial sums added by the
all-reduce, the cross-entropy's sum of exponentials over the vocabulary shards), so each number
differs in rounding. After three AdamW steps the losses agree to 1e-7 relative here; the bound
is the issue's 1e-5. The first step's gradient norm (each parameter counted once over pipe x tp)
agrees to 1e-6 (1e-8 here): a parameter left out or counted twice, or a sequence-parallel
gradient not summed over the group (the norms' weights: a few 1e-5 of the norm), shows far
above that. The models: harness.py's Nemotron-H hybrid and a narrow Jamba (Mamba1, MoE).
"""

from __future__ import annotations

import json

import pytest

from octodsl.cli import main as main_cli

from .test_executor import launch, run_case

pytestmark = pytest.mark.slow
LOSS_REL = 1e-5
NORM_REL = 1e-6


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    return {
        r["plan"]: r for r in run_case(tmp_path_factory, 4, "tp", script="tp_cases.py")["results"]
    }


@pytest.mark.parametrize(
    "plan", ["1f1b", "1f1b/nosp", "zb-h1", "zb-v", "1f1b/pp1/dp2", "1f1b/pp1/clip", "jamba/zb-h1"]
)
def test_tp_2_trains_like_tp_1(results, plan):
    r = results[plan]
    assert r["loss_rel"] <= LOSS_REL, r
    assert abs(r["norm"] - r["ref_norm"]) <= NORM_REL * r["ref_norm"], r
    assert r["losses"][-1] < r["losses"][0], r  # and it trains


def test_a_launch_that_does_not_fit_the_mesh_is_refused_on_every_rank(tmp_path_factory):
    ranks = run_case(tmp_path_factory, 2, "refusals", script="tp_cases.py")["ranks"]
    assert ranks[0] == ranks[1]
    assert ranks[0]["world"] == (
        "PlanLaunchError: the plan runs 1 data-parallel copy of a 2-device pipeline of tp groups "
        "of 2 (4 processes: tp 2 x 2 devices x dp 1), but the job has 2 processes; to fit it set "
        "`tp 1` in the plan header"
    )
    assert ranks[0]["split"] == (
        "PlanLaunchError: the model's layers cannot be split over tp 2: "
        "mlp ffn 127: not divisible by tp 2 (choose a tp that divides them)"
    )


def test_train_py_runs_a_tp_plan_as_users_launch_it(tmp_path):
    # a plan written by `octodsl gen --tp 2`, on 4 processes, against the same plan without
    # its `tp 2` line (the same partition) on 2; no clipping: see deepspeed_ext/README.md, DeepSpeed's
    # own fp32 clipping leaves out the parameters of every pipeline device but the first
    config = tmp_path / "ds.json"
    config.write_text(
        json.dumps(
            {"optimizer": {"type": "AdamW", "params": {"lr": 1e-3}}, "steps_per_print": 10**9}
        )
    )
    tp2 = tmp_path / "tp2.octo"
    assert (
        main_cli(
            [
                "gen",
                "zb-h1",
                "--devices",
                "2",
                "--microbatches",
                "4",
                "--model",
                "nemotron-h-tiny",
                "--microbatch-size",
                "1",
                "--seq-len",
                "16",
                "--tp",
                "2",
                "-o",
                str(tp2),
            ]
        )
        == 0
    )
    tp1 = tmp_path / "tp1.octo"
    tp1.write_text(tp2.read_text().replace("  tp 2\n", ""))
    runs = {}
    for procs, plan in ((4, tp2), (2, tp1)):
        proc = launch(
            procs,
            "examples/train.py",
            "--deepspeed_config",
            str(config),
            "--schedule",
            str(plan),
            "--steps",
            "3",
        )
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
        runs[procs] = [
            json.loads(line)["loss"]
            for line in proc.stdout.splitlines()
            if line.startswith('{"step"')
        ]
        assert ("each device a tp group of 2 (sequence-parallel)" in proc.stdout) == (procs == 4)
    assert len(runs[4]) == 3
    assert all(abs(a - b) <= LOSS_REL * b for a, b in zip(runs[4], runs[2], strict=True)), runs


def test_a_checkpoint_resumes_and_names_its_tp(tmp_path_factory):
    runs = run_case(tmp_path_factory, 4, "checkpoint", script="tp_cases.py")
    layout = "2 stages (layers 0..11, 12..23) on devices 0, 1"
    for tp, saved, other in (
        (2, f"{layout}, each a tp group of 2", layout),
        (1, layout, f"{layout}, each a tp group of 2"),
    ):
        r = runs[f"tp{tp}"]
        # bit for bit: the same weights (the LM head's final norm too, saved by the head's
        # rank) and optimizer state, then the same operations
        assert r["resumed"] == r["continued"], r
        assert r["other"].endswith(
            f"was saved with {saved}, but this plan runs {other}; resume "
            "with a plan of the checkpoint's partition and placement"
        ), r
