"""The fit recovers known parameters from synthetic traces (synthetic.py)."""

from __future__ import annotations

import pytest

from octodsl.calibrate.fit import Run, fit, fit_link, fit_memory
from octodsl.calibrate.measured import parse_trace
from octodsl.errors import OctoError

from . import synthetic as syn

CASES = [
    ("1f1b", 2, 4),
    ("zb-h1", 2, 4),
    ("zb-v", 2, 4),
    ("1f1b", 4, 8),
    ("zb-h1", 4, 8),
    ("zb-v", 4, 8),
]


def _runs(tmp_path, cases=CASES, truth=syn.TRUE, **kw):
    runs = []
    for sched, p, m in cases:
        plan = syn.plan(sched, p, m, tmp_path)
        runs.append(Run(plan, parse_trace(syn.measured_trace(plan, truth, **kw)["traceEvents"])))
    return runs


def run_errors(cal, cases=CASES) -> list[float]:
    """How far the calibration's simulation of each of its runs is off, one per case (a fit
    that reported no runs would otherwise pass every bound on them)."""
    reported = cal.fit["runs"]
    assert [(r["devices"], r["microbatches"]) for r in reported] == [(p, m) for _, p, m in cases]
    return [abs(r["error"]) for r in reported]


@pytest.fixture(scope="module")
def exact(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("fit")
    return fit(syn.profile().cost_table("<syn>"), _runs(tmp), probe=syn.probe(), source="test")


def test_recovers_every_parameter(exact):
    t = syn.TRUE
    assert exact.cores == t.cores and exact.contention == pytest.approx(t.contention)
    for k in ("F", "B", "W", "BW"):
        assert exact.op_scale[k] == pytest.approx(t.op_scale[k], rel=1e-3)
        assert exact.op_overhead[k] == pytest.approx(t.op_overhead[k], abs=5e-5)
    assert exact.link.latency == pytest.approx(t.link.latency, rel=1e-3)
    assert exact.link.bandwidth == pytest.approx(t.link.bandwidth, rel=1e-3)
    assert exact.update_per_param == pytest.approx(t.update_per_param, rel=1e-3)
    assert exact.step_overhead == pytest.approx(t.step_overhead, abs=1e-4)
    for kind, v in t.act_w_extra.items():
        assert exact.act_w_extra[kind] == pytest.approx(v, rel=1e-6)
    assert exact.overlap_slowdown == 0.0
    assert any("not identifiable" in n for n in exact.fit["notes"])


def test_reproduces_its_runs(exact):
    assert max(run_errors(exact)) < 1e-3
    assert exact.fit["timeline"] == 1.0  # exact op costs: the iteration match changes nothing


def test_the_iteration_match_restores_op_costs_that_simulate_short(tmp_path):
    """Step 9 on its own: op costs 5% low against exact traces of the true costs come back by
    the factor on the grid nearest 1 / 0.95 (step 0.005)."""
    from octodsl.calibrate.fit import FitReport
    from octodsl.calibrate.fit.iteration import fit_timeline
    from octodsl.sim import compile

    runs = _runs(tmp_path, CASES[:3])
    low = syn.TRUE.model_copy(
        update={
            "op_scale": {k: 0.95 * v for k, v in syn.TRUE.op_scale.items()},
            "op_overhead": {k: 0.95 * v for k, v in syn.TRUE.op_overhead.items()},
        }
    )
    report = FitReport()
    cal = fit_timeline(
        syn.profile().cost_table("<syn>"), runs, [compile(r.plan) for r in runs], low, report
    )
    assert report.timeline == pytest.approx(1 / 0.95, abs=0.005)
    for k, v in syn.TRUE.op_scale.items():
        assert cal.op_scale[k] == pytest.approx(v, rel=0.005)


def test_contention_without_core_limit(tmp_path):
    truth = syn.TRUE.model_copy(update={"cores": None, "contention": 0.12})
    cal = fit(
        syn.profile().cost_table("<syn>"),
        _runs(tmp_path, CASES[:4], truth),
        probe=syn.probe(),
        cpus=8,
    )
    assert cal.cores is None and cal.contention == pytest.approx(0.12)


def test_more_processes_than_cores_always_share(tmp_path):
    """On a 2-core machine 4 processes cannot each have a core, whatever fits the ops best."""
    truth = syn.TRUE.model_copy(update={"cores": None, "contention": 0.12})
    cal = fit(
        syn.profile().cost_table("<syn>"),
        _runs(tmp_path, CASES[:4], truth),
        probe=syn.probe(),
        cpus=2,
    )
    assert cal.cores is not None and cal.cores <= 2


def test_noisy_traces_still_fit_closely(tmp_path):
    cal = fit(
        syn.profile().cost_table("<syn>"), _runs(tmp_path, noise=0.03, seed=3), probe=syn.probe()
    )
    for k in ("F", "B", "W", "BW"):
        assert cal.op_scale[k] == pytest.approx(syn.TRUE.op_scale[k], rel=0.05)
    assert cal.cores == pytest.approx(2.0, abs=0.15)
    assert max(run_errors(cal)) < 0.05


def test_without_probe_or_optimizer_spans_or_memory(tmp_path):
    """Traces as examples/train.py writes them: ops and messages only."""
    runs = []
    for sched, p, m in CASES[:3]:
        plan = syn.plan(sched, p, m, tmp_path)
        trace = syn.measured_trace(plan, memory=False)
        trace["traceEvents"] = [
            e for e in trace["traceEvents"] if e.get("args", {}).get("kind") != "optimizer"
        ]
        runs.append(Run(plan, parse_trace(trace["traceEvents"])))
    cal = fit(syn.profile().cost_table("<syn>"), runs)
    assert cal.update_per_param == 0 and not cal.act_w_extra
    assert cal.link.bandwidth == pytest.approx(2e9)  # the loopback prior
    assert any("optimizer" in n for n in cal.fit["notes"])
    assert max(run_errors(cal, CASES[:3])) < 0.01  # the optimizer step went into the step overhead


def test_fit_link():
    assert fit_link([]) is None
    lat, bw = fit_link(
        [(1 << 10, 5e-3)] + [(n, 1e-4 + n / 3e9) for n in (1 << 14, 1 << 17, 1 << 20)]
    )
    assert lat == pytest.approx(1e-4) and bw == pytest.approx(3e9)


def test_fit_memory_none_without_counters(tmp_path):
    plan = syn.plan("zb-h1", 2, 4, tmp_path)
    run = Run(plan, parse_trace(syn.measured_trace(plan, memory=False)["traceEvents"]))
    assert fit_memory(syn.profile().cost_table("<syn>"), [run]) is None


def test_refuses_a_calibrated_table(tmp_path):
    with pytest.raises(OctoError, match="without"):
        fit(syn.profile(syn.TRUE).cost_table("<syn>"), _runs(tmp_path, CASES[:1]))


def test_overlap_slowdown_when_messages_cover_compute(tmp_path):
    """Slow messages (30 ms) under the ops: the slowdown is identifiable and found."""
    from octodsl.costs.profile import FittedLink

    truth = syn.TRUE.model_copy(
        update={"link": FittedLink(latency=0.03, bandwidth=2.5e9), "overlap_slowdown": 0.3}
    )
    cal = fit(
        syn.profile().cost_table("<syn>"), _runs(tmp_path, truth=truth), probe=syn.probe(truth)
    )
    assert cal.overlap_slowdown == pytest.approx(0.3, abs=0.08)
    assert cal.cores == 2.0 and cal.contention == pytest.approx(0.05, abs=0.011)
    assert max(run_errors(cal)) < 0.01


def test_oversubscription_from_iteration_times(tmp_path):
    """Four processes on two cores, each slowed a further 20% per process beyond the cores."""
    truth = syn.TRUE.model_copy(update={"oversubscription": 0.2})
    cal = fit(
        syn.profile().cost_table("<syn>"), _runs(tmp_path, truth=truth), probe=syn.probe(truth)
    )
    assert cal.cores == 2.0 and cal.oversubscription == pytest.approx(0.2, abs=0.021)
    assert max(run_errors(cal)) < 0.01


def test_no_oversubscription_fitted_with_a_core_each(exact):
    assert exact.oversubscription == 0.0
