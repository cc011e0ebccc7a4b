"""`octodsl tune`: the written plan, the JSON figures, --from, --explain, user errors."""

from __future__ import annotations

import json

import pytest

from octodsl.cli import main
from octodsl.lint import lint_source

# A stop by count, not by the clock: the tuned plan does not depend on the machine's load (the
# budget is only a backstop).
SEARCH = ["--budget", "10m", "--evaluations", "150"]
ARGS = ["tune", "--model", "nemotron-h-tiny", "-p", "4", "-m", "8", *SEARCH]


def test_json_figures_and_a_clean_plan(tmp_path, capsys):
    out = tmp_path / "t.octo"
    assert main(ARGS + ["-o", str(out), "--json", "--memory", "80GiB"]) == 0
    data = json.loads(capsys.readouterr().out)
    for key in ("plan", "iteration_time", "lower_bound", "efficiency", "peak_memory", "baselines"):
        assert key in data
    assert data["plan"] == str(out) and len(data["peak_memory"]) == 4
    assert max(data["peak_memory"]) <= 80 * 2**30
    assert data["iteration_time"] <= min(t for t in data["baselines"].values() if t)
    assert data["baselines"]["1f1b-equal"] / data["iteration_time"] == pytest.approx(
        data["speedup"]["1f1b-equal"]
    )
    assert data["efficiency"] == pytest.approx(data["lower_bound"] / data["iteration_time"])
    plan, diags = lint_source(out.read_text(), str(out))
    assert not [d for d in diags if d.is_error] and plan.header.memory == 80 * 2**30


def test_table_explain_and_from(tmp_path, capsys):
    start = tmp_path / "zbv.octo"
    assert (
        main(["gen", "zb-v", "-p", "4", "-m", "8", "--model", "nemotron-h-tiny", "-o", str(start)])
        == 0
    )
    out = tmp_path / "t.octo"
    assert main(["tune", "--from", str(start), *SEARCH, "-o", str(out), "--explain"]) == 0
    text = capsys.readouterr().out
    assert "given plan" in text and "tuned" in text and "zb-v-time" in text
    assert "start" in text.split("rounds")[1]


def test_from_keeps_the_plans_shape_memory_and_dp(tmp_path, capsys):
    start = tmp_path / "zbv.octo"
    assert (
        main(["gen", "zb-v", "-p", "4", "-m", "8", "--model", "nemotron-h-tiny", "-o", str(start)])
        == 0
    )
    start.write_text(
        start.read_text().replace(
            "  microbatches 8\n", "  microbatches 8\n  dp 2\n  seq_len 128\n  memory 40GB\n"
        )
    )
    out = tmp_path / "t.octo"
    assert main(["tune", "--from", str(start), *SEARCH, "-o", str(out)]) == 0
    h = lint_source(out.read_text(), str(out))[0].header
    assert (h.dp, h.seq_len, h.memory) == (2, 128, 40 * 10**9)
    assert "memory 40GB" in out.read_text()


@pytest.mark.parametrize(
    "args,message",
    [
        (["tune", "-p", "4", "-m", "8"], "--model is required"),
        (ARGS + ["--budget", "soon"], "--budget"),
        (ARGS + ["--evaluations", "0"], "--evaluations: must be at least 1"),
        (ARGS + ["--evaluations", "many"], "--evaluations: 'many' is not a whole number"),
        (ARGS + ["--evaluations", "10000000000"], "--evaluations: must be at most"),
        (ARGS + ["--searches", "0"], "--searches: must be at least 1"),
        (ARGS + ["--searches", "-2"], "--searches: must be at least 1"),
        (ARGS + ["--searches", "1001"], "--searches: must be at most 1,000"),
        (ARGS + ["--searches", "2.5"], "--searches: '2.5' is not a whole number"),
        (ARGS + ["--jobs", "0"], "--jobs: must be at least 1"),
        (ARGS + ["--jobs", "257"], "--jobs: must be at most 256"),
        (ARGS + ["--jobs", "two"], "--jobs: 'two' is not a whole number"),
        (
            ARGS + ["--jobs", "2"],  # ARGS stop at --evaluations
            "--evaluations stops at a count of one process's plans: give it with --jobs 1",
        ),
        (ARGS + ["--compare", "annealing"], "--compare: unknown annealing"),
        (["tune", "--model", "no-such-model", "-p", "2", "-m", "2"], "no-such-model"),
        (ARGS + ["--zero", "3"], "--zero: must be at most 2"),
        (ARGS + ["--zero", "-1"], "--zero: must be at least 0"),
        (ARGS + ["--dp", "0"], "--dp: must be at least 1"),
        (ARGS + ["--dp", "-4"], "--dp: must be at least 1"),
        (ARGS + ["--dp", "eight"], "--dp: 'eight' is not a whole number"),
        (ARGS + ["--dp", "10000000"], "--dp: must be at most"),
        (
            ARGS + ["--zero", "1"],
            "--zero 1 with dp 1: there is only one copy of the pipeline, no other to shard the optimizer state over: give --dp 2 or more, or --zero 0",
        ),
        (
            ARGS + ["--recompute", "some"],
            "--recompute: 'some' is not a recompute choice (choose "
            "from auto, none, full, selective)",
        ),
        (ARGS + ["--keep", "partition"], "--keep needs a --from plan"),
        (
            ARGS + ["--keep", "placement"],
            "--keep: a placement is of the plan's stages: keep the partition too",
        ),
        (ARGS + ["--keep", "cuts"], "--keep: 'cuts': write partition or partition,placement"),
    ],
)
def test_user_errors(tmp_path, capsys, args, message):
    assert main(args + ["-o", str(tmp_path / "t.octo")]) == 2
    assert message in capsys.readouterr().err


def test_recompute_fits_what_does_not_fit_without(tmp_path, capsys):
    out = tmp_path / "t.octo"  # the 100 MiB case above, with the tuner picking recompute
    assert (
        main(
            [
                "tune",
                "--model",
                "nemotron-h-tiny",
                "-m",
                "8",
                "-p",
                "4",
                *SEARCH,
                "--memory",
                "100MiB",
                "-o",
                str(out),
                "--json",
            ]
        )
        == 0
    )
    data = json.loads(capsys.readouterr().out)
    assert max(data["peak_memory"]) <= 100 * 2**20 and set(data["tuned_recompute"]) != {"none"}


def test_zero_dp_and_recompute_reach_every_plan(tmp_path, capsys):
    out = tmp_path / "t.octo"
    assert (
        main(
            ARGS
            + [
                "-o",
                str(out),
                "--json",
                "--memory",
                "80GiB",
                "--dp",
                "4",
                "--zero",
                "1",
                "--recompute",
                "selective",
            ]
        )
        == 0
    )
    data = json.loads(capsys.readouterr().out)
    assert (data["dp"], data["zero"], data["recompute"]) == (4, 1, "selective")
    assert set(data["tuned_recompute"]) == {"selective"}
    assert set(data["baseline_recompute"].values()) == {"selective"}
    plan, diags = lint_source(out.read_text(), str(out))
    assert not [d for d in diags if d.is_error]
    assert (plan.header.dp, plan.header.zero) == (4, 1)
    assert [m.value for m in plan.recompute()] == data["tuned_recompute"]


@pytest.mark.parametrize("keep", ["partition", "partition,placement"])
def test_keep_keeps_the_cuts_and_the_placement(tmp_path, capsys, keep):
    start = tmp_path / "zbv.octo"
    assert (
        main(["gen", "zb-v", "-p", "4", "-m", "8", "--model", "nemotron-h-tiny", "-o", str(start)])
        == 0
    )
    out = tmp_path / "t.octo"
    assert (
        main(["tune", "--from", str(start), *SEARCH, "-o", str(out), "--keep", keep, "--explain"])
        == 0
    )
    given = lint_source(start.read_text(), str(start))[0]
    tuned = lint_source(out.read_text(), str(out))[0]
    assert [s.bounds for s in tuned.stages] == [s.bounds for s in given.stages]
    if keep == "partition,placement":
        assert tuned.stage_device() == given.stage_device()
    rounds = capsys.readouterr().out.split("rounds")[1]
    assert "relieve" not in rounds and "rebalance" not in rounds


def test_an_abstract_start_plan_is_refused(tmp_path, capsys):
    start = tmp_path / "abstract.octo"
    assert main(["gen", "1f1b", "-p", "2", "-m", "2", "-o", str(start)]) == 0
    assert (
        main(
            [
                "tune",
                "--from",
                str(start),
                "--model",
                "nemotron-h-tiny",
                "-o",
                str(tmp_path / "t.octo"),
            ]
        )
        == 2
    )
    assert "names no layers" in capsys.readouterr().err


# nemotron-h-tiny on 4 devices: 60.1 MiB of static bytes per device and 38.6 MiB of one
# micro-batch's activations; its LM head holds 49.0 MiB with one micro-batch.
@pytest.mark.parametrize(
    "args,message",
    [
        (
            ["-p", "4", "--memory", "65MiB", "--recompute", "none"],
            # no ZeRO: an fp32 model keeps at least 8 of its 16 bytes per parameter at any dp
            # (DeepSpeed's zero 1: 4 + 4 + 12/dp; Megatron's zero 2: 8 + 8/dp)
            "take 60.1 MiB per device (zero 0, dp 1) and one micro-batch's activations 38.6 MiB "
            "more; use recompute (`--recompute auto`), tensor parallelism (`--tp 2` splits every "
            "layer over 2 GPUs), at least 7 devices",
        ),
        (
            ["-p", "16", "--memory", "45MiB"],
            "layer 23 (lm_head_loss) alone holds 49.0 MiB with one "
            "micro-batch's activations (zero 0, dp 1); use ZeRO",
        ),
        (
            ["-p", "4", "--memory", "100MiB", "--recompute", "none"],
            "no plan found fits in 100.0 MiB per device (zero 0, dp 1, recompute none)",
        ),
    ],
)
def test_no_plan_fits_exits_1_and_says_why(tmp_path, capsys, args, message):
    assert (
        main(
            [
                "tune",
                "--model",
                "nemotron-h-tiny",
                "-m",
                "8",
                *SEARCH,
                *args,
                "-o",
                str(tmp_path / "t.octo"),
            ]
        )
        == 1
    )
    assert message in capsys.readouterr().err
    assert not (tmp_path / "t.octo").exists()


def _press_ctrl_c_at(monkeypatch, calls: int) -> None:
    """Ctrl-C when the tuner is about to simulate its `calls`-th plan (of the search: the
    warm-up's are left out, tests/tune/test_warm.py runs it)."""
    from octodsl.tune import warm
    from octodsl.tune.pipeline import loop

    monkeypatch.setattr(warm, "_warm", True)

    score, seen = loop._Search.score, []

    def interrupted(self, *args):
        seen.append(1)
        if len(seen) == calls:
            raise KeyboardInterrupt
        return score(self, *args)

    monkeypatch.setattr(loop._Search, "score", interrupted)


def test_ctrl_c_writes_the_best_plan_so_far(tmp_path, capsys, monkeypatch):
    _press_ctrl_c_at(monkeypatch, 25)
    out = tmp_path / "t.octo"
    assert main(ARGS + ["-o", str(out), "--json", "--compare", "random"]) == 130
    data = json.loads(capsys.readouterr().out)
    assert data["tuner"]["interrupted"] and data["tuner"]["evaluations"] == 24
    assert "random" not in data["baselines"]  # the other searches are not started
    plan, diags = lint_source(out.read_text(), str(out))
    assert not [d for d in diags if d.is_error]


def test_ctrl_c_before_the_first_plan_writes_nothing(tmp_path, capsys, monkeypatch):
    _press_ctrl_c_at(monkeypatch, 1)
    out = tmp_path / "t.octo"
    assert main(ARGS + ["-o", str(out)]) == 130
    assert "interrupted" in capsys.readouterr().err and not out.exists()


def test_evaluations_stop_the_tuner_by_count(tmp_path, capsys):
    # Stopped by count, not by its generous budget, twice alike: the same plan, written the
    # same, whatever the machine's speed.
    runs = []
    for name in ("a.octo", "b.octo"):
        out = tmp_path / name
        assert (
            main(
                [
                    "tune",
                    "--model",
                    "nemotron-h-tiny",
                    "-p",
                    "4",
                    "-m",
                    "8",
                    "--budget",
                    "10m",
                    "--evaluations",
                    "25",
                    "--json",
                    "-o",
                    str(out),
                ]
            )
            == 0
        )
        tuner = json.loads(capsys.readouterr().out)["tuner"]
        assert tuner["evaluations"] == 25 and not tuner["finished"]
        runs.append(out.read_text())
    assert runs[0] == runs[1]
    assert (
        main(
            [
                "tune",
                "--model",
                "nemotron-h-tiny",
                "-p",
                "4",
                "-m",
                "8",
                "--budget",
                "10m",
                "--evaluations",
                "25",
                "-o",
                str(tmp_path / "c.octo"),
            ]
        )
        == 0
    )
    assert "(stopped after 25 plans)" in capsys.readouterr().out


def test_searches_bound_how_many_run_and_their_spread_is_shown(tmp_path, capsys):
    # Without --evaluations the searches end by themselves (a generous budget): --searches
    # alone decides how many run, and each one's best plan is in the JSON.
    base = ["tune", "--model", "nemotron-h-tiny", "-p", "4", "-m", "8", "--budget", "10m"]
    out = tmp_path / "t.octo"
    assert main(base + ["--searches", "3", "--json", "-o", str(out)]) == 0
    data = json.loads(capsys.readouterr().out)
    searches = data["tuner"]["searches"]
    assert data["tuner"]["finished"] and len(searches) == 3
    assert data["iteration_time"] <= min(t for t in searches if t is not None)
    assert main(base + ["--searches", "1", "--json", "-o", str(out)]) == 0
    assert len(json.loads(capsys.readouterr().out)["tuner"]["searches"]) == 1
    assert main(base + ["--searches", "3", "-o", str(out)]) == 0
    text = " ".join(capsys.readouterr().out.split())  # the console wraps long lines
    shown = [t for t in searches if t is not None]
    low, high = (f"{t * 1e3:,.1f} ms" for t in (min(shown), max(shown)))
    assert f"3 searches ended between {low} and {high}" in text and "--searches" in text
    assert main(base + ["--searches", "1", "-o", str(out)]) == 0
    assert "searches ended" not in capsys.readouterr().out


def test_the_default_number_of_searches_is_the_tuners(capsys):
    from octodsl.tune.pipeline.loop import RESTARTS

    with pytest.raises(SystemExit) as done:  # argparse ends the process after --help
        main(["tune", "--help"])
    assert done.value.code == 0
    help_text = " ".join(capsys.readouterr().out.split())
    searches = help_text.split("--searches N")[-1].split("--seed")[0]
    assert f"(default {RESTARTS})" in searches  # the help says what the tuner does


def test_the_spread_counts_searches_without_a_fitting_plan_apart():
    from types import SimpleNamespace

    from octodsl.tune.reference.report import searches_spread

    def search(time: float, fits: bool):
        return (SimpleNamespace(time=time, fits=fits), False)

    run = SimpleNamespace(finalists=[search(2.0, True), search(1.0, False), search(2.2, True)])
    text = searches_spread(run)
    assert text.startswith("2 searches ended between 2,000.0 ms and 2,200.0 ms (10.0% apart)")
    assert "and 1 with no plan that fits" in text
    assert searches_spread(SimpleNamespace(finalists=[search(2.0, True)])) == ""


def test_the_table_says_which_bound_binds(tmp_path, capsys):
    # jamba-v0.1 on 4 devices of 80 GiB (benchmarks/tuner_gap.md): its static bytes leave room
    # for under two micro-batches' forwards of the four its fill needs
    args = ["tune", "--model", "jamba-v0.1", "-p", "4", "-m", "8", "--memory", "80GiB"]
    out = tmp_path / "t.octo"
    assert (
        main(
            [*args, "--dp", "8", "--zero", "1", *SEARCH[:2], "--evaluations", "20"]
            + ["-o", str(out)]
        )
        == 0
    )
    title = " ".join(capsys.readouterr().out.split())
    assert "counting the forwards the memory holds before the first backward" in title


def test_a_search_the_budget_stopped_points_to_jobs(tmp_path, capsys, monkeypatch):
    # Six searches of nemotron-h-56b on 16 devices take minutes, not 10 s: the last line says the budget
    # stopped them and, on a machine of several cores, what --jobs would do.
    import os
    from argparse import Namespace

    from octodsl.cli.tune import _more_jobs

    monkeypatch.setattr(os, "cpu_count", lambda: 4)
    args = ["tune", "--model", "nemotron-h-56b", "-p", "16", "-m", "32", "--budget", "10s"]
    assert main(args + ["-o", str(tmp_path / "t.octo")]) == 0
    text = " ".join(capsys.readouterr().out.split())  # the console wraps long lines
    assert "(stopped by the budget; --jobs 4 would run that many searches at once)" in text
    # no hint where --jobs is given, one search is asked for, or there is one core
    assert (
        _more_jobs(Namespace(jobs=None, searches=3))
        == "; --jobs 3 would run that many searches at once"
    )
    assert _more_jobs(Namespace(jobs=2, searches=None)) == ""
    assert _more_jobs(Namespace(jobs=None, searches=1)) == ""
    monkeypatch.setattr(os, "cpu_count", lambda: None)
    assert _more_jobs(Namespace(jobs=None, searches=None)) == ""
