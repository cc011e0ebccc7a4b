"""`octodsl calibrate --trace ... --plan ...` (no launch) and the calibrated profile's use."""

from __future__ import annotations

import json

import pytest

from octodsl.cli import main
from octodsl.costs.profile import read_profile
from octodsl.gen import render_plan

from . import synthetic as syn

CASES = [("1f1b", 2, 4), ("zb-h1", 2, 4), ("zb-v", 2, 4), ("1f1b", 4, 8)]


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("cli")
    base = syn.write_profile_file(tmp / "base.profile.json")
    args = []
    for sched, p, m in CASES:
        plan = syn.plan(sched, p, m, tmp)
        plan_path = tmp / f"{sched}-{p}.octo"
        plan_path.write_text(render_plan(plan))
        trace = syn.write_trace(tmp / f"{sched}-{p}.trace.json", syn.measured_trace(plan))
        args += ["--trace", str(trace), "--plan", str(plan_path)]
    return tmp, base, args


def test_calibrate_from_traces(files, capsys):
    tmp, base, args = files
    out = tmp / "calibrated.json"
    assert main(["calibrate", "--profile", str(base), "-o", str(out), *args]) == 0
    text = capsys.readouterr().out
    assert "calibration runs" in text and "wrote" in text
    assert "nemotron-h-tiny at micro-batch size 2, sequence length" in text
    prof = read_profile(out)
    cal = prof.calibration
    assert cal is not None and cal.source.startswith("traces ")
    assert cal.cores == 2.0 and cal.op_scale["B"] == pytest.approx(syn.TRUE.op_scale["B"], rel=1e-3)
    assert prof.layers == read_profile(base).layers  # the layer costs are untouched
    # simulate takes the calibrated profile, with its link by default
    plan_path = tmp / "zb-h1-2.octo"
    assert main(["simulate", str(plan_path), "--profile", str(out), "--json"]) == 0
    sim = json.loads(capsys.readouterr().out)
    assert sim["link"] == "calibrated"
    measured = json.loads((tmp / "zb-h1-2.trace.json").read_text())
    from octodsl.calibrate.measured import parse_trace

    assert sim["iteration_time"] == pytest.approx(
        parse_trace(measured["traceEvents"]).iteration_time, rel=1e-3
    )


def test_recalibrating_a_calibrated_profile_starts_from_its_layers(files, capsys):
    tmp, _, args = files
    first = tmp / "first.json"
    syn.write_profile_file(first, syn.TRUE.model_copy(update={"op_scale": {"F": 5.0}}))
    out = tmp / "again.json"
    assert main(["calibrate", "--profile", str(first), "-o", str(out), "--json", *args]) == 0
    cal = json.loads(capsys.readouterr().out)
    spec = syn.profile().model
    assert (cal["model"], cal["microbatch_size"], cal["seq_len"]) == (
        spec.name,
        spec.microbatch_size,
        spec.seq_len,
    )
    assert cal["op_scale"]["F"] == pytest.approx(syn.TRUE.op_scale["F"], rel=1e-3)


@pytest.mark.parametrize(
    "argv,message",
    [
        (["--trace", "t.json"], "one --plan per --trace"),
        (["--ranks", "1"], "at least 2 processes"),
        (["--ranks", "two"], "--ranks: 'two' is not a whole number"),
        (["--ranks", ","], "--ranks: cannot read ','"),
        (["--ranks", "2,5000"], "--ranks: must be at most 4,096"),
        (["--steps", "3"], "at least --warmup + 2"),
        (["--steps", "100000"], "--steps: must be at most 1,000"),
        (["--warmup", "-1"], "--warmup: must be at least 0"),
        (["--microbatch-size", "0"], "--microbatch-size: must be at least 1"),
    ],
)
def test_user_errors(files, capsys, argv, message):
    tmp, base, _ = files
    assert main(["calibrate", "--profile", str(base), "-o", str(tmp / "x.json"), *argv]) == 2
    assert message in capsys.readouterr().err


def test_needs_a_model_or_profile(capsys, tmp_path):
    assert main(["calibrate", "-o", str(tmp_path / "x.json")]) == 2
    assert "--model" in capsys.readouterr().err


def test_wrong_model_for_the_profile(files, capsys):
    tmp, base, args = files
    assert (
        main(
            [
                "calibrate",
                "--model",
                "jamba-tiny",
                "--profile",
                str(base),
                "-o",
                str(tmp / "x.json"),
                *args,
            ]
        )
        == 2
    )
    assert "not jamba-tiny" in capsys.readouterr().err
