"""The DeepSpeed config as the executor reads it: the "octo" section validated (one line per
problem, naming the file), and the batch sizes taken from the plan or checked against it."""

from __future__ import annotations

import json

import pytest

from octodsl.deepspeed_ext.config import (
    accum_config,
    batch_config,
    plan_config,
    read_config,
    zero_config,
)
from octodsl.deepspeed_ext.errors import PlanLaunchError
from octodsl.gen import generate
from octodsl.limits import MAX_TIMEOUT


def test_the_octo_section_is_removed_and_validated():
    ds, octo = read_config(
        {
            "octo": {"schedule": "p.octo", "timeout": 5, "trace": True},
            "optimizer": {"type": "AdamW"},
        }
    )
    assert ds == {"optimizer": {"type": "AdamW"}}
    assert (octo.schedule, octo.wait_seconds, octo.trace) == ("p.octo", 5.0, True)


@pytest.mark.parametrize("octo", [{}, {"timeout": None}])
def test_no_timeout_or_null_means_the_default(octo):
    assert read_config({"octo": octo})[1].wait_seconds == 300.0


@pytest.mark.parametrize(
    "octo,message",
    [
        ({"timeout": -1}, "timeout: input should be greater than 0, not -1"),
        ({"timeout": 0}, "timeout: input should be greater than 0, not 0"),
        ({"timeout": float("inf")}, "timeout: input should be a finite number, not Infinity"),
        (
            {"timeout": MAX_TIMEOUT + 1},
            "timeout: input should be less than or equal to 86400, not 86401",
        ),
        ({"timeout": "300"}, 'timeout: input should be a valid number, not "300"'),
        ({"trace": "yes"}, 'trace: input should be a valid boolean, not "yes"'),
        ({"timout": 300}, "unknown field 'timout' (the fields are schedule, timeout, trace)"),
    ],
)
def test_a_bad_octo_section_is_one_line_naming_the_file(tmp_path, octo, message):
    path = tmp_path / "ds.json"
    path.write_text(json.dumps({"octo": octo}))
    with pytest.raises(PlanLaunchError) as e:
        read_config(path)
    assert str(e.value) == f'{path}: "octo": {message}'


@pytest.mark.parametrize(
    "text,message",
    [
        ("[1]", "a DeepSpeed config is a JSON object, not an array"),
        ("{", "not valid JSON: "),
        ('{"octo": 5}', '"octo" is an object such as {"timeout": 300}, not a number'),
        (
            '{"train_micro_batch_size_per_gpu": 0}',
            "train_micro_batch_size_per_gpu: input should be greater than or equal to 1, not 0",
        ),
        ('{"gradient_accumulation_steps": null}', None),
    ],
)
def test_a_bad_file_is_one_line(tmp_path, text, message):
    path = tmp_path / "ds.json"
    path.write_text(text)
    if message is None:  # null is DeepSpeed's "not given"
        read_config(path)
        return
    with pytest.raises(PlanLaunchError, match=None) as e:
        read_config(path)
    assert message in str(e.value) and str(e.value).startswith(f"{path}: ")


def test_a_missing_file_is_named(tmp_path):
    with pytest.raises(PlanLaunchError, match="no-such.json: no such DeepSpeed config"):
        read_config(tmp_path / "no-such.json")


PLAN = generate("1f1b", devices=2, microbatches=4)


def test_batch_sizes_left_out_come_from_the_plan():
    shaped = PLAN.__class__(
        PLAN.header.model_copy(update={"microbatch_size": 3}),
        PLAN.stages,
        PLAN.placement,
        PLAN.schedule,
    )
    assert batch_config({"x": 1}, shaped) == {
        "x": 1,
        "train_micro_batch_size_per_gpu": 3,
        "gradient_accumulation_steps": 4,
    }
    # a plan that states no size: the caller's default (the model's)
    assert batch_config({}, PLAN, 2)["train_micro_batch_size_per_gpu"] == 2
    # a consistent config is kept as it is
    full = {
        "train_batch_size": 8,
        "train_micro_batch_size_per_gpu": 2,
        "gradient_accumulation_steps": 4,
    }
    assert batch_config(full, PLAN, 2) == full


@pytest.mark.parametrize(
    "config,default,message",
    [
        (
            {"train_micro_batch_size_per_gpu": 1},
            2,
            "plan.octo trains micro-batches of 2 sequences (it states no microbatch_size: the model's "
            "default), but ds.json gives 1 (train_micro_batch_size_per_gpu): leave the batch sizes out of "
            "the config (the plan's are used) or state `microbatch_size 1` in the plan's header",
        ),
        (
            {"train_batch_size": 4},
            2,
            "but ds.json gives 1 (train_batch_size 4 / 4 micro-batches / dp 1)",
        ),
        (
            {"gradient_accumulation_steps": 8},
            2,
            "plan.octo runs 4 micro-batches per step, but ds.json gives 8 gradient-accumulation steps",
        ),
        (
            {
                "train_batch_size": 10,
                "train_micro_batch_size_per_gpu": 2,
                "gradient_accumulation_steps": 4,
            },
            2,
            "ds.json gives train_batch_size 10, but plan.octo trains 2 x 4 micro-batches x dp 1 = 8",
        ),
        (
            {},
            None,
            "the micro-batch size is unknown: state `microbatch_size` in plan.octo or "
            "train_micro_batch_size_per_gpu in ds.json",
        ),
    ],
)
def test_batch_sizes_that_differ_from_the_plan_name_both(config, default, message):
    with pytest.raises(PlanLaunchError) as e:
        batch_config(config, PLAN, default, plan_name="plan.octo", config_name="ds.json")
    assert message in str(e.value)


def test_a_size_the_plan_states_wins_over_the_default():
    shaped = PLAN.__class__(
        PLAN.header.model_copy(update={"microbatch_size": 1}),
        PLAN.stages,
        PLAN.placement,
        PLAN.schedule,
    )
    assert batch_config({}, shaped, 2)["train_micro_batch_size_per_gpu"] == 1
    with pytest.raises(PlanLaunchError, match="trains micro-batches of 1 sequence, but"):
        batch_config({"train_micro_batch_size_per_gpu": 2}, shaped, 2)


def _with_zero(zero: int, dp: int = 1):
    return PLAN.__class__(
        PLAN.header.model_copy(update={"zero": zero, "dp": dp}),
        PLAN.stages,
        PLAN.placement,
        PLAN.schedule,
    )


@pytest.mark.parametrize("zero", [0, 1])
def test_the_zero_stage_comes_from_the_plan(zero):
    given = {"zero_optimization": {"reduce_bucket_size": 5}, "x": 1}
    assert zero_config(given, _with_zero(zero, dp=2)) == {
        "x": 1,
        "zero_optimization": {"reduce_bucket_size": 5, "stage": zero},
    }
    assert zero_config({}, _with_zero(zero))["zero_optimization"] == {"stage": zero}
    # a config that states the plan's stage is kept as it is
    assert zero_config({"zero_optimization": {"stage": zero}}, _with_zero(zero)) == {
        "zero_optimization": {"stage": zero}
    }


def test_a_zero_stage_that_differs_from_the_plan_names_both():
    with pytest.raises(PlanLaunchError) as e:
        zero_config(
            {"zero_optimization": {"stage": 1}}, PLAN, plan_name="plan.octo", config_name="ds.json"
        )
    assert str(e.value) == (
        "plan.octo runs ZeRO stage 0 (its header's `zero`, 0 when not stated), but ds.json gives "
        "zero_optimization.stage 1: leave the stage out of the config (the plan's is used) or "
        "state `zero 1` in the plan's header"
    )
    with pytest.raises(
        PlanLaunchError, match="runs ZeRO stage 1 .* gives zero_optimization.stage 0"
    ):
        zero_config({"zero_optimization": {"stage": 0}}, _with_zero(1))


def test_reduce_scatter_comes_from_the_plan_under_zero():
    allreduce = PLAN.__class__(
        PLAN.header.model_copy(update={"zero": 1, "dp": 2, "reduce_scatter": False}),
        PLAN.stages,
        PLAN.placement,
        PLAN.schedule,
    )
    assert zero_config({}, allreduce)["zero_optimization"] == {"stage": 1, "reduce_scatter": False}
    assert zero_config({}, _with_zero(1, dp=2))["zero_optimization"] == {"stage": 1}
    with pytest.raises(
        PlanLaunchError,
        match="with a reduce-scatter .* gives "
        "zero_optimization.reduce_scatter false: .* state `reduce_scatter false`",
    ):
        zero_config({"zero_optimization": {"reduce_scatter": False}}, _with_zero(1, dp=2))
    with pytest.raises(PlanLaunchError, match="with an all-reduce"):
        zero_config({"zero_optimization": {"reduce_scatter": True}}, allreduce)
    with pytest.raises(PlanLaunchError, match="reduce_scatter"):  # strict: not the string "no"
        zero_config({"zero_optimization": {"reduce_scatter": "no"}}, allreduce)


def _accumulating(dtype: str | None):
    return PLAN.__class__(
        PLAN.header.model_copy(
            update={"zero": 1, "dp": 2, "reduce_scatter": False, "grad_accum_dtype": dtype}
        ),
        PLAN.stages,
        PLAN.placement,
        PLAN.schedule,
    )


def test_the_accumulation_dtype_comes_from_the_plan():
    bf16 = {"bf16": {"enabled": True}, "data_types": {"x": 1}}
    assert accum_config(bf16, _accumulating("fp32"))["data_types"] == {
        "x": 1,
        "grad_accum_dtype": "fp32",
    }
    # a plan that names none leaves the config to DeepSpeed's default, the model's dtype
    assert accum_config(bf16, _accumulating(None)) == bf16
    assert plan_config(bf16, _accumulating("fp32"), 1)["data_types"]["grad_accum_dtype"] == "fp32"
    # DeepSpeed's other names of the same dtype agree
    for same in ("fp32", "float32", "float", "torch.float32"):
        given = {**bf16, "data_types": {"grad_accum_dtype": same}}
        assert (
            accum_config(given, _accumulating("fp32"))["data_types"]["grad_accum_dtype"] == "fp32"
        )
    assert accum_config({"data_types": {"grad_accum_dtype": "fp32"}}, _accumulating(None))


@pytest.mark.parametrize(
    "config,dtype,message",
    [
        (
            {"bf16": {"enabled": True}, "data_types": {"grad_accum_dtype": "fp32"}},
            None,
            "plan.octo accumulates its gradients in bf16 (DeepSpeed's default, the model's dtype: "
            "its header names no `grad_accum_dtype`), but ds.json gives "
            "data_types.grad_accum_dtype 'fp32': leave it out of the config or state "
            "`grad_accum_dtype fp32` in the plan's header",
        ),
        (
            {"bf16": {"enabled": True}, "data_types": {"grad_accum_dtype": "bfloat16"}},
            "fp32",
            "plan.octo accumulates its gradients in fp32 (its header's `grad_accum_dtype`), but "
            "ds.json gives data_types.grad_accum_dtype 'bfloat16': leave it out of the config or "
            "state `grad_accum_dtype bf16` in the plan's header",
        ),
    ],
)
def test_an_accumulation_dtype_that_differs_from_the_plan_names_both(config, dtype, message):
    with pytest.raises(PlanLaunchError) as e:
        accum_config(config, _accumulating(dtype), plan_name="plan.octo", config_name="ds.json")
    assert message in str(e.value) and "\n" not in str(e.value)


@pytest.mark.parametrize(
    "data_types,message",
    [
        ("fp32", 'data_types: input should be an object, not "fp32"'),
        ([], "data_types: input should be an object, not []"),
        ({"grad_accum_dtype": 32}, "data_types.grad_accum_dtype: input should be a valid string"),
        ({"grad_accum_dtype": float("nan")}, "input should be a valid string, not NaN"),
        ({"grad_accum_dtype": "int8"}, "data_types.grad_accum_dtype: must be one of fp32, "),
        ({"grad_accum_dtype": "x" * 5000}, 'not "' + "x" * 56 + "..."),
        ({"grad_accum_dtype": [["fp32"] * 50]}, "input should be a valid string, not [["),
    ],
)
def test_a_bad_data_types_section_is_one_bounded_line(data_types, message):
    with pytest.raises(PlanLaunchError) as e:
        accum_config({"data_types": data_types}, _accumulating("fp32"), config_name="ds.json")
    text = str(e.value)
    assert message in text and "\n" not in text and len(text) < 300
    assert "_DataTypes" not in text  # JSON's words, not the class behind them


def test_zero_2_is_refused_with_the_reason():
    with pytest.raises(PlanLaunchError) as e:
        plan_config({}, _with_zero(2, dp=2), 1, plan_name="plan.octo", config_name="ds.json")
    message = str(e.value)
    assert message.startswith(
        "plan.octo runs `zero 2` (gradients sharded over the data-parallel "
        "copies), which DeepSpeed's pipeline engine refuses"
    )
    assert '"ZeRO-2 and ZeRO-3 are incompatible with pipeline parallelism"' in message
    assert message.endswith("run `zero 1`, which shards the optimizer state")
    assert "\n" not in message


@pytest.mark.parametrize(
    "given,message",
    [
        ({"zero_optimization": True}, 'gives "zero_optimization" as a boolean'),
        (
            {"zero_optimization": {"stage": 4}},
            "zero_optimization.stage: input should be less than or equal to 3, not 4",
        ),
        (
            {"zero_optimization": {"stage": "1"}},
            'zero_optimization.stage: input should be a valid integer, not "1"',
        ),
    ],
)
def test_a_bad_zero_section_is_one_line(given, message):
    with pytest.raises(PlanLaunchError) as e:
        zero_config(given, PLAN, config_name="ds.json")
    assert message in str(e.value) and "\n" not in str(e.value)


def test_the_launch_check_refuses_zero_2_and_a_mismatch_before_any_communication(monkeypatch):
    # check_launch is what initialize runs on every rank before torch.distributed starts
    from octodsl.deepspeed_ext.launch import check_launch

    plan = generate("zb-h1", devices=2, microbatches=4)
    layers = 24
    with pytest.raises(PlanLaunchError, match="DeepSpeed's pipeline engine refuses"):
        check_launch(
            PLAN.__class__(
                plan.header.model_copy(update={"zero": 2, "dp": 2}),
                plan.stages,
                plan.placement,
                plan.schedule,
            ),
            4,
            {},
            layers,
            microbatch_size=1,
            layer_costs=[1.0] * layers,
        )
    with pytest.raises(PlanLaunchError, match="gives zero_optimization.stage 1"):
        check_launch(
            plan,
            2,
            {"zero_optimization": {"stage": 1}},
            layers,
            microbatch_size=1,
            layer_costs=[1.0] * layers,
        )
