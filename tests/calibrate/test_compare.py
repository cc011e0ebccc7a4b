"""Reading measured traces, and compare: figures, errors, the side-by-side outputs, the CLI."""

from __future__ import annotations

import json
import re

import pytest

from octodsl.calibrate.compare import compare, side_by_side, write_png
from octodsl.calibrate.measured import (
    TraceError,
    check_against,
    parse_trace,
    read_trace,
)
from octodsl.cli import main
from octodsl.sim import SimCosts

from . import synthetic as syn


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("compare")
    plan = syn.plan("zb-h1", 2, 4, tmp)
    profile = syn.write_profile_file(tmp / "cal.profile.json", syn.TRUE)
    table = syn.profile(syn.TRUE).cost_table(profile)
    return tmp, plan, table, profile


def _costs(table, plan):
    return SimCosts.from_table(table, plan), table.calibration.link


def test_steps_periods_and_busy(setup):
    _, plan, table, _ = setup
    trace = parse_trace(syn.measured_trace(plan, steps=4)["traceEvents"])
    assert len(trace.steps) == 4 and len(trace.timed) == 3
    assert [s.period is None for s in trace.steps] == [False, False, False, True]
    c = compare(plan, *_costs(table, plan), trace)
    assert c.iteration.error == pytest.approx(0, abs=1e-9)
    assert all(abs(m.error) < 1e-9 for m in c.metrics()), c.metrics()
    assert c.memory_error == pytest.approx(0, abs=1e-12)
    assert trace.update_times is not None and (trace.update_times > 0).all()


def test_warmup_steps_are_not_timed_and_spread_shows_noise(setup):
    _, plan, _, _ = setup
    exact = syn.measured_trace(plan, steps=6)["traceEvents"]
    trace = parse_trace(exact, warmup=2)
    assert [s.index for s in trace.timed] == [2, 3, 4, 5]
    assert trace.spread == pytest.approx(0, abs=1e-9)
    assert parse_trace(exact, warmup=6).timed == trace.steps[-1:]  # no step after the warm-up
    period = trace.steps[3].period
    trace.steps[3].period = 1.2 * period  # one slow step of the four timed
    assert trace.spread == pytest.approx(0.2)


def test_errors_show_a_slower_machine(setup):
    _, plan, table, _ = setup
    c = compare(
        plan,
        *_costs(table, plan),
        parse_trace(syn.measured_trace(plan, slowdown=1.25)["traceEvents"]),
    )
    assert c.iteration.error == pytest.approx(1 / 1.25 - 1)
    for m in c.busy + c.idle:
        assert m.error == pytest.approx(1 / 1.25 - 1)


def test_two_steps_compare_the_pipeline_only(setup):
    _, plan, table, _ = setup
    trace = parse_trace(syn.measured_trace(plan, steps=2, memory=False)["traceEvents"])
    c = compare(plan, *_costs(table, plan), trace)
    assert c.iteration.simulated == pytest.approx(c.result.pipeline_time)
    assert c.iteration.error == pytest.approx(0, abs=1e-9)
    assert c.peak is None and any("optimizer" in n for n in c.notes)


def test_a_trace_of_another_plan_is_refused(setup, tmp_path):
    _, plan, _, _ = setup
    other = syn.plan("1f1b", 2, 4, tmp_path)
    trace = parse_trace(syn.measured_trace(other)["traceEvents"])
    with pytest.raises(TraceError, match="did not run the plan's ops"):
        check_against(trace, plan)
    with pytest.raises(TraceError, match="devices"):
        check_against(
            parse_trace(syn.measured_trace(syn.plan("1f1b", 4, 8, tmp_path))["traceEvents"]), plan
        )


def test_incomplete_last_step_is_dropped(setup):
    _, plan, _, _ = setup
    events = syn.measured_trace(plan, steps=3)["traceEvents"]
    spans = [
        e
        for e in events
        if e.get("ph") == "X" and e["tid"] == 0 and e["args"]["kind"] != "optimizer"
    ]
    last = max(spans, key=lambda e: e["ts"])
    events.remove(last)
    trace = parse_trace(events)
    check_against(trace, plan)
    assert len(trace.steps) == 2 and any("incomplete" in n for n in trace.notes)


def test_read_trace_errors(tmp_path):
    with pytest.raises(TraceError, match="missing.json: no such trace"):
        read_trace(tmp_path / "missing.json")
    (tmp_path / "bad.json").write_text("{")
    with pytest.raises(TraceError, match="bad.json: not valid JSON: .* at line 1, column 2"):
        read_trace(tmp_path / "bad.json")
    (tmp_path / "empty.json").write_text('{"traceEvents": []}')
    with pytest.raises(TraceError, match="no spans"):
        read_trace(tmp_path / "empty.json")


def test_a_message_not_named_after_its_op_is_refused(setup):
    _, plan, _, _ = setup
    events = syn.measured_trace(plan, memory=False)["traceEvents"]
    sent = next(e for e in events if e.get("ph") == "X" and e["tid"] == 1)
    sent["name"] = "F01:0"
    with pytest.raises(TraceError, match="'F01:0' is not an op"):
        parse_trace(events, path="run.json")


def test_data_parallel_names_pick_copy_zero(setup):
    _, plan, _, _ = setup
    events = syn.measured_trace(plan, memory=False)["traceEvents"]
    copy = []
    for e in events:
        if e.get("ph") == "M" and e["name"] == "process_name":
            e["args"]["name"] = f"device {e['pid']} (dp 0)"
            copy.append({**e, "pid": e["pid"] + 2, "args": {"name": f"device {e['pid']} (dp 1)"}})
        elif e.get("ph") == "X":
            copy.append({**e, "pid": e["pid"] + 2, "dur": e["dur"] * 3})
    trace = parse_trace(events + copy)
    assert trace.devices == 2 and any("copy 0" in n for n in trace.notes)
    check_against(trace, plan)


def test_side_by_side_and_png(setup, tmp_path):
    _, plan, table, _ = setup
    c = compare(plan, *_costs(table, plan), parse_trace(syn.measured_trace(plan)["traceEvents"]))
    trace = side_by_side(c)
    names = {
        e["pid"]: e["args"]["name"]
        for e in trace["traceEvents"]
        if e.get("ph") == "M" and e["name"] == "process_name"
    }
    assert names[0] == "simulated: device 0" and names[1].startswith("measured: device 0")
    assert names[3].startswith("measured: device 1")
    ops = [
        e
        for e in trace["traceEvents"]
        if e.get("ph") == "X" and e["tid"] == 0 and e["args"].get("kind") in ("F", "B", "W")
    ]
    assert len(ops) == 2 * sum(len(s) for s in plan.schedule)
    assert any(e.get("ph") == "C" and e["pid"] == 1 for e in trace["traceEvents"])
    assert trace["otherData"]["iteration_error"] == pytest.approx(0, abs=1e-9)
    pytest.importorskip("matplotlib")
    write_png(c, tmp_path / "c.png")
    assert (tmp_path / "c.png").read_bytes()[:4] == b"\x89PNG"


def test_cli_compare(setup, tmp_path, capsys):
    tmp, plan, _, profile = setup
    from octodsl.gen import render_plan

    plan_path = tmp_path / "plan.octo"
    plan_path.write_text(render_plan(plan))
    trace = syn.write_trace(tmp_path / "run.json", syn.measured_trace(plan, slowdown=1.02))
    assert (
        main(
            ["compare", str(plan_path), "--trace", str(trace), "--profile", str(profile), "--json"]
        )
        == 0
    )
    out = json.loads(capsys.readouterr().out)
    assert out["iteration_error"] == pytest.approx(1 / 1.02 - 1)
    assert out["link"]["latency"] == pytest.approx(syn.TRUE.link.latency)  # the calibrated link
    assert (tmp_path / "run.compare.json").exists()
    assert (
        main(
            [
                "compare",
                str(plan_path),
                "--trace",
                str(trace),
                "--profile",
                str(profile),
                "--no-files",
                "--side-by-side",
                str(tmp_path / "x.json"),
            ]
        )
        == 0
    )
    text = capsys.readouterr().out
    assert "iteration" in text and "peak memory" in text and not (tmp_path / "x.json").exists()
    assert "3 of 4 measured steps timed, 0% apart from fastest to slowest" in text


def test_cli_compare_user_errors(setup, tmp_path, capsys):
    tmp, plan, _, profile = setup
    from octodsl.gen import render_plan

    plan_path = tmp_path / "plan.octo"
    plan_path.write_text(render_plan(plan))
    assert (
        main(
            [
                "compare",
                str(plan_path),
                "--trace",
                str(tmp_path / "none.json"),
                "--profile",
                str(profile),
            ]
        )
        == 2
    )
    assert "none.json: no such trace" in capsys.readouterr().err
    other = syn.write_trace(
        tmp_path / "other.json", syn.measured_trace(syn.plan("1f1b", 2, 4, tmp_path))
    )
    assert main(["compare", str(plan_path), "--trace", str(other), "--profile", str(profile)]) == 2
    assert "did not run the plan's ops" in capsys.readouterr().err


def test_op_kind_figures_sum_every_device(setup):
    _, plan, table, _ = setup
    exact = parse_trace(syn.measured_trace(plan)["traceEvents"])
    c = compare(plan, *_costs(table, plan), exact)
    assert [m.name for m in c.kinds] == ["F ops", "B ops", "W ops"]  # zb-h1 splits B and W
    for m in c.kinds:
        kind = m.name.split()[0]
        assert m.simulated == pytest.approx(
            sum(op.end - op.start for op in c.result.ops() if op.kind == kind)
        )
        assert m.error == pytest.approx(0, abs=1e-9)
    slow = parse_trace(syn.measured_trace(plan, slowdown=1.25)["traceEvents"])
    for m in compare(plan, *_costs(table, plan), slow).kinds:
        assert m.error == pytest.approx(1 / 1.25 - 1)
    assert {m["metric"] for m in c.to_json()["metrics"]} >= {"F ops", "B ops", "W ops"}


def _abstract(plan):
    from dataclasses import replace

    from octodsl.plan import Stage

    return replace(plan, stages=[Stage() for _ in plan.stages])


def test_a_plan_without_layers_is_simulated_with_the_split_that_ran(setup, tmp_path, capsys):
    from octodsl.calibrate.measured import as_ran
    from octodsl.gen import render_plan

    _, plan, table, profile = setup
    ran = [list(st.bounds) for st in plan.stages]
    data = syn.measured_trace(plan)
    data["otherData"]["partition"] = ran
    trace = parse_trace(data["traceEvents"], info=data["otherData"])
    abstract = _abstract(plan)
    assert [st.bounds for st in as_ran(abstract, trace).stages] == [st.bounds for st in plan.stages]
    assert as_ran(plan, trace) is plan
    assert as_ran(abstract, parse_trace(data["traceEvents"])) is abstract  # no split recorded
    with pytest.raises(ValueError, match="as_ran"):
        compare(abstract, *_costs(table, plan), trace)
    # another split than the one the profile's costs would give: the CLI takes the trace's
    moved = [[ran[0][0], ran[0][1] + 1], [ran[1][0] + 1, ran[1][1]]]
    data["otherData"]["partition"] = moved
    shifted = as_ran(abstract, parse_trace(data["traceEvents"], info=data["otherData"]))
    assert [list(st.bounds) for st in shifted.stages] == moved
    path = syn.write_trace(tmp_path / "moved.json", data)
    plan_path = tmp_path / "abstract.octo"
    plan_path.write_text(render_plan(abstract))
    assert (
        main(
            [
                "compare",
                str(plan_path),
                "--trace",
                str(path),
                "--profile",
                str(profile),
                "--json",
                "--no-files",
            ]
        )
        == 0
    )
    out = json.loads(capsys.readouterr().out)
    expect = compare(
        shifted,
        SimCosts.from_table(table, shifted),
        table.calibration.link,
        parse_trace(data["traceEvents"], info=data["otherData"]),
    )
    assert out["iteration_error"] == pytest.approx(expect.iteration.error)
    assert expect.iteration.error != pytest.approx(0, abs=1e-6)  # the split matters here


@pytest.mark.parametrize(
    "partition, message",
    [
        ([[0, 3]], "not [first, last] layers for each of the plan's 2 stages"),
        ([[0, 3], [5, 2]], "not [first, last] layers"),
        ([[0, 3], ["4", 7]], "not [first, last] layers"),
        ([[0, 3], [4, True]], "not [first, last] layers"),
        ("0..3", "not [first, last] layers"),
        ([[0, 3], [4, 1 << 40]], "not [first, last] layers"),
    ],
)
def test_a_bad_recorded_split_is_one_message(setup, partition, message):
    from octodsl.calibrate.measured import as_ran

    _, plan, _, _ = setup
    data = syn.measured_trace(plan)
    data["otherData"]["partition"] = partition
    with pytest.raises(TraceError, match=re.escape(message)):
        as_ran(_abstract(plan), parse_trace(data["traceEvents"], info=data["otherData"]))


def test_a_plan_that_names_other_layers_than_ran_is_refused(setup):
    from octodsl.calibrate.measured import as_ran

    _, plan, _, _ = setup
    data = syn.measured_trace(plan)
    a, b = plan.stages[0].bounds
    data["otherData"]["partition"] = [[a, b + 1], [b + 2, plan.stages[1].bounds[1]]]
    with pytest.raises(
        TraceError, match=f"stage 0 ran layers {a}..{b + 1}, but the plan gives it layers {a}..{b}"
    ):
        as_ran(plan, parse_trace(data["traceEvents"], info=data["otherData"]))
