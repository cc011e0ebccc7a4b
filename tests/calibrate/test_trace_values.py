"""A measured trace with times that cannot be (negative, nan, inf, not numbers, a device's
ops overlapping) is refused with a TraceError naming the file and the event, and `calibrate`
writes no profile from it (before: "busy error 4001930%" and a profile fitted on it)."""

from __future__ import annotations

import json
import math

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from octodsl.calibrate.measured import TraceError, parse_trace, read_trace
from octodsl.cli import main
from octodsl.gen import render_plan

from . import synthetic as syn


@pytest.fixture(scope="module")
def good(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("traces")
    plan = syn.plan("1f1b", 2, 4, tmp)
    plan_path = tmp / "1f1b.octo"
    plan_path.write_text(render_plan(plan))
    return tmp, plan_path, syn.measured_trace(plan)


BAD = st.one_of(
    st.sampled_from([math.nan, math.inf, -math.inf, "12", None, [], True]),
    st.floats(max_value=-1e-12, allow_nan=False, allow_infinity=False),
)


# the examples share tmp_path: each writes its one file anew
@settings(suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data(), key=st.sampled_from(["ts", "dur", "bytes"]), value=BAD)
def test_bad_times_are_refused_naming_the_file_and_event(good, tmp_path, data, key, value):
    _, _, trace = good
    events = json.loads(json.dumps(trace["traceEvents"]))
    kinds = {"ts": ("X", "C"), "dur": ("X",), "bytes": ("C",)}[key]
    candidates = [i for i, e in enumerate(events) if e.get("ph") in kinds]
    i = data.draw(st.sampled_from(candidates))
    if key == "bytes":
        events[i]["args"]["bytes"] = value
    else:
        events[i][key] = value
    path = tmp_path / "bad.trace.json"
    path.write_text(json.dumps({"traceEvents": events}))
    with pytest.raises(TraceError, match=rf"^{path}: event {i} \("):
        read_trace(path)


@pytest.mark.parametrize(
    "event, message",
    [
        ("not an event", "event 0 is not a JSON object"),
        ({"ph": "X", "name": "F0:0", "pid": [1], "ts": 0, "dur": 1}, "its pid is not a number"),
        (
            {"ph": "X", "name": "F0:0", "pid": 0, "ts": 0, "dur": 1, "args": "x"},
            "args are not an object",
        ),
        (
            {
                "ph": "X",
                "name": "F0:0",
                "pid": 10**9,
                "tid": 0,
                "ts": 0,
                "dur": 1,
                "args": {"kind": "F", "stage": 0, "mb": 0},
            },
            r"device 1000000000 \(pid 1000000000\) is past octodsl's limit of 4096",
        ),
        (
            {
                "ph": "X",
                "name": "F0:0",
                "pid": 0,
                "tid": 0,
                "ts": 0,
                "dur": 1,
                "args": {"kind": "F", "stage": "x", "mb": 0},
            },
            "span 'F0:0' lacks its stage",
        ),
        (
            {
                "ph": "X",
                "name": "F0:0",
                "pid": 0,
                "tid": 0,
                "ts": 0,
                "dur": 1,
                "args": {"kind": ["F"], "stage": 0, "mb": 0},
            },
            "its kind is not a string",
        ),
        ({"ph": "X", "name": ["F0:0"], "pid": 0, "tid": 0, "ts": 0, "dur": 1}, "its name is not"),
    ],
)
def test_malformed_events(event, message):
    with pytest.raises(TraceError, match=message):
        parse_trace([event], "t.json")


def test_overlapping_ops_of_one_device_are_refused(good):
    _, _, trace = good
    events = json.loads(json.dumps(trace["traceEvents"]))
    ops = [e for e in events if e.get("ph") == "X" and e.get("tid") == 0 and e["pid"] == 0]
    ops[1]["ts"] = ops[0]["ts"]  # two ops of device 0 at once: a trace of two runs, say
    with pytest.raises(TraceError, match="device 0 runs .* at the same time"):
        parse_trace(events, "t.json")


def test_the_clocks_jitter_is_no_overlap(good):
    _, _, trace = good
    events = json.loads(json.dumps(trace["traceEvents"]))
    ops = sorted(
        (e for e in events if e.get("ph") == "X" and e.get("tid") == 0 and e["pid"] == 0),
        key=lambda e: e["ts"],
    )
    ops[0]["dur"] = ops[1]["ts"] - ops[0]["ts"] + 0.1 * ops[1]["dur"]
    parse_trace(events, "t.json")


def test_calibrate_writes_no_profile_from_a_refused_trace(good, tmp_path, capsys):
    tmp, plan_path, trace = good
    events = json.loads(json.dumps(trace["traceEvents"]))
    next(e for e in events if e.get("ph") == "X")["dur"] = -5e6
    bad = tmp_path / "bad.trace.json"
    bad.write_text(json.dumps({"traceEvents": events}))
    base = syn.write_profile_file(tmp_path / "base.profile.json")
    out = tmp_path / "calibrated.json"
    assert (
        main(
            [
                "calibrate",
                "--profile",
                str(base),
                "--trace",
                str(bad),
                "--plan",
                str(plan_path),
                "-o",
                str(out),
            ]
        )
        == 2
    )
    err = capsys.readouterr().err
    assert err.startswith(f"octodsl: error: {bad}: event ")
    assert "dur is -5000000.0, not a finite number of at least 0" in err
    assert not out.exists()


def test_calibrate_refuses_a_plan_of_another_shape(good, tmp_path, capsys):
    tmp, plan_path, trace = good
    other = tmp_path / "other.octo"
    other.write_text(
        plan_path.read_text().replace(
            "  microbatches 4\n", "  microbatches 4\n  microbatch_size 3\n"
        )
    )
    good_trace = tmp_path / "t.trace.json"
    good_trace.write_text(json.dumps(trace))
    base = syn.write_profile_file(tmp_path / "base.profile.json")
    out = tmp_path / "calibrated.json"
    assert (
        main(
            [
                "calibrate",
                "--profile",
                str(base),
                "--trace",
                str(good_trace),
                "--plan",
                str(other),
                "-o",
                str(out),
            ]
        )
        == 2
    )
    err = capsys.readouterr().err
    assert err.startswith(f"octodsl: error: {other}: profile ") and "the plan asks for 3" in err
    assert not out.exists()
