"""Issue 27's `tune` points: a fixed choice that rules out every configuration is named; a
sequence tp does not divide is refused before any search; `--sequence-parallel false` is
honoured; `--target` says which runtime the configurations are for; `--budget` bounds the
whole command (checked on its CPU seconds, which another job's load does not stretch)."""

from __future__ import annotations

import json
import resource
import subprocess
import sys

import pytest

from octodsl.cli import main
from octodsl.lint import lint_source
from octodsl.tune.cluster.target import EXECUTOR_ZERO, runtimes

MODEL = "nemotron-h-tiny"
ARGS = ["tune", "--model", MODEL, "--gpus", "8", "--global-batch", "8", "--budget", "2s"]


def one_line_error(capsys) -> str:
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "Traceback" not in err and "internal error" not in err, err
    assert err.startswith("octodsl: error: "), err
    return err


@pytest.mark.parametrize(
    "args,cause,detail",
    [
        (["--tp", "8"], "--tp 8 rules out every one", "mamba2 groups 2: not divisible by tp 8"),
        (["--tp", "3"], "--tp 3 rules out every one", "tp must divide the 8 GPUs per node"),
        (["--devices", "30"], "--devices 30 rules out every one", "pp at most the layer count"),
        (["--microbatch-size", "3"], "--microbatch-size 3 rules out every one", "micro-batch size"),
        (["--devices", "8", "--zero", "1"], "--devices 8 rules out every one", "ZeRO 1 or 2 only"),
        (
            ["--tp", "2", "--seq-len", "1001"],
            "--tp 2 rules out every one",
            "its length 1001 is not a multiple of 2",
        ),
    ],
)
def test_a_fixed_choice_that_rules_out_every_configuration_is_named(
    tmp_path, capsys, args, cause, detail
):
    assert main(ARGS + args + ["-o", str(tmp_path / "t.octo")]) == 1
    err = one_line_error(capsys)
    assert cause in err and detail in err


def test_zero_2_is_refused_for_the_executor_and_admitted_for_megatron(tmp_path, capsys):
    out = tmp_path / "t.octo"
    assert main(ARGS + ["--zero", "2", "-o", str(out)]) == 2
    assert "--zero 2 rules out every configuration of --target deepspeed" in one_line_error(capsys)
    assert main(ARGS + ["--zero", "2", "--target", "megatron", "--json", "-o", str(out)]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["target"] == "megatron"
    assert {r["zero"] for r in data["configurations"]} == {2}
    assert all(r["runtimes"] == ["megatron"] for r in data["configurations"])


def test_by_default_every_configuration_proposed_runs_on_the_executor(tmp_path, capsys):
    assert main(ARGS + ["--top", "3", "--json", "-o", str(tmp_path / "t.octo")]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["configurations"] and data["target"] == "deepspeed"
    for row in data["configurations"]:
        assert row["zero"] <= EXECUTOR_ZERO and "deepspeed" in row["runtimes"]


def test_target_of_a_single_pipeline_search_is_the_plans_runtime(tmp_path):
    """Without --gpus, --target is the runtime written into the tuned plan (its bytes per
    parameter), as gen's and simulate's --target."""
    out = tmp_path / "t.octo"
    args = ["tune", "--model", MODEL, "-p", "2", "-m", "4", "--evaluations", "10", "-o", str(out)]
    assert main([*args, "--target", "megatron"]) == 0
    assert "  runtime megatron\n" in out.read_text()
    assert main(args) == 0
    assert "runtime" not in out.read_text()


def test_the_executor_limit_is_the_executors():
    pytest.importorskip("torch")
    from octodsl.deepspeed_ext.config import PIPELINE_ZERO

    assert EXECUTOR_ZERO == PIPELINE_ZERO
    assert runtimes(PIPELINE_ZERO + 1) == ("megatron",)


def test_a_sequence_tp_does_not_divide_is_refused_in_every_form(tmp_path, capsys):
    out = tmp_path / "t.octo"
    plain = ["tune", "--model", MODEL, "-p", "2", "-m", "4", "--budget", "1s"]
    assert main(plain + ["--tp", "2", "--seq-len", "1001", "-o", str(out)]) == 2
    assert "its length 1001 is not a multiple of 2" in one_line_error(capsys)
    start = tmp_path / "start.octo"
    assert (
        main(
            [
                "gen",
                "1f1b",
                "--model",
                MODEL,
                "-p",
                "2",
                "-m",
                "4",
                "--seq-len",
                "1001",
                "-o",
                str(start),
            ]
        )
        == 0
    )
    capsys.readouterr()
    assert main(["tune", "--from", str(start), "--tp", "2", "-o", str(out)]) == 2
    assert "its length 1001 is not a multiple of 2" in one_line_error(capsys)
    assert not out.exists()
    # searched rather than fixed, such a tp is left out with the reason
    assert main(ARGS + ["--seq-len", "1001", "--json", "-o", str(out)]) == 0
    data = json.loads(capsys.readouterr().out)
    assert "not a multiple of 2" in data["excluded_tp"]["2"]
    assert all(r["tp"] == 1 for r in data["configurations"])


def test_sequence_parallel_false_is_honoured(tmp_path, capsys):
    out = tmp_path / "t.octo"
    assert (
        main(
            ARGS
            + ["--tp", "2", "--seq-len", "1001", "--sequence-parallel", "false", "-o", str(out)]
        )
        == 0
    )
    capsys.readouterr()
    header = lint_source(out.read_text(), str(out))[0].header
    assert header.tp == 2 and header.sp is False
    assert main(ARGS + ["--tp", "1", "--sequence-parallel", "true", "-o", str(out)]) == 2
    assert "give --tp 2 or more" in one_line_error(capsys)


def cpu_seconds(args: list[str], tmp_path) -> float:
    """The command's CPU seconds (user and system, its children's included). The budget is the
    command's wall clock, but another job on this machine stretches wall time by its load and
    made a wall-clock assertion fail under `make test`; work done past the deadline, what the
    test guards against, is CPU work and shows here as well, without the load. Less the compile
    of the tuner's kernels that a machine's first run does before the budget starts (its wall
    seconds as `--json` reports them: at least its CPU seconds, the compile is one thread)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    run = subprocess.run(
        [sys.executable, "-m", "octodsl", *args, "--json", "-o", str(tmp_path / "t.octo")],
        capture_output=True,
        text=True,
        timeout=300,
    )
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    assert run.returncode == 0, run.stderr
    figures = json.loads(run.stdout)
    compiled = figures["tuner" if "tuner" in figures else "search"]["compile_seconds"]
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime) - compiled


BUDGET = 5.0
"""Room for the minimum a command always does (start-up, one plan simulated and checked) on
a loaded machine: before issue 27 they took 9.5 s at --budget 2s and 14.5 s at --budget 3s."""


@pytest.mark.parametrize(
    "args",
    [
        # 12,288 ops per plan: the check of the written plan once took 6 s of 8.5 s at --budget 2s
        ["tune", "--model", "nemotron-h-8b", "-p", "8", "-m", "512"],
        # configurations of tens of thousands of sequences
        ["tune", "--model", MODEL, "--gpus", "2", "--global-batch", "50000"],
    ],
)
def test_the_budget_bounds_the_whole_command(tmp_path, args):
    seconds = cpu_seconds(args + ["--budget", f"{BUDGET}s"], tmp_path)
    assert seconds <= max(1.1 * BUDGET, BUDGET + 1), f"{seconds:.1f} CPU s for --budget {BUDGET}s"


def test_the_cluster_command_does_not_import_the_plan_command():
    # cli/tune.py imports cli/tune_cluster.py; what both take lives in cli/tune_options.py, so
    # the two modules do not import each other (issue 28's cycle).
    import ast

    import octodsl.cli.tune_cluster as cluster_cli

    tree = ast.parse(open(cluster_cli.__file__).read())
    imported = {(n.level, n.module) for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
    assert (1, "tune") not in imported and (1, "tune_options") in imported
