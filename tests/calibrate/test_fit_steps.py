"""Each step of the calibration fit (octodsl/calibrate/fit/) alone, on small hand-made
observations whose answer is known; test_fit.py runs them together on synthetic traces.

Floats are compared exactly only where the step's arithmetic is exact on the numbers given (sums
and products of small binary fractions, a median picking one of its inputs); least-squares
solutions go through an SVD or QR, whose rounding leaves the last digits free, so those compare
to a relative 1e-9."""

from __future__ import annotations

import numpy as np
import pytest

from octodsl.calibrate.fit import FitReport, fit_memory
from octodsl.calibrate.fit.compute import (
    best_sharing,
    fit_kinds,
    fit_overlap,
    grid,
    op_costs,
    weighted_line,
)
from octodsl.calibrate.fit.link import fit_dispatch, fit_link_latency
from octodsl.calibrate.fit.memory import held_for_w
from octodsl.calibrate.fit.observations import OpObs, Run, collect, occupancy, rates
from octodsl.calibrate.fit.step import fit_step_overhead, fit_update
from octodsl.calibrate.measured import MeasuredStep, parse_trace
from octodsl.costs.devices import get_link
from octodsl.costs.profile import FittedLink
from octodsl.sim.sharing import Sharing

from . import synthetic as syn

LSQ = 1e-9
"""Relative tolerance on a least-squares solution of exact data."""


def _op(kind: str, base: float, work: float, shares: list[float], sharing: Sharing) -> OpObs:
    """An op of `kind` that did `work` seconds of work, spending `shares` (proportions, at
    k = 1, 2, ... devices busy) of its span at each concurrency under `sharing`."""
    p = np.array([0.0, *shares])
    hist = p * work / (p @ rates(len(shares), sharing))
    return OpObs(kind, base, float(hist.sum()), hist)


def test_occupancy_counts_the_devices_busy_at_each_moment():
    spans = {0: [(0.0, 4.0)], 1: [(1.0, 3.0)], 2: [(2.0, 5.0)]}
    # device 0 over [0, 4]: alone, then with 1, with 1 and 2, with 2
    assert occupancy(spans, 0, 0.0, 4.0, 3).tolist() == [0.0, 1.0, 2.0, 1.0]
    # more devices than P count as P
    assert occupancy(spans, 0, 0.0, 4.0, 2).tolist() == [0.0, 1.0, 3.0]
    assert occupancy(spans, 1, 3.0, 3.0, 3).tolist() == [0.0] * 4  # an empty interval


def test_rates_are_the_sharing_models():
    r = rates(3, Sharing(2.0, 0.1))
    assert r[0] == 0.0 and r[1] == 1.0
    assert r[2] == pytest.approx(1 / 1.1) and r[3] == pytest.approx(2 / 3 / 1.1)


def test_collect_sees_every_op_and_each_pair_of_consecutive_ops_once(tmp_path):
    plan = syn.plan("zb-h1", 2, 4, tmp_path)
    run = Run(plan, parse_trace(syn.measured_trace(plan, steps=3)["traceEvents"]))
    obs = collect(syn.profile().cost_table("<syn>"), [run], 2)
    timed = run.trace.timed
    assert len(obs.ops) == sum(len(s.ops) for s in timed)
    # between two consecutive ops a device either dispatched or waited for a message
    assert len(obs.gaps) + len(obs.handoffs) == len(obs.ops) - plan.devices * len(timed)
    for o in obs.ops:
        assert o.hist.sum() == pytest.approx(o.span, rel=1e-12)
        assert o.hist[0] == 0.0  # its own device is busy throughout
    # the simulator that made the trace runs a device's ops back to back, and a message lands
    # latency + bytes / bandwidth after its producer ends
    link = syn.TRUE.link
    assert obs.gaps and all(g == pytest.approx(0.0, abs=1e-9) for g, _ in obs.gaps)
    assert obs.handoffs and all(nbytes > 0 for o in obs.ops for _, nbytes in o.sends)
    for t, nbytes in obs.handoffs:
        assert t - nbytes / link.bandwidth == pytest.approx(link.latency, rel=1e-6)


def test_fit_kinds_recovers_scale_and_overhead_from_exact_ops():
    alone = Sharing()
    ops = [_op("F", b, 1.1 * b + 0.003, [1.0], alone) for b in (0.01, 0.02, 0.04)]
    ops += [_op("B", b, 0.9 * b, [1.0], alone) for b in (0.01, 0.03)]
    params, loss = fit_kinds(ops, rates(1, alone))
    assert params["F"] == pytest.approx((1.1, 0.003), rel=LSQ)
    # two ops are too few to tell an overhead from the scale: through the origin
    assert params["B"][0] == pytest.approx(0.9, rel=LSQ) and params["B"][1] == 0.0
    assert set(params) == {"F", "B"} and loss == pytest.approx(0.0, abs=1e-20)


def test_fit_kinds_gives_an_op_slowed_by_other_load_less_weight():
    alone = Sharing()
    bases = np.linspace(0.01, 0.05, 9)
    ops = [_op("W", b, 1.05 * b + 0.001, [1.0], alone) for b in bases]
    ops.append(_op("W", 0.03, 3 * (1.05 * 0.03 + 0.001), [1.0], alone))  # three times as long
    s, o = fit_kinds(ops, rates(1, alone))[0]["W"]
    # without the Huber weights the outlier pulls the fit to x1.093 + 0.60 ms; four rounds of
    # reweighting bring it within 0.5% (scale) and 5% (overhead) of the other ops' line
    assert s == pytest.approx(1.05, rel=0.005) and o == pytest.approx(0.001, rel=0.05)


def test_weighted_line_goes_through_the_origin_rather_than_below_it():
    x = np.array([1.0, 2.0, 3.0])
    y = 2 * x - 0.5  # the best line has a negative overhead
    s, o = weighted_line(x, y, np.ones(3), two=True)
    assert o == 0.0 and s == pytest.approx((x * y).sum() / (x * x).sum(), rel=LSQ)


def test_grid():
    cores, contention = grid(cpus=8, Pmax=2)
    assert cores[0] is None and cores[1:] == [round(1 + 0.05 * i, 2) for i in range(21)]
    assert contention == [round(0.01 * i, 3) for i in range(31)]
    # more processes than cores: some must share, so "a core each" is no candidate
    assert grid(cpus=2, Pmax=4)[0] == [round(1 + 0.05 * i, 2) for i in range(21)]
    assert grid(cpus=4, Pmax=1)[0] == [None]


def test_best_sharing_finds_the_cores_and_contention_the_ops_ran_under():
    true = Sharing(2.0, 0.05)
    rng = np.random.default_rng(0)
    ops = [
        _op(kind, b, scale * b + oh, list(rng.dirichlet([1.0, 1.0, 1.0])), true)
        for kind, scale, oh in (("F", 0.9, 0.002), ("B", 1.1, 0.003))
        for b in (0.01, 0.02, 0.03, 0.05)
    ]
    found = best_sharing(ops, cpus=4, Pmax=3)
    assert (found.sharing.cores, found.sharing.contention) == (2.0, 0.05)
    assert found.params["F"] == pytest.approx((0.9, 0.002), rel=1e-6)
    assert found.params["B"] == pytest.approx((1.1, 0.003), rel=1e-6)


def test_overlap_slowdown_from_ops_with_messages_in_flight():
    """Ops that ran `frac` of their span under a transfer of their device's messages, slowed by
    1 + 0.3 frac: the fraction is read off the sends, the slowdown found on the grid."""
    link = FittedLink(latency=0.0, bandwidth=1e9)
    ops = []
    for kind, scale in (("F", 0.9), ("B", 1.1)):
        for i, b in enumerate((0.01, 0.02, 0.03, 0.04, 0.05)):
            frac = 0.2 * i
            span = (scale * b + 0.002) * (1 + 0.3 * frac)
            # a send that starts at (1 - frac) of the op and outlasts it
            sends = [(span * (1 - frac), 1e9)]
            ops.append(OpObs(kind, b, span, np.array([0.0, span]), end=span, sends=sends))
    report = FitReport()
    compute = fit_overlap(ops, link, best_sharing(ops, 1, 1), 1, 1, report)
    assert [o.comm for o in ops[:5]] == pytest.approx([0.0, 0.2, 0.4, 0.6, 0.8], rel=1e-12)
    assert report.overlap_fraction == pytest.approx(
        sum(o.comm * o.span for o in ops) / sum(o.span for o in ops), rel=1e-12
    )
    assert compute.overlap == pytest.approx(0.3, rel=1e-12)  # a grid point: 15 steps of 0.02
    assert compute.params["F"] == pytest.approx((0.9, 0.002), rel=1e-6)
    # no transfer under any op: not identifiable, said so
    for o in ops:
        o.sends = []
    report = FitReport()
    assert fit_overlap(ops, link, best_sharing(ops, 1, 1), 1, 1, report).overlap == 0.0
    assert any("not identifiable" in n for n in report.notes)


def test_op_costs_fill_the_kinds_no_run_used():
    scale, overhead = op_costs({"F": (1.0, 0.001), "B": (2.0, 0.0)}, dispatch=0.5)
    assert scale == {"F": 1.0, "B": 2.0, "W": 1.5, "BW": 1.5}
    assert overhead == {"F": 0.001 + 0.5, "B": 0.5, "W": 0.5, "BW": 0.5}


def test_dispatch_is_the_median_work_between_ops():
    r = np.array([0.0, 1.0, 0.5])  # half speed while another device computes
    gaps = [
        (0.001, np.array([0.0, 0.001, 0.0])),
        (0.004, np.array([0.0, 0.0, 0.004])),
        (0.008, np.array([0.0, 0.008, 0.0])),
    ]
    report = FitReport()
    assert fit_dispatch(gaps, r, report) == 0.002 == report.dispatch  # 0.004 at half speed
    assert fit_dispatch([], r, FitReport()) == 0.0


def test_link_latency_from_hand_offs_less_the_dispatch():
    latency, bandwidth = 3e-4, 2.5e9
    probe = [(n, latency + n / bandwidth) for n in (1 << 10, 1 << 14, 1 << 17, 1 << 20)]
    gaps = [(0.001, np.zeros(2)), (0.002, np.zeros(2)), (0.003, np.zeros(2))]
    handoffs = [(latency + n / bandwidth + 0.002, n) for n in (1e6, 4e6, 8e6)]
    report = FitReport()
    link = fit_link_latency(probe, gaps, handoffs, report)
    assert link.bandwidth == pytest.approx(bandwidth, rel=LSQ)
    assert link.latency == pytest.approx(latency, rel=1e-6)
    assert report.handoffs == 3 and report.probe_latency == pytest.approx(latency, rel=1e-6)
    # no probe: loopback's bandwidth, the latency still from the hand-offs
    loopback = get_link("loopback")
    handoffs = [(latency + n / loopback.bandwidth + 0.002, n) for n in (1e6, 4e6, 8e6)]
    link = fit_link_latency([], gaps, handoffs, FitReport())
    assert link.bandwidth == loopback.bandwidth and link.latency == pytest.approx(latency)
    # neither: loopback's, said so
    report = FitReport()
    link = fit_link_latency([], gaps, [], report)
    assert (link.latency, link.bandwidth) == (loopback.latency, loopback.bandwidth)
    assert any("loopback" in n for n in report.notes)


def _step(updates, period=None, start=0.0, end=0.0) -> MeasuredStep:
    return MeasuredStep(0, [], [], updates, start=start, end=end, period=period)


def test_update_per_parameter_as_work_shared_by_the_devices_updating_at_once():
    # one core: over [0, 0.5] both devices update at half speed, then device 1 alone
    step = _step({0: (0.0, 0.5), 1: (0.0, 1.25)})
    params = np.array([0.25e8, 1.0e8])  # device 0 works 0.25 s, device 1 1.0 s: 1e-8 s each
    per_param = fit_update([(params, step)], rates(2, Sharing(1.0)), 2, FitReport())
    assert per_param == pytest.approx(1e-8, rel=1e-12)
    report = FitReport()
    assert fit_update([(params, _step({}))], rates(2, Sharing()), 2, report) == 0.0
    assert any("optimizer" in n for n in report.notes)


def test_step_overhead_is_the_median_tail_less_the_update():
    steps = [
        _step({0: (0.8, 0.85), 1: (0.8, 0.9)}, period=1.25, end=1.0),  # 0.25 - 0.1
        _step({}, period=1.25, end=1.0),  # 0.25
        _step({}, period=1.125, end=1.0),  # 0.125
        _step({}, end=2.0),  # the last step: no period
    ]
    assert fit_step_overhead(steps, FitReport()) == pytest.approx(0.15)
    assert fit_step_overhead([_step({}, period=0.5, end=1.0)], FitReport()) == 0.0  # not < 0
    report = FitReport()
    assert fit_step_overhead(steps[-1:], report) == 0.0
    assert any("step overhead" in n for n in report.notes)


def test_held_for_w_by_non_negative_least_squares():
    counts = np.array([[1.0, 0.0, 0.0], [0.0, 1.0, 0.0], [1.0, 1.0, 0.0]])
    # unconstrained, b would be -2/3; at b = 0, a = (2 + 1) / 2
    got = held_for_w(["a", "b", "c"], counts, np.array([2.0, -1.0, 1.0]))
    assert got == {"a": pytest.approx(1.5, rel=LSQ), "b": 0.0}  # c: in no row, left out


def test_held_for_w_keeps_a_kind_that_holds_nothing():
    """A kind whose true extra is exactly 0 (the earlier solver, which let rounding bring such a
    kind back into its active set, cycled to all zeros on these counts)."""
    counts = np.array(
        [[2.0, 3.0, 3.0], [0.0, 0.0, 1.0], [2.0, 0.0, 3.0], [2.0, 1.0, 3.0], [3.0, 2.0, 2.0]]
    )
    extra = counts @ np.array([7.0e6, 13.0e6, 0.0])
    got = held_for_w(["a", "b", "c"], counts, extra)
    assert got["a"] == pytest.approx(7e6, rel=LSQ) and got["b"] == pytest.approx(13e6, rel=LSQ)
    assert got["c"] == pytest.approx(0.0, abs=1e-6)


def test_fit_memory_recovers_the_bytes_held_for_w(tmp_path, monkeypatch):
    # layers whose profiled act_w is below act: what B frees beyond act - act_w is the extra
    for kind, scale in (("mamba2", 0.75), ("mlp", 0.5)):
        f, b, w, act, act_w = syn.KIND_COSTS[kind]
        monkeypatch.setitem(syn.KIND_COSTS, kind, (f, b, w, act, scale * act_w))
    table = syn.profile().cost_table("<syn>")
    runs = []
    for sched, p, m in (("zb-h1", 2, 4), ("zb-v", 2, 4), ("zb-h1", 4, 8), ("zb-v", 4, 8)):
        plan = syn.plan(sched, p, m, tmp_path)
        runs.append(Run(plan, parse_trace(syn.measured_trace(plan, steps=1)["traceEvents"])))
    got = fit_memory(table, runs)
    assert got is not None and set(got) == set(syn.TRUE.act_w_extra)
    for kind, v in syn.TRUE.act_w_extra.items():
        assert got[kind] == pytest.approx(v, rel=1e-6)
