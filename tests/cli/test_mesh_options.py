"""--tp, --sequence-parallel, --gpus-per-node and --inter-node-link on simulate, tune and models:
bounded, refused with one line each, and what they change end to end."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from octodsl import limits
from octodsl.cli import main

MODEL_PLAN = Path(__file__).parents[1] / "sim" / "data" / "nemotron-1f1b.octo"
# Stopped by a count of plans, not the clock: the tuned figures do not depend on the load.
TUNE = [
    "tune",
    "--model",
    "nemotron-h-tiny",
    "-p",
    "2",
    "-m",
    "4",
    "--budget",
    "10m",
    "--evaluations",
    "100",
]


def _json(capsys, *argv):
    assert main([*argv, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


BAD = [
    (["--tp", "0"], "--tp: must be at least 1"),
    (["--tp", str(limits.MAX_TP + 1)], f"--tp: must be at most {limits.MAX_TP:,}"),
    (["--tp", "two"], "--tp: 'two' is not a whole number"),
    (["--gpus-per-node", "0"], "--gpus-per-node: must be at least 1"),
    (["--gpus-per-node", "10**9"], "--gpus-per-node: '10**9' is not a whole number"),
    (["--gpus-per-node", str(limits.MAX_GPUS_PER_NODE + 1)], "--gpus-per-node: must be at most"),
    (["--inter-node-link", "carrier-pigeon"], "--inter-node-link: unknown link 'carrier-pigeon'"),
    (["--sequence-parallel", "sometimes"], "--sequence-parallel: 'sometimes' is not true or false"),
    (["--sequence-parallel", "true"], "sequence parallelism splits the sequence over the tp group"),
]


@pytest.mark.parametrize("command", ["simulate", "tune"])
@pytest.mark.parametrize("argv,message", BAD)
def test_bad_mesh_options_are_one_line(tmp_path, capsys, command, argv, message):
    head = (
        ["simulate", str(MODEL_PLAN)]
        if command == "simulate"
        else TUNE + ["-o", str(tmp_path / "t.octo")]
    )
    assert main(head + argv) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err and len(err.strip().splitlines()) == 1


def test_a_tp_the_model_does_not_split_over_is_refused(tmp_path, capsys):
    assert main(["simulate", str(MODEL_PLAN), "--tp", "3"]) == 2
    assert "nemotron-h-8b does not split over tp 3: mamba2 heads 128" in capsys.readouterr().err
    assert main(TUNE + ["--tp", "4", "-o", str(tmp_path / "t.octo")]) == 2
    assert "mamba2 groups 2: not divisible by tp 4" in capsys.readouterr().err
    assert main(["models", "nemotron-h-8b", "--tp", "3"]) == 2
    assert "does not split over tp 3" in capsys.readouterr().err


def test_simulate_at_tp_splits_the_work_and_reports_the_mesh_and_links(capsys):
    one = _json(capsys, "simulate", str(MODEL_PLAN))
    four = _json(capsys, "simulate", str(MODEL_PLAN), "--tp", "4", "--dp", "2")
    assert (four["tp"], four["sequence_parallel"]) == (4, True)
    assert four["mesh"] == {"tp": 4, "pp": 4, "dp": 2, "world": 32, "nodes": 4, "gpus_per_node": 8}
    # One GPU's share: less compute per stage, but never below a quarter (collectives, norms).
    for a, b in zip(one["stages"], four["stages"], strict=True):
        assert a["F"] / 4 < b["F"] < a["F"]
        assert b["send_bytes"] == pytest.approx(a["send_bytes"] / 4)  # sequence parallel
    links = four["links"]
    assert links["tp"]["link"] == "nvlink" and min(links["tp"]["busy"]) > 0
    # tp 4 x dp 2 fills a node per device: every message leaves its node, on InfiniBand.
    assert links["pipeline_inter_node"]["link"] == "ib-ndr" and not any(
        links["pipeline_intra_node"]["busy"]
    )
    assert links["dp_intra_node"]["total"] > 0 and links["dp_inter_node"]["total"] == 0
    # More GPUs per node keep the pipeline inside them.
    wide = _json(
        capsys,
        "simulate",
        str(MODEL_PLAN),
        "--tp",
        "4",
        "--dp",
        "2",
        "--gpus-per-node",
        "32",
        "--inter-node-link",
        "nvlink",
    )
    assert wide["links"]["pipeline_inter_node"]["total"] == 0 and wide["mesh"]["nodes"] == 1
    off = _json(capsys, "simulate", str(MODEL_PLAN), "--tp", "4", "--sequence-parallel", "false")
    assert off["sequence_parallel"] is False
    assert off["stages"][0]["send_bytes"] == pytest.approx(one["stages"][0]["send_bytes"])


def test_simulate_summary_shows_the_mesh_and_the_links(capsys):
    assert main(["simulate", str(MODEL_PLAN), "--tp", "2", "--dp", "4"]) == 0
    out = capsys.readouterr().out
    assert "TP 2" in out and "tp 2 x pp 4 x dp 4 = 32 GPUs on 4 nodes of 8" in out
    assert "links           tp nvlink" in out and "pipeline ib-ndr" in out
    assert "tokens per GPU per second" in out


def test_a_profile_at_tp_above_1_is_refused(tmp_path, capsys):
    profile = tmp_path / "p.json"
    profile.write_text("{}")
    assert main(["simulate", str(MODEL_PLAN), "--profile", str(profile), "--tp", "2"]) == 2
    err = capsys.readouterr().err
    assert "measured on single GPUs (tp 1)" in err and "Traceback" not in err


def test_models_at_tp(capsys):
    one = _json(capsys, "models", "nemotron-h-8b")
    four = _json(capsys, "models", "nemotron-h-8b", "--tp", "4")
    assert (four["tp"], four["sequence_parallel"], one["tp"]) == (4, True, 1)
    kinds = {k["kind"]: k for k in four["kinds"]}
    base = {k["kind"]: k for k in one["kinds"]}
    assert kinds["mlp"]["static"] == pytest.approx(base["mlp"]["static"] / 4, rel=1e-3)
    assert kinds["mlp"]["tp_f"] > 0 and base["mlp"]["tp_f"] == 0
    assert main(["models", "nemotron-h-8b", "--tp", "4"]) == 0
    out = capsys.readouterr().out
    assert "at tp 4 with sequence parallelism, one GPU's share" in out and "tp comm ms" in out


def test_tune_at_tp_end_to_end(tmp_path, capsys):
    out = tmp_path / "t.octo"
    one = _json(capsys, *TUNE, "-o", str(out))
    two = _json(capsys, *TUNE, "--tp", "2", "-o", str(out))
    assert (two["tp"], two["sequence_parallel"], one["tp"]) == (2, True, 1)
    # The costs are tp 2's: the bound of the problem at tp 2 (for this tiny model above tp 1's:
    # each layer's collectives cost more latency than half its small GEMMs save), half the
    # parameters per GPU; every baseline at tp 2 as well.
    from octodsl.tune.problem import Problem

    assert two["lower_bound"] == pytest.approx(
        Problem.create("nemotron-h-tiny", 2, 4, tp=2).lower_bound()
    )
    assert two["lower_bound"] != pytest.approx(one["lower_bound"])
    assert max(two["peak_memory"]) < max(one["peak_memory"])
    assert two["iteration_time"] <= min(t for t in two["baselines"].values() if t)
    assert two["iteration_time"] >= two["tight_lower_bound"] * (1 - 1e-9)
    # The written plan says its tp, lints clean, and simulates at tp 2 as the tuner did.
    from octodsl.lint import lint_source

    plan, diags = lint_source(out.read_text(), str(out))
    assert plan.header.tp == 2 and not [d for d in diags if d.is_error]
    again = _json(capsys, "simulate", str(out))
    assert again["iteration_time"] == pytest.approx(two["iteration_time"])


def test_tune_from_a_plan_keeps_its_mesh_unless_told(tmp_path, capsys):
    import argparse

    from octodsl.cli.tune import _problem, register  # the problem the command builds

    parser = argparse.ArgumentParser()
    register(parser.add_subparsers())
    args = parser.parse_args(
        [
            "tune",
            "--model",
            "nemotron-h-tiny",
            "-p",
            "2",
            "-m",
            "4",
            "-o",
            str(tmp_path / "t.octo"),
            "--tp",
            "2",
            "--gpus-per-node",
            "4",
            "--inter-node-link",
            "nvlink4",
        ]
    )
    problem = _problem(args, "nemotron-h-tiny", 2, 4, None)
    h = problem.header
    assert (h.tp, h.sp, h.gpus_per_node) == (2, True, 4)
    assert problem.table.meta["tp"] == 2 and problem.inter_link.name == "nvlink4"
    assert problem.link.name == "nvlink"  # H800's node link


def test_lint_s_memory_rule_costs_the_plan_at_its_tp():
    import dataclasses

    from octodsl.lang import load_plan
    from octodsl.lint.memory import memory_diagnostics

    plan = load_plan(str(MODEL_PLAN))

    def at(tp: int):
        return dataclasses.replace(
            plan, header=plan.header.model_copy(update={"tp": tp, "memory": 20 * 2**30})
        )

    # nemotron-h-8b on 4 devices peaks at 37 to 55 GiB per GPU at tp 1; a quarter of each
    # layer (and of each activation, with sequence parallelism) fits in 20 GiB.
    assert len(memory_diagnostics(at(1))) == 4
    assert memory_diagnostics(at(4)) == []
    assert (
        memory_diagnostics(at(3)) == []
    )  # a tp the model does not split over: lint's tp check says so
