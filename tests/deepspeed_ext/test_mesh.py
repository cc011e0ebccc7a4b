"""The tp x pp x dp mesh in DeepSpeed, without processes: DeepSpeed's topology has Megatron's rank
order (octodsl.mesh), and a launch that does not fit the plan's mesh or whose layers tp cannot
split is refused before any communication."""

from __future__ import annotations

import dataclasses
import itertools

import pytest
import torch
from deepspeed.pipe import LayerSpec

from octodsl.deepspeed_ext import PlanLaunchError, check_launch
from octodsl.deepspeed_ext.config import plan_config
from octodsl.deepspeed_ext.mesh import topology
from octodsl.gen import generate
from octodsl.layers import pipeline_specs
from octodsl.mesh import Mesh
from octodsl.models import load_model
from octodsl.plan import Plan, Stage

CONFIG = {"train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 4}


def plan_of(tp: int = 1, dp: int = 1, devices: int = 2, layers: int = 10, zero: int = 0) -> Plan:
    plan = generate("1f1b", devices=devices, microbatches=4)
    bounds = [layers * i // devices for i in range(devices + 1)]
    header = plan.header.model_copy(update={"tp": tp, "dp": dp, "zero": zero})
    return Plan(
        header,
        [Stage(a, b - 1) for a, b in itertools.pairwise(bounds)],
        plan.placement,
        plan.schedule,
    )


@pytest.mark.parametrize("tp,pp,dp", [(1, 2, 1), (2, 2, 1), (2, 1, 2), (4, 3, 2), (2, 4, 3)])
def test_deepspeed_topology_has_megatron_rank_order(tp, pp, dp):
    topo, mesh = topology(plan_of(tp, dp, devices=pp)), Mesh(tp, pp, dp)
    assert topo.world_size() == mesh.world
    for p, d, t in itertools.product(range(pp), range(dp), range(tp)):
        coords = {"pipe": p, "data": d} | ({"model": t} if tp > 1 else {})
        rank = topo.get_rank(**coords)
        assert rank == mesh.rank(p, d, t) and mesh.coords(rank) == (p, d, t)


def test_tp_1_keeps_the_pipe_data_topology():
    # the same ranks, and checkpoint file names without a model axis, as before tp existed
    assert topology(plan_of()).get_axis_names() == ["pipe", "data"]


@pytest.mark.parametrize(
    "tp,dp,world,message",
    [
        (
            2,
            1,
            2,
            "the plan runs 1 data-parallel copy of a 2-device pipeline of tp groups of 2 "
            "(4 processes: tp 2 x 2 devices x dp 1), but the job has 2 processes; to fit it "
            "set `tp 1` in the plan header",
        ),
        (
            2,
            1,
            8,
            "(4 processes: tp 2 x 2 devices x dp 1), but the job has 8 processes; to fit it "
            "set `dp 2` or `tp 4` in the plan header",
        ),
        (
            2,
            2,
            12,
            "but the job has 12 processes; to fit it set `dp 3` or `tp 3` in the plan header",
        ),
        (
            4,
            1,
            6,
            "(8 processes: tp 4 x 2 devices x dp 1), but the job has 6 processes; to fit it "
            "set `tp 3`",
        ),
        (2, 1, 5, "but the job has 5 processes"),
    ],
)
def test_a_world_that_is_not_tp_x_devices_x_dp_is_refused_with_the_fix(tp, dp, world, message):
    with pytest.raises(PlanLaunchError) as e:
        check_launch(plan_of(tp, dp), world, CONFIG, 10)
    assert message in str(e.value)
    if world == 5:
        assert "to fit it" not in str(e.value)


def test_tp_that_fits_is_accepted():
    assert check_launch(plan_of(2, 2), 8, CONFIG, 10) == [range(0, 5), range(5, 10)]


def test_tp_that_cannot_split_the_layers_is_refused():
    spec = load_model("nemotron-h-tiny")  # 8 attention heads, 2 KV heads, 2 Mamba2 groups
    layers = pipeline_specs(spec)
    plan = plan_of(16, layers=len(layers))
    with pytest.raises(PlanLaunchError) as e:
        check_launch(plan, 16 * 2, CONFIG, layers)
    text = str(e.value)
    assert text.startswith("the model's layers cannot be split over tp 16: ")
    assert "attention heads 8: not divisible by tp 16" in text
    assert "mamba2 groups 2: not divisible by tp 16" in text
    # what tp handles anyway (KV heads replicated, a padded vocabulary) is no reason to refuse
    assert "kv_heads" not in text and "vocab" not in text
    assert check_launch(plan_of(2, layers=len(layers)), 4, CONFIG, layers)


def test_layers_without_a_layer_config_are_not_judged():
    layers = [LayerSpec(torch.nn.Linear, 4, 4) for _ in range(10)]  # a user's own: theirs to split
    assert check_launch(plan_of(16), 32, CONFIG, layers)


def test_zero_2_is_still_refused_with_tp():
    with pytest.raises(PlanLaunchError, match="DeepSpeed's pipeline engine refuses"):
        check_launch(plan_of(2, 2, zero=2), 8, CONFIG, 10)


def test_a_plan_costed_with_partitioned_messages_is_refused():
    """DeepSpeed's stock engine partitions them with tp > 1; octodsl's executor sends whole
    activations, so a plan costed the other way would be timed for a run that cannot happen."""
    plan = plan_of(2)
    parted = dataclasses.replace(
        plan,
        header=plan.header.model_copy(
            update={"scatter_gather_messages": True, "sequence_parallel": False}
        ),
    )
    with pytest.raises(PlanLaunchError) as e:
        plan_config(CONFIG, parted)
    assert str(e.value).startswith('the plan "1f1b-p2-m4" says `scatter_gather_messages true`')
    assert "\n" not in str(e.value)
    # under sequence parallelism the field changes nothing: each rank sends its slice anyway
    sp = parted.header.model_copy(update={"sequence_parallel": True})
    assert plan_config(CONFIG, dataclasses.replace(parted, header=sp))["pipeline"]


def test_tp_turns_off_deepspeeds_partitioned_pipeline_messages():
    assert "pipeline" not in plan_config(CONFIG, plan_of())
    cfg = plan_config({**CONFIG, "pipeline": {"activation_checkpoint_interval": 0}}, plan_of(2))
    assert cfg["pipeline"] == {
        "activation_checkpoint_interval": 0,
        "pipe_partitioned": False,
        "grad_partitioned": False,
    }
