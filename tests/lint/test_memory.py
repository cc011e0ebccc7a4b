"""Lint's memory check (E501): peak memory per device against the plan's limit."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from octodsl.costs.resolve import cost_table
from octodsl.lang import load_plan
from octodsl.lint.memory import CODE, memory_diagnostics
from octodsl.plan import Recompute
from octodsl.sim import SimCosts, memory
from octodsl.sim.program import compile

PLAN = (
    Path(__file__).parents[1] / "sim" / "data" / "nemotron-1f1b.octo"
)  # shared with the CLI tests
GIB = 2**30
LIMIT = 44
"""GiB per device the tests here set: the plan's 40 GiB is below every device's peak at the 18
bytes per parameter DeepSpeed holds at zero 0 (octodsl.costs.param_bytes); at 44 devices 0
and 1 are over, 2 and 3 under."""


def _load():
    plan = load_plan(str(PLAN))
    return dataclasses.replace(plan, header=plan.header.model_copy(update={"memory": LIMIT * GIB}))


def test_reports_each_device_over_the_limit_at_the_memory_line():
    plan = _load()
    diags = memory_diagnostics(plan)
    table = cost_table(model="nemotron-h-8b")
    peaks = memory(compile(plan), SimCosts.from_table(table, plan).stages).peak
    over = [d for d in range(4) if peaks[d] > LIMIT * GIB]
    assert over and len(over) < 4
    assert [d.code for d in diags] == [CODE] * len(over)
    for d, diag in zip(over, diags, strict=True):
        assert diag.is_error
        assert diag.span == load_plan(str(PLAN)).header.spans["memory"]
        assert diag.message.startswith(f"device {d} peaks at {peaks[d] / GIB:.2f} GiB at F{d}:")
        assert (
            f"{(peaks[d] - LIMIT * GIB) / GIB:.2f} GiB over the {LIMIT:.2f} GiB limit"
            in diag.message
        )


def test_first_device_peaks_after_its_warm_up():
    # 1F1B: device 0 holds 4 micro-batches when its warm-up forwards are done.
    plan = load_plan(str(PLAN))
    assert "at F0:3," in memory_diagnostics(plan)[0].message


def test_silent_without_a_limit_a_model_or_an_excess():
    plan = load_plan(str(PLAN))
    for change in ({"memory": None}, {"model": None}, {"memory": 1000 * GIB}):
        header = plan.header.model_copy(update=change)
        assert memory_diagnostics(dataclasses.replace(plan, header=header)) == []


def test_silent_for_an_unknown_model():
    plan = load_plan(str(PLAN))
    header = plan.header.model_copy(update={"model": "no-such-model"})
    assert memory_diagnostics(dataclasses.replace(plan, header=header)) == []


def _with(plan, stages=None, **header):
    return dataclasses.replace(
        plan,
        header=plan.header.model_copy(update=header),
        stages=plan.stages if stages is None else stages,
    )


def test_zero_1_over_8_copies_brings_the_plan_under_its_limit():
    plan = _load()
    assert [d.code for d in memory_diagnostics(plan)] == [CODE, CODE]  # devices 0 and 1
    assert memory_diagnostics(_with(plan, zero=1, dp=8)) == []
    assert len(memory_diagnostics(_with(plan, zero=1, dp=1))) == 2  # nothing to shard over
    # DeepSpeed's BF16 optimizer shards the optimizer state over the copies at zero 0 too;
    # Megatron (a Megatron-only field) shards nothing there
    assert memory_diagnostics(_with(plan, zero=0, dp=8)) == []
    assert len(memory_diagnostics(_with(plan, zero=0, dp=8, grad_accumulation_fusion=True))) == 2


def test_recompute_brings_the_plan_under_its_limit():
    plan = _load()
    full = [dataclasses.replace(s, recompute=Recompute.FULL) for s in plan.stages]
    assert memory_diagnostics(_with(plan, full)) == []
    # Selective drops less: device 0 stays over, now peaking when its first BW brings back
    # what F dropped.
    selective = [dataclasses.replace(s, recompute=Recompute.SELECTIVE) for s in plan.stages]
    diags = memory_diagnostics(_with(plan, selective))
    assert diags and "at BW0:0," in diags[0].message
    # Only the stages that hold the most need it: full on devices 0 and 1.
    two = full[:2] + plan.stages[2:]
    assert memory_diagnostics(_with(plan, two)) == []
