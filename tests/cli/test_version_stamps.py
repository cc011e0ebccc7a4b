"""What made an output says so: each object of the --json outputs has "octodsl_version", the plans
gen, tune and convert write name the version in their top comment, profiles and calibrations
record it, traces carry it in their metadata. fmt adds nothing to a user's file."""

from __future__ import annotations

import json

import pytest

from octodsl.cli import main
from octodsl.costs.profile import read_profile, write_profile
from octodsl.gen import generate_text
from octodsl.version import FIELD, made_by, version

from ..calibrate import synthetic as syn

TUNE = ["tune", "--model", "nemotron-h-tiny", "-p", "2", "-m", "4", "--budget", "1s"]


def printed_json(capsys, argv):
    assert main(argv) == 0
    return json.loads(capsys.readouterr().out)


def test_json_outputs(tmp_path, capsys):
    listed = printed_json(capsys, ["models", "--json"])
    assert listed and all(m[FIELD] == version() for m in listed)
    shown = printed_json(capsys, ["models", "nemotron-h-tiny", "--json"])
    assert next(iter(shown)) == FIELD and shown[FIELD] == version()  # first: what made it
    plans = []
    for name in ("1f1b", "zb-h1"):
        plans.append(tmp_path / f"{name}.octo")
        plans[-1].write_text(generate_text(name, 2, 4))
    one = printed_json(capsys, ["simulate", str(plans[0]), "--json"])
    assert one[FIELD] == version()
    two = printed_json(capsys, ["simulate", *map(str, plans), "--json"])
    assert [o[FIELD] for o in two] == [version()] * 2
    tuned = printed_json(capsys, TUNE + ["-o", str(tmp_path / "t.octo"), "--json"])
    assert tuned[FIELD] == version()


def test_plans_name_what_wrote_them(tmp_path, capsys):
    text = generate_text("1f1b", 2, 4)
    assert f"# Written by {made_by('gen')}.\n" in text
    assert f"(octodsl {version()})" in text and made_by("gen").startswith("`octodsl gen`")
    out = tmp_path / "t.octo"
    assert main(TUNE + ["-o", str(out)]) == 0
    assert out.read_text().startswith(f"# Tuned by {made_by('tune')} with seed 0: ")
    csv = tmp_path / "p.csv"
    assert main(["convert", str(out), "-o", str(csv)]) == 0
    back = tmp_path / "back.octo"
    assert main(["convert", str(csv), "-o", str(back)]) == 0
    assert f"by {made_by('convert')}." in back.read_text()
    capsys.readouterr()


def test_fmt_adds_nothing(tmp_path):
    path = tmp_path / "mine.octo"
    text = generate_text("1f1b", 2, 4).replace(made_by("gen"), "hand")
    path.write_text(text)
    assert main(["fmt", str(path)]) == 0
    assert path.read_text() == text and "octodsl 0" not in text and version() not in text


def test_traces(tmp_path, capsys):
    plan = tmp_path / "p.octo"
    plan.write_text(generate_text("zb-h1", 2, 4))
    trace = tmp_path / "sim.json"
    assert main(["simulate", str(plan), "--trace", str(trace)]) == 0
    assert json.loads(trace.read_text())["otherData"] == {FIELD: version()}
    capsys.readouterr()
    # compare's side-by-side trace: the version beside what compare records
    syn_plan = syn.plan("zb-h1", 2, 4, tmp_path)
    from octodsl.gen import render_plan

    plan.write_text(render_plan(syn_plan))
    profile = syn.write_profile_file(tmp_path / "cal.profile.json", syn.TRUE)
    measured = syn.write_trace(tmp_path / "run.json", syn.measured_trace(syn_plan))
    out = printed_json(
        capsys,
        ["compare", str(plan), "--trace", str(measured), "--profile", str(profile), "--json"],
    )
    assert out[FIELD] == version()
    other = json.loads((tmp_path / "run.compare.json").read_text())["otherData"]
    assert other[FIELD] == version() and other["octodsl"] == "compare"


def test_profiles_record_and_read_it(tmp_path):
    from octodsl.costs.profiler import profile_model
    from octodsl.models import load_model

    spec = load_model("nemotron-h-tiny").with_shape(1, 16)
    measured = profile_model(spec, threads=1, warmup=0, repeats=1)
    assert measured.octodsl_version == version()
    path = tmp_path / "p.json"
    write_profile(measured, path)
    assert json.loads(path.read_text())[FIELD] == version()
    assert read_profile(path).octodsl_version == version()  # kept on reading
    # a profile and a calibration from before octodsl recorded it still read
    old = json.loads(syn.profile(syn.TRUE).model_dump_json())
    del old[FIELD], old["calibration"][FIELD]
    path.write_text(json.dumps(old))
    back = read_profile(path)
    assert back.octodsl_version is None and back.calibration.octodsl_version is None
    old[FIELD] = "x" * 101  # bounded like every other field
    path.write_text(json.dumps(old))
    with pytest.raises(Exception, match="octodsl_version"):
        read_profile(path)


def test_calibrations_record_it(tmp_path):
    from octodsl.calibrate.fit import Run, fit
    from octodsl.calibrate.measured import parse_trace

    runs = []
    for p, m in ((2, 4), (4, 8)):
        plan = syn.plan("1f1b", p, m, tmp_path)
        runs.append(Run(plan, parse_trace(syn.measured_trace(plan)["traceEvents"])))
    cal = fit(syn.profile().cost_table("<syn>"), runs, probe=syn.probe(), source="test")
    assert cal.octodsl_version == version()
