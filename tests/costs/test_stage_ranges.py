"""Which layers a plan's stages cost (`CostTable.stage_ranges`, `octodsl.partition.plan_partition`):
the plan's own partition, which must cover the model exactly, or for a plan that names no layers
the split balanced on each layer's F + B + W."""

from __future__ import annotations

import pytest

from octodsl.costs.table import CostTable, LayerCost
from octodsl.gen import generate
from octodsl.partition import balance_time, plan_partition
from octodsl.plan import Plan, PlanError, Stage
from octodsl.sim import SimCosts


def table(work: list[float]) -> CostTable:
    """One layer per entry: F = the work, B = W = 0; 10 parameters per unit of work."""
    return CostTable(
        [LayerCost("mlp", w, 0.0, 0.0, 1.0, 0.5, 0.0, int(10 * w), 8.0) for w in work],
        "test",
        meta={"dtype": "fp32"},
    )


def with_stages(plan: Plan, stages: list[Stage]) -> Plan:
    return Plan(plan.header, stages, plan.placement, plan.schedule)


PLAN = generate("1f1b", devices=2, microbatches=4)


def test_a_named_partition_is_kept():
    plan = with_stages(PLAN, [Stage(0, 2), Stage(3, 5)])
    assert table([1.0] * 6).stage_ranges(plan) == [(0, 2), (3, 5)]


@pytest.mark.parametrize(
    "layers,message",
    [
        (1000, "the plan's partition covers 24 layers (0..23), but the model has 1000 (0..999)"),
        (20, "the plan's partition covers 24 layers (0..23), but the model has 20 (0..19)"),
    ],
)
def test_a_partition_of_another_layer_count_is_refused(layers, message):
    plan = with_stages(PLAN, [Stage(0, 11), Stage(12, 23)])
    with pytest.raises(PlanError) as e:
        table([1.0] * layers).stage_costs(plan)
    assert str(e.value) == message
    with pytest.raises(PlanError):
        SimCosts.from_table(table([1.0] * layers), plan)


def test_a_plan_that_names_no_layers_gets_the_balanced_split():
    work = [3.0, 1.0, 1.0, 1.0, 1.0, 3.0]
    assert table(work).stage_ranges(PLAN) == balance_time(work, 2) == [(0, 2), (3, 5)]
    costs = SimCosts.from_table(table(work), PLAN)
    # sums of the same floats in the same order as the split's layers
    assert [c.f for c in costs.stages] == [5.0, 5.0]
    assert costs.grad_bytes == (50 * 4.0, 50 * 4.0)  # 10 parameters per unit, fp32


def test_an_abstract_plan_needs_costs_and_enough_layers():
    with pytest.raises(PlanError, match="names no layers for its 2 stages; give a model"):
        plan_partition(PLAN, 6)
    with pytest.raises(
        PlanError, match="the plan's 2 stages need at least 2 layers, but the model has 1"
    ):
        table([1.0]).stage_ranges(PLAN)


def test_a_partition_that_mixes_named_and_abstract_stages_is_refused():
    with pytest.raises(PlanError, match="names layers for some stages but not all"):
        table([1.0] * 4).stage_ranges(with_stages(PLAN, [Stage(0, 1), Stage()]))
