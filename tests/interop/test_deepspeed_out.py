"""`octodsl convert --to deepspeed`: golden snippets, the snippet's PipelineModule cut where the
plan cuts (its `_partition_layers` run as DeepSpeed's __init__ runs it, for every stage, on a
module built without distributed init), and the plans stock DeepSpeed cannot run."""

from __future__ import annotations

import pytest
import torch

from octodsl.gen import generate
from octodsl.interop.deepspeed_out import deepspeed_snippet
from octodsl.interop.export import ExportError
from octodsl.plan import Recompute

from ..conftest import check_golden
from .test_megatron import GOLDEN, _with_model, plan_of

ONE_PER_DEVICE = [p for p in sorted(GOLDEN.glob("*.octo")) if "interleaved" not in p.name]


@pytest.mark.parametrize("path", ONE_PER_DEVICE, ids=lambda p: p.stem)
def test_golden(path):
    export = deepspeed_snippet(plan_of(path), path.name)
    check_golden(path.with_suffix(".deepspeed.py"), export.text)


def snippet_namespace(text: str) -> dict:
    namespace: dict = {}
    exec(compile(text, "<snippet>", "exec"), namespace)  # noqa: S102 - our own output, under test
    return namespace


def bounds(cls, layers: int, stages: int, stage: int) -> tuple[int, int]:
    """The layers [start, stop) DeepSpeed would build on `stage`: PipelineModule.__init__ sets
    _layer_specs, num_stages and stage_id, then calls _partition_layers (deepspeed 0.19.8)."""
    module = cls.__new__(cls)
    torch.nn.Module.__init__(module)
    module._layer_specs = [torch.nn.Identity() for _ in range(layers)]
    module.num_stages, module.stage_id = stages, stage
    module._partition_layers(method="parameters")
    return module._local_start, module._local_stop


@pytest.mark.parametrize("path", ONE_PER_DEVICE, ids=lambda p: p.stem)
def test_snippet_cuts_where_the_plan_cuts(path):
    plan = plan_of(path)
    ns = snippet_namespace(deepspeed_snippet(plan).text)
    layers = sum(s.num_layers for s in plan.stages)
    for s, stage in enumerate(plan.stages):
        assert bounds(ns["PlanPipelineModule"], layers, plan.num_stages, s) == (
            stage.first,
            stage.last + 1,
        )
    with pytest.raises(ValueError, match=f"the plan cuts {layers} layers"):
        bounds(ns["PlanPipelineModule"], layers - 1, plan.num_stages, 0)


def test_ds_config_and_topology():
    plan = plan_of(GOLDEN / "nemotron-h-56b-tp8-p8-dp2.octo")
    export = deepspeed_snippet(plan)
    ns = snippet_namespace(export.text)
    assert ns["DS_CONFIG"] == {
        "train_micro_batch_size_per_gpu": 1,
        "gradient_accumulation_steps": 32,
        "train_batch_size": 64,
        "zero_optimization": {"stage": 1},
    }
    assert "PipeModelDataParallelTopology(num_pp=8, num_mp=8, num_dp=2)" in export.text
    # the largest stage, one checkpointed block: stage 0, the embedding and 15 layers
    assert "activation_checkpoint_interval=16" in export.text
    assert any("tp 8" in w for w in export.warnings)


@pytest.mark.parametrize("parted", [False, True])
def test_pipeline_messages_partitioned_as_the_plan_says(parted):
    """Stock DeepSpeed partitions pipeline messages over the tp group by default: the config
    says what the plan was costed for (without sequence parallelism)."""
    plan = _with_model(generate("1f1b", 4, 8), "nemotron-h-8b")
    plan.header = plan.header.model_copy(
        update={"tp": 2, "sequence_parallel": False, "scatter_gather_messages": parted}
    )
    config = snippet_namespace(deepspeed_snippet(plan).text)["DS_CONFIG"]
    assert config["pipeline"] == {"pipe_partitioned": parted, "grad_partitioned": parted}


def test_other_orders_run_as_deepspeeds_1f1b_with_a_warning():
    export = deepspeed_snippet(_with_model(generate("zb-h1", 4, 8), "nemotron-h-8b"))
    assert any("splits backwards" in w and "1F1B TrainSchedule" in w for w in export.warnings)
    assert not deepspeed_snippet(_with_model(generate("1f1b", 4, 8), "nemotron-h-8b")).warnings


def test_mixed_recompute_is_left_out_with_a_warning():
    plan = _with_model(generate("1f1b", 4, 8), "nemotron-h-8b")
    plan.stages[1].recompute = Recompute.FULL
    export = deepspeed_snippet(plan)
    assert "activation_checkpoint_interval=0" in export.text
    assert any("stage 1: full" in w for w in export.warnings)


@pytest.mark.parametrize(
    ("plan", "message"),
    [
        (
            lambda: generate("interleaved", 4, 8, chunks=2, model="nemotron-h-8b"),
            "8 stages on 4 devices",
        ),
        (lambda: _with_model(generate("zb-v", 4, 8), "nemotron-h-8b"), "8 stages on 4 devices"),
        (lambda: generate("1f1b", 4, 8), "names no model"),
    ],
)
def test_refused(plan, message):
    with pytest.raises(ExportError, match=message) as e:
        deepspeed_snippet(plan())
    assert e.value.exit_code == 1


def test_zero_2_is_refused():
    plan = _with_model(generate("1f1b", 4, 8), "nemotron-h-8b")
    plan.header = plan.header.model_copy(update={"zero": 2, "dp": 2})
    with pytest.raises(ExportError, match="refuses ZeRO-2"):
        deepspeed_snippet(plan)


def test_placement_other_than_stage_s_on_device_s_is_refused():
    plan = _with_model(generate("1f1b", 2, 2), "nemotron-h-8b")
    plan.placement[0].device, plan.placement[1].device = 1, 0
    with pytest.raises(ExportError, match="placed otherwise"):
        deepspeed_snippet(plan)


def test_snippet_imports_what_deepspeed_has():
    pytest.importorskip("deepspeed")
    ns = snippet_namespace(deepspeed_snippet(plan_of(ONE_PER_DEVICE[0])).text)
    from deepspeed.pipe import PipelineModule

    assert issubclass(ns["PlanPipelineModule"], PipelineModule)
