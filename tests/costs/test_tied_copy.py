"""Tied word embeddings in a pipeline: the LM head's device keeps its own copy of them (weights,
gradient and optimizer state) and reduces its gradient over the data-parallel copies, as
DeepSpeed's `TiedLayerSpec` and Megatron-LM do, unless the plan puts the head on the
embedding's device (CostTable.tied_copy)."""

from __future__ import annotations

import dataclasses

import pytest

from octodsl.costs.devices import get_link
from octodsl.costs.resolve import cost_table
from octodsl.gen import generate
from octodsl.sim import simulate
from octodsl.sim.costs import SimCosts
from octodsl.tune.problem import Problem

from ..conftest import spec_file


@pytest.fixture(scope="module")
def specs(tmp_path_factory):
    """nemotron-h-tiny as it is (untied) and tied."""
    return {
        tied: spec_file(
            tmp_path_factory.mktemp("specs") / f"tied-{tied}.yaml",
            "nemotron-h-tiny",
            tie_embeddings=tied,
            name=f"tiny-tied-{tied}",
        )
        for tied in (False, True)
    }


def _plan(specs, name: str, devices: int, microbatches: int):
    """A plan of equal layers per stage: the same stages for the tied and the untied model."""
    return generate(name, devices, microbatches, model=specs[False], partition="equal")


def _costs(spec: str, plan, **header):
    plan = dataclasses.replace(plan, header=plan.header.model_copy(update=header))
    return SimCosts.from_table(cost_table(spec, device="H800"), plan), plan


def _simulated(spec: str, plan):
    costs, plan = _costs(spec, plan)
    return simulate(plan, costs, get_link("nvlink"))


@pytest.mark.parametrize("header", [{}, {"dp": 4, "zero": 1}])
def test_the_head_apart_holds_what_an_untied_head_holds(specs, header):
    plan = _plan(specs, "1f1b", 4, 8)
    tied, _ = _costs(specs[True], plan, **header)
    untied, _ = _costs(specs[False], plan, **header)
    # the copy is the embedding's bytes: an untied head's own weights are the same vocab x hidden
    assert tied.stages[-1].static == pytest.approx(untied.stages[-1].static, rel=1e-12)
    assert tied.grad_bytes[-1] == pytest.approx(untied.grad_bytes[-1], rel=1e-12)
    assert tied.stages[-1].update == pytest.approx(untied.stages[-1].update, rel=1e-12)
    assert tied.stages[0].static == untied.stages[0].static  # the embedding's stage: the same
    # the copy is what tying saves on one device only: the whole model holds it twice
    table = cost_table(specs[True], device="H800")
    assert table.tied_copy(plan) == 3


def test_no_copy_where_the_head_shares_the_embeddings_device(specs):
    plan = _plan(specs, "zb-v", 2, 4)  # the V: device 0 holds the first and the last stage
    assert plan.stage_device()[0] == plan.stage_device()[-1]
    table = cost_table(specs[True], device="H800")
    assert table.tied_copy(plan) is None
    tied, _ = _costs(specs[True], plan)
    untied, _ = _costs(specs[False], plan)
    assert tied.stages[-1].static < untied.stages[-1].static


def test_peak_memory_as_an_untied_model_apart_and_less_on_a_v(specs):
    loop = _plan(specs, "1f1b", 4, 8)
    tied, untied = (_simulated(specs[t], loop) for t in (True, False))
    assert tied.peak_memory.tolist() == pytest.approx(untied.peak_memory.tolist(), rel=1e-12)
    v = _plan(specs, "zb-v", 2, 4)
    tied, untied = (_simulated(specs[t], v) for t in (True, False))
    assert tied.peak_memory[0] < untied.peak_memory[0]  # device 0 holds both ends: one copy


def test_the_tuner_costs_a_placement_by_whether_the_head_is_apart(specs):
    """Problem.sim_costs keeps costs by partition and header: the same four stages placed
    looped (the head apart) and as a V (the head beside the embedding) are costed apart."""
    pr = Problem.create(specs[True], 2, 4, memory=None)
    loop = generate("interleaved", 2, 4, 2, model=specs[True], partition="equal")
    v = dataclasses.replace(
        loop, placement=generate("zb-v", 2, 4, model=specs[True], partition="equal").placement
    )
    assert loop.stage_device() == [0, 1, 0, 1] and v.stage_device() == [0, 1, 1, 0]
    apart, shared = pr.sim_costs(loop), pr.sim_costs(v)
    copy = pr.table.layer_statics(0, 1)[0]
    assert apart.stages[-1].static == pytest.approx(shared.stages[-1].static + copy, rel=1e-12)
