"""`octodsl tune --gpus N --global-batch B`: the plans it writes lint clean and are the rows
they rank; the JSON figures agree with each other; hostile input is one line on standard error
and exit 2 (1 when no configuration fits), never a traceback."""

from __future__ import annotations

import json
import re

import pytest

from octodsl.cli import main
from octodsl.lang import parse_plan
from octodsl.lint import lint_source
from octodsl.tune.cluster.space import (
    Cluster,
    Tables,
    configurations,
    fewest_gpus,
    tp_degrees,
)

MODEL = "nemotron-h-tiny"
ARGS = ["tune", "--model", MODEL, "--gpus", "8", "--global-batch", "8"]
# A stop by count, not by the clock: what is tuned does not depend on the machine's load (the
# budget is only a backstop; the search of this space ends by itself within it).
SEARCH = ["--budget", "10m", "--evaluations", "100"]


def test_top_two_plans_lint_clean_and_are_their_rows(tmp_path, capsys):
    out = tmp_path / "best.octo"
    assert main(ARGS + [*SEARCH, "--top", "2", "--json", "-o", str(out)]) == 0
    data = json.loads(capsys.readouterr().out)
    second = tmp_path / "best-2.octo"
    assert data["plans"] == [str(out), str(second)]
    rows = data["configurations"]
    for path, row in zip((out, second), rows[:2], strict=True):
        assert main(["lint", str(path)]) == 0
        h = lint_source(path.read_text(), str(path))[0].header
        assert (h.tp, h.devices, h.dp, h.microbatch_size, h.microbatches, h.zero) == tuple(
            row[k] for k in ("tp", "pp", "dp", "microbatch_size", "microbatches", "zero")
        )
        assert h.model == MODEL and h.tp * h.devices * h.dp == 8
        assert h.dp * h.microbatch_size * h.microbatches == 8
    capsys.readouterr()

    assert data["best"] == rows[0]
    times = [r["iteration_time"] for r in rows]
    assert times == sorted(times)
    for r in rows:
        assert r["tokens_per_gpu_per_s"] == pytest.approx(
            data["tokens_per_iteration"] / (r["iteration_time"] * 8)
        )
        assert r["peak_memory"] <= data["memory_limit"]
    best = data["best"]["tokens_per_gpu_per_s"]
    assert set(data["baselines"]) == {
        "Megatron-style, equal layers",
        "Megatron-style, time-balanced",
        "best classic schedule, same configuration",
        "configuration search, classic only",
    }
    for what, b in data["baselines"].items():
        assert b is not None, what
        assert b["speedup"] == pytest.approx(best / b["tokens_per_gpu_per_s"])
        assert b["speedup"] >= 1 - 1e-9, f"the best plan is slower than {what}"
    cluster = Cluster(MODEL, 8, 8)
    space = list(configurations(cluster, tp_degrees(cluster)[0]))
    assert sum(data["counts"].values()) == len(space) and data["counts"]["tuned"] >= 1
    assert data["search"]["interrupted"] is False and data["search"]["seconds"] > 0


def test_a_budget_too_short_to_tune_writes_the_best_classic_plan(tmp_path, capsys):
    out = tmp_path / "t.octo"
    assert main(ARGS + ["--budget", "0.001s", "-o", str(out)]) == 0
    text = " ".join(capsys.readouterr().out.split())  # as rich wraps it
    assert "the budget ran out before any configuration was tuned" in text
    assert main(["lint", str(out)]) == 0


def one_line_error(capsys) -> str:
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "Traceback" not in err and "internal error" not in err, err
    assert err.startswith("octodsl: error: "), err
    return err


@pytest.mark.parametrize(
    "args,message",
    [
        (["--gpus", "0"], "--gpus: must be at least 1"),
        (["--gpus", str(10**9)], "--gpus: must be at most"),
        (["--global-batch", "0"], "--global-batch: must be at least 1"),
        (["--global-batch", "eight"], "--global-batch: 'eight' is not a whole number"),
        (["--top", "0"], "--top: must be at least 1"),
        (["--top", "101"], "--top: must be at most 100"),
        (["--dp", "2"], "--dp (the GPU count sets it) is not taken"),
        (
            ["--microbatches", "4"],
            "--microbatches (the global batch and the micro-batch size set it)",
        ),
        (["--from", "x.octo"], "--from is not taken"),
        (["--compare", "random"], "--compare is not taken"),
        (["--jobs", "2"], "--jobs (it tunes one configuration at a time) is not taken"),
        (
            ["--overlap", "grad-reduce", "--target", "deepspeed"],
            "runtime deepspeed with overlap_grad_reduce true",
        ),
        (
            ["--overlap", "tp-comm", "--sequence-parallel", "false"],
            "--overlap tp-comm without sequence parallelism",
        ),
    ],
)
def test_hostile_options(tmp_path, capsys, args, message):
    assert main(ARGS + args + ["-o", str(tmp_path / "t.octo")]) == 2
    assert message in one_line_error(capsys)


@pytest.mark.parametrize(
    "args,message",
    [
        (["--model", MODEL, "--gpus", "8"], "needs both --gpus and --global-batch"),
        (["--model", MODEL, "--global-batch", "8"], "needs both --gpus and --global-batch"),
        (
            ["--model", MODEL, "-p", "4", "-m", "8", "--top", "2"],
            "--top writes the best configurations",
        ),
        (["--model", "no-such-model", "--gpus", "8", "--global-batch", "8"], "no-such-model"),
        (["--gpus", "8", "--global-batch", "8"], "--model is required"),
    ],
)
def test_options_that_do_not_go_together(tmp_path, capsys, args, message):
    assert main(["tune", *args, "-o", str(tmp_path / "t.octo")]) == 2
    assert message in one_line_error(capsys)


def test_an_unwritable_output_is_refused_before_the_search(tmp_path, capsys):
    (tmp_path / "file").write_text("")
    assert main(ARGS + ["--budget", "60s", "-o", str(tmp_path / "file" / "t.octo")]) == 2
    assert "cannot write" in one_line_error(capsys)
    assert main(ARGS + ["--budget", "60s", "-o", str(tmp_path)]) == 2
    assert "is a folder" in one_line_error(capsys)


def test_too_few_gpus_for_the_model_names_the_fewest_that_could(tmp_path, capsys):
    out = tmp_path / "t.octo"
    assert (
        main(
            [
                "tune",
                "--model",
                MODEL,
                "--gpus",
                "1",
                "--global-batch",
                "8",
                "--memory",
                "40MiB",
                "-o",
                str(out),
            ]
        )
        == 1
    )
    err = one_line_error(capsys)
    cluster = Cluster(MODEL, 1, 8, memory=40 * 2**20)
    more = fewest_gpus(cluster, Tables(cluster), above=1)
    assert more is not None
    assert re.search(rf"the fewest GPUs above 1 that could is {more.gpus}\b", err)
    assert not out.exists()


def test_a_global_batch_no_configuration_divides(tmp_path, capsys):
    assert (
        main(
            [
                "tune",
                "--model",
                MODEL,
                "--gpus",
                "97",
                "--global-batch",
                "96",
                "-o",
                str(tmp_path / "t.octo"),
            ]
        )
        == 1
    )
    err = one_line_error(capsys)
    assert "must divide the global batch" in err and "a multiple of 97" in err


def test_the_runtime_options_go_into_every_plan(tmp_path):
    """--overlap and the like were dropped by the whole-cluster search once: every plan it
    writes takes them, and the runtime they imply (Megatron-LM's for a dp overlap)."""
    out = tmp_path / "best.octo"
    args = ["--overlap", "grad-reduce,param-gather,p2p-comm", "--zero", "1", "--top", "2"]
    assert main(ARGS + [*SEARCH, *args, "-o", str(out)]) == 0
    for path in (out, tmp_path / "best-2.octo"):
        h = parse_plan(path.read_text(), path=str(path)).header
        assert h.overlap_grad_reduce and h.overlap_param_gather and h.overlap_p2p_comm
        assert h.runtime == "megatron"
        assert main(["lint", str(path)]) == 0


def test_searches_reach_the_tuner_of_every_configuration(tmp_path, capsys, monkeypatch):
    from octodsl.tune.cluster import search as cluster_search

    asked = []
    real = cluster_search.tune

    def spy(*args, **kwargs):
        asked.append(kwargs["restarts"])
        return real(*args, **kwargs)

    monkeypatch.setattr(cluster_search, "tune", spy)
    out = tmp_path / "best.octo"
    assert main(ARGS + [*SEARCH, "--searches", "2", "--json", "-o", str(out)]) == 0
    capsys.readouterr()
    assert asked and set(asked) == {2}
