"""Expert parallelism in the executor, without processes: where the ep and expert-data-parallel
groups sit in the mesh, and the launches refused before any communication, each in one line."""

from __future__ import annotations

import copy
import itertools

import pytest

from octodsl.deepspeed_ext import PlanLaunchError, check_launch
from octodsl.deepspeed_ext.checkpoint import describe_layout
from octodsl.deepspeed_ext.mesh import expert_rank_groups
from octodsl.gen import generate
from octodsl.layers import pipeline_specs
from octodsl.mesh import Mesh
from octodsl.models import load_model, parse_model
from octodsl.models.builtin import BUILTINS
from octodsl.plan import Plan, Stage

CONFIG = {"train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 4}
QWEN = pipeline_specs(load_model("qwen3-next-tiny"))  # MoE layers of 16 experts


def plan_of(dp: int, ep: int, devices: int = 2, tp: int = 1, zero: int = 0) -> Plan:
    plan = generate("1f1b", devices=devices, microbatches=4)
    bounds = [len(QWEN) * i // devices for i in range(devices + 1)]
    header = plan.header.model_copy(update={"tp": tp, "dp": dp, "ep": ep, "zero": zero})
    return Plan(
        header,
        [Stage(a, b - 1) for a, b in itertools.pairwise(bounds)],
        plan.placement,
        plan.schedule,
    )


@pytest.mark.parametrize("tp,pp,dp,ep", [(1, 2, 2, 2), (1, 1, 4, 2), (2, 2, 4, 2), (2, 3, 6, 3)])
def test_ep_groups_are_consecutive_copies_and_expert_dp_groups_the_copies_between(tp, pp, dp, ep):
    mesh = Mesh(tp, pp, dp, ep=ep)
    ep_groups, data_groups = expert_rank_groups(pp, dp, tp, ep, mesh.rank)
    # every rank is in exactly one group of each kind, of ep and dp / ep ranks
    for groups, size in ((ep_groups, ep), (data_groups, dp // ep)):
        assert sorted(r for g in groups for r in g) == list(range(mesh.world))
        assert {len(g) for g in groups} == {size}
    for g in ep_groups:
        coords = [mesh.coords(r) for r in g]
        # one pipeline device and tp rank; copies b*ep .. b*ep + ep - 1 (ranks tp apart)
        assert len({(p, t) for p, _, t in coords}) == 1
        copies = [d for _, d, _ in coords]
        assert copies == list(range(copies[0], copies[0] + ep)) and copies[0] % ep == 0
    for g in data_groups:
        coords = [mesh.coords(r) for r in g]
        assert len({(p, t) for p, _, t in coords}) == 1
        # the same position in each ep group: the same experts
        assert len({d % ep for _, d, _ in coords}) == 1


def test_a_plan_with_ep_that_fits_is_accepted():
    assert check_launch(plan_of(2, 2), 4, CONFIG, QWEN)
    assert check_launch(plan_of(4, 4, devices=1), 4, CONFIG, QWEN)


def test_ep_that_does_not_divide_dp_is_refused_by_lint():
    with pytest.raises(PlanLaunchError) as e:
        check_launch(plan_of(4, 3, devices=1), 4, CONFIG, QWEN)
    assert "E705: ep 3 does not divide dp 4" in str(e.value)


def test_ep_that_does_not_divide_the_experts_is_one_line():
    d = copy.deepcopy(BUILTINS["qwen3-next-tiny"])
    d["moe"].update(experts=6, top_k=2)
    layers = pipeline_specs(parse_model(d, "six experts"))
    with pytest.raises(PlanLaunchError) as e:
        check_launch(plan_of(4, 4, devices=1), 4, CONFIG, layers)
    assert str(e.value) == (
        "ep 4 does not divide the 6 experts of the model's MoE layers: each rank holds "
        "experts / ep of them"
    )


def test_ep_on_a_model_without_experts_is_refused():
    layers = pipeline_specs(load_model("nemotron-h-tiny"))
    with pytest.raises(PlanLaunchError) as e:
        check_launch(plan_of(2, 2), 4, CONFIG, layers)
    assert str(e.value) == (
        "the plan runs ep 2, but the model has no MoE layers: there are no experts to spread "
        "(drop `ep`)"
    )


def test_ep_with_zero_or_half_precision_is_refused_naming_what_to_drop():
    with pytest.raises(PlanLaunchError) as e:
        check_launch(plan_of(2, 2, zero=1), 4, CONFIG, QWEN)
    assert "runs ep 2 with `zero 1`, which octodsl's executor does not run" in str(e.value)
    assert str(e.value).endswith("drop `zero` or `ep`") and "\n" not in str(e.value)
    for key in ("bf16", "fp16"):
        with pytest.raises(PlanLaunchError) as e:
            check_launch(plan_of(2, 2), 4, {**CONFIG, key: {"enabled": True}}, QWEN)
        assert (
            f'runs ep 2, which octodsl\'s executor runs in fp32 only, but the DeepSpeed config enables "{key}"'
            in str(e.value)
        )
    # disabled: fine
    assert check_launch(plan_of(2, 2), 4, {**CONFIG, "bf16": {"enabled": False}}, QWEN)


def test_a_checkpoint_layout_names_its_ep():
    layout = {"stages": [[0, 9], [10, 19]], "devices": [0, 1], "ep": 2}
    assert describe_layout(layout) == (
        "2 stages (layers 0..9, 10..19) on devices 0, 1, experts over ep 2"
    )
