"""The DeepSpeed config as the executor reads it, checked on every rank before any
communication: its `"octo"` section (`OctoSection`, removed before DeepSpeed sees the config), its
batch sizes and its ZeRO stage, which must be the plan's (`plan_config`: `batch_config`,
`zero_config`). Every problem is one PlanLaunchError line naming the file."""

from __future__ import annotations

import json
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator
from pydantic_core import ErrorDetails

from .. import limits
from ..inputs import read_data
from ..plan import PIPELINE_ZERO, Plan, deepspeed_zero
from .errors import PlanLaunchError
from .watchdog import DEFAULT_TIMEOUT


class OctoSection(BaseModel):
    """`"octo": {"schedule": "plan.octo", "timeout": 300, "trace": false}` in a DeepSpeed
    config; every field may be left out."""

    model_config = ConfigDict(extra="forbid", strict=True)

    schedule: str | None = None
    """The plan (a .octo file), for a script that passes `initialize` no plan."""
    timeout: float | None = Field(default=None, gt=0, le=limits.MAX_TIMEOUT, allow_inf_nan=False)
    """Seconds a rank may wait for one message before the watchdog prints what every stuck rank
    waits for and the job exits non-zero; null (or absent) means the default, 300."""
    trace: bool = False
    """Record per-op compute and communication times for `engine.write_trace(path)`."""

    @property
    def wait_seconds(self) -> float:
        """The watchdog's limit."""
        return DEFAULT_TIMEOUT if self.timeout is None else self.timeout


class _Batch(BaseModel):
    """The batch sizes of a DeepSpeed config (the rest is DeepSpeed's own business)."""

    model_config = ConfigDict(extra="ignore", strict=True)

    train_micro_batch_size_per_gpu: int | None = Field(
        default=None, ge=1, le=limits.MAX_MICROBATCH_SIZE
    )
    """Sequences per micro-batch."""
    gradient_accumulation_steps: int | None = Field(default=None, ge=1, le=limits.MAX_MICROBATCHES)
    """Micro-batches per step (the plan's `microbatches`)."""
    train_batch_size: int | None = Field(default=None, ge=1, le=limits.MAX_INT)
    """Sequences per step over all data-parallel copies: micro-batch size x accumulation steps
    x dp."""


class _ZeroSection(BaseModel):
    """DeepSpeed's `zero_optimization` object, of which the executor reads the stage and
    `reduce_scatter` only."""

    model_config = ConfigDict(extra="ignore", strict=True)

    stage: int | None = Field(default=None, ge=0, le=3)
    reduce_scatter: bool | None = None


class _Zero(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)

    zero_optimization: _ZeroSection | None = None


def read_config(config: dict | str | Path) -> tuple[dict, OctoSection]:
    """The DeepSpeed config (a dict, or the path of a JSON file) without its "octo" section, and
    that section. PlanLaunchError when the file cannot be read or is no JSON object, or when the
    section or a batch size is not what the executor can use."""
    name = str(config) if isinstance(config, (str, Path)) else None
    data = (
        config
        if name is None
        else read_data(name, "DeepSpeed config", error=PlanLaunchError, json_file=True)
    )
    if not isinstance(data, dict):
        raise PlanLaunchError(
            f"a DeepSpeed config is a JSON object, not {_json_type(data)}", path=name
        )
    config = dict(data)
    octo = config.pop("octo", {})
    if not isinstance(octo, dict):
        raise PlanLaunchError(
            f'"octo" is an object such as {{"timeout": 300}}, not {_json_type(octo)}', path=name
        )
    section = octo_section(octo, name)
    _validate(_Batch, config, "", name)
    return config, section


def octo_section(fields: dict, config_name: str | None = None) -> OctoSection:
    """The "octo" section of `config_name` (for the message); PlanLaunchError when wrong."""
    return _validate(OctoSection, fields, '"octo": ', config_name)


def batch_config(
    config: dict,
    plan: Plan,
    default_microbatch_size: int | None = None,
    *,
    plan_name: str | None = None,
    config_name: str | None = None,
) -> dict:
    """`config` with DeepSpeed's batch sizes set from the plan: gradient-accumulation steps =
    its micro-batches, micro-batch size = its header's `microbatch_size`, else
    `default_microbatch_size` (the model's default, which `octodsl simulate` assumes too). Sizes
    the config gives (train_batch_size included, as DeepSpeed derives the others from it) must
    agree: PlanLaunchError naming both values and both sources otherwise."""
    plan_name, config_name = _names(plan, plan_name, config_name)
    given = _validate(_Batch, config, "", config_name)
    dp, m = plan.header.dp, plan.microbatches
    stated = plan.header.microbatch_size
    size = stated if stated is not None else default_microbatch_size
    total, micro, gas = (
        given.train_batch_size,
        given.train_micro_batch_size_per_gpu,
        given.gradient_accumulation_steps,
    )
    if gas is None and total is not None and micro is not None:
        gas, how = (
            total // (micro * dp),
            f" (train_batch_size {total} / micro-batch size {micro} / dp {dp})",
        )
    else:
        how = ""
    if gas is not None and gas != m:
        raise PlanLaunchError(
            f"{plan_name} runs {m} micro-batches per step, but {config_name} gives "
            f"{gas} gradient-accumulation steps{how}"
        )
    if micro is None and total is not None:
        micro, how = total // (m * dp), f" (train_batch_size {total} / {m} micro-batches / dp {dp})"
    else:
        how = " (train_micro_batch_size_per_gpu)"
    if micro is not None and size is not None and micro != size:
        why = "" if stated is not None else " (it states no microbatch_size: the model's default)"
        raise PlanLaunchError(
            f"{plan_name} trains micro-batches of {size} sequence{'s' if size > 1 else ''}{why}, but "
            f"{config_name} gives "
            f"{micro}{how}: leave the batch sizes out of the config (the plan's are used) or "
            f"state `microbatch_size {micro}` in the plan's header"
        )
    micro = micro if micro is not None else size
    if micro is None:
        raise PlanLaunchError(
            f"the micro-batch size is unknown: state `microbatch_size` in "
            f"{plan_name} or train_micro_batch_size_per_gpu in {config_name}"
        )
    if total is not None and total != micro * m * dp:
        raise PlanLaunchError(
            f"{config_name} gives train_batch_size {total}, but {plan_name} trains "
            f"{micro} x {m} micro-batches x dp {dp} = {micro * m * dp} sequences "
            "per step"
        )
    return {**config, "train_micro_batch_size_per_gpu": micro, "gradient_accumulation_steps": m}


def zero_config(
    config: dict, plan: Plan, *, plan_name: str | None = None, config_name: str | None = None
) -> dict:
    """`config` with DeepSpeed's ZeRO stage set from the plan's header `zero` (one plan, one
    meaning, as for the batch sizes), and under ZeRO its `reduce_scatter`. A stage or a
    `reduce_scatter` the config gives must agree: PlanLaunchError naming both values and both
    files otherwise. `zero 2` is refused: DeepSpeed's pipeline
    engine runs stages 0 and 1 only."""
    plan_name, config_name = _names(plan, plan_name, config_name)
    zero = plan.header.zero
    if isinstance(config.get("zero_optimization"), bool):
        raise PlanLaunchError(
            f'{config_name} gives "zero_optimization" as a boolean (DeepSpeed\'s '
            'deprecated form): give an object such as {"stage": 1}, or leave it '
            "out (the plan's `zero` is used)"
        )
    section = _validate(_Zero, config, "", config_name).zero_optimization
    given = None if section is None else section.stage
    if given is not None and given != zero:
        raise PlanLaunchError(
            f"{plan_name} runs ZeRO stage {zero} (its header's `zero`, 0 when not stated), but {config_name} gives "
            f"zero_optimization.stage {given}: leave the stage out of the config (the plan's is "
            f"used) or state `zero {given}` in the plan's header"
        )
    if zero > PIPELINE_ZERO:
        raise PlanLaunchError(
            f"{plan_name} runs `zero {zero}` (gradients sharded over the data-parallel copies), which "
            "DeepSpeed's pipeline engine refuses (PipelineEngine asserts \"ZeRO-2 and ZeRO-3 are "
            'incompatible with pipeline parallelism": ZeRO-2 reduces and partitions each gradient '
            "from hooks inside the backward pass, a reduction the pipeline engine turns off to "
            "reduce the gradients itself once per step); run `zero 1`, which shards the optimizer "
            "state"
        )
    given_rs = None if section is None else section.reduce_scatter
    if zero > 0 and given_rs is not None and given_rs != plan.header.reduce_scatter:
        raise PlanLaunchError(
            f"{plan_name} reduces its gradients with "
            f"{'a reduce-scatter' if plan.header.reduce_scatter else 'an all-reduce'} (its header's "
            f"`reduce_scatter`, true when not stated), but {config_name} gives "
            f"zero_optimization.reduce_scatter {str(given_rs).lower()}: leave it out of the config "
            f"or state `reduce_scatter {str(given_rs).lower()}` in the plan's header"
        )
    return {
        **config,
        "zero_optimization": {**config.get("zero_optimization", {}), **deepspeed_zero(plan.header)},
    }


_DTYPE_NAMES = {
    "fp32": ("fp32", "float32", "float", "torch.float32"),
    "bf16": ("bf16", "bfloat16", "torch.bfloat16"),
    "fp16": ("fp16", "float16", "half", "torch.float16"),
}
"""DeepSpeed's names of each dtype (its `DtypeEnum`), by the one a plan's header writes."""


class _DataTypesSection(BaseModel):
    """DeepSpeed's `data_types` object, of which the executor reads `grad_accum_dtype` only,
    as the name a plan's header writes."""

    model_config = ConfigDict(extra="ignore", strict=True)

    grad_accum_dtype: str | None = None

    @field_validator("grad_accum_dtype")
    @classmethod
    def _header_name(cls, value: str | None) -> str | None:
        if value is None:
            return None
        name = next((d for d, names in _DTYPE_NAMES.items() if value in names), None)
        if name is None:
            known = ", ".join(n for names in _DTYPE_NAMES.values() for n in names)
            raise ValueError(f"must be one of {known}")
        return name


class _DataTypes(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)

    data_types: _DataTypesSection | None = None


def _enabled(config: dict, keys: tuple[str, ...]) -> list[str]:
    """Of `keys`, in order, the config's sections that are objects with `enabled` set."""
    return [k for k in keys if isinstance(config.get(k), dict) and config[k].get("enabled")]


def config_dtype(config: dict) -> str:
    """The model's dtype a DeepSpeed config trains in: bf16 or fp16 where enabled, else fp32."""
    on = _enabled(config, ("bf16", "bfloat16", "fp16"))
    return "fp32" if not on else "fp16" if on[0] == "fp16" else "bf16"


def accum_config(
    config: dict, plan: Plan, *, plan_name: str | None = None, config_name: str | None = None
) -> dict:
    """`config` with `data_types.grad_accum_dtype` set from the plan's header `grad_accum_dtype`
    where it names one (its costs assume it: octodsl.costs.param_bytes). One the config gives
    must agree with the plan's, or with DeepSpeed's default, the model's dtype, when the plan
    names none: PlanLaunchError naming both otherwise."""
    plan_name, config_name = _names(plan, plan_name, config_name)
    wanted = plan.header.grad_accum_dtype
    section = _validate(_DataTypes, config, "", config_name).data_types
    given = None if section is None else section.grad_accum_dtype
    if given is not None:
        expected = wanted or config_dtype(config)
        if given != expected:
            said = (
                "its header's `grad_accum_dtype`"
                if wanted
                else "DeepSpeed's default, the model's dtype: its header names no "
                "`grad_accum_dtype`"
            )
            raise PlanLaunchError(
                f"{plan_name} accumulates its gradients in {expected} ({said}), but "
                f"{config_name} gives data_types.grad_accum_dtype "
                f"{config['data_types']['grad_accum_dtype']!r}: leave it out of the config or "
                f"state `grad_accum_dtype {given}` in the plan's header"
            )
    if wanted is None:
        return config
    return {**config, "data_types": {**config.get("data_types", {}), "grad_accum_dtype": wanted}}


def check_ep_precision(
    config: dict, plan: Plan, *, plan_name: str | None = None, config_name: str | None = None
) -> None:
    """ep > 1 runs in fp32 at ZeRO stage 0: DeepSpeed's ZeRO-1, bf16 and fp16 optimizers keep
    gradient copies of their own, which they reduce and take norms of over the whole
    data-parallel group, where the executor reduces a routed expert's gradient over its
    expert-data-parallel group and counts it once per ep group (engine.py, mesh.py).
    PlanLaunchError naming what to change otherwise."""
    h = plan.header
    if h.ep == 1:
        return
    plan_name, config_name = _names(plan, plan_name, config_name)
    if h.zero:
        raise PlanLaunchError(
            f"{plan_name} runs ep {h.ep} with `zero {h.zero}`, which octodsl's executor does not "
            "run (DeepSpeed's ZeRO optimizer reduces every gradient over the whole data-parallel "
            f"group, not a routed expert's over its dp / ep copies): drop `zero` or `ep`"
        )
    half = _enabled(config, ("fp16", "bf16", "bfloat16"))
    if half:
        raise PlanLaunchError(
            f"{plan_name} runs ep {h.ep}, which octodsl's executor runs in fp32 only, but "
            f'{config_name} enables "{half[0]}" (its optimizer reduces every gradient over the '
            "whole data-parallel group, not a routed expert's over its dp / ep copies): disable "
            f"it or drop `ep`"
        )


def plan_config(
    config: dict,
    plan: Plan,
    default_microbatch_size: int | None = None,
    *,
    plan_name: str | None = None,
    config_name: str | None = None,
) -> dict:
    """`config` with the plan's batch sizes (`batch_config`), ZeRO stage (`zero_config`) and
    gradient-accumulation dtype (`accum_config`),
    refused with ep when it runs ZeRO or half precision (`check_ep_precision`); with tp, DeepSpeed's partitioning of pipeline messages over the tp group turned off (the
    executor's messages are whole activations, or under sp each rank's sequence slice), and
    a plan costed with them partitioned (`scatter_gather_messages true`) refused."""
    names = {"plan_name": plan_name, "config_name": config_name}
    check_ep_precision(config, plan, **names)
    config = zero_config(
        batch_config(config, plan, default_microbatch_size, **names), plan, **names
    )
    config = accum_config(config, plan, **names)
    h = plan.header
    if h.tp == 1:
        return config
    if h.scatter_gather_messages and not h.sp:
        raise PlanLaunchError(
            f"{_names(plan, plan_name, config_name)[0]} says `scatter_gather_messages true` (each tp GPU sends 1/tp of a "
            "pipeline message), but octodsl's executor sends whole activations: drop it, or "
            "give `sequence_parallel true`"
        )
    return {
        **config,
        "pipeline": {
            **config.get("pipeline", {}),
            "pipe_partitioned": False,
            "grad_partitioned": False,
        },
    }


def _names(plan: Plan, plan_name: str | None, config_name: str | None) -> tuple[str, str]:
    """How messages name the plan and the config: as given, else 'the plan "NAME"' and 'the
    DeepSpeed config'."""
    return plan_name or f'the plan "{plan.header.name}"', config_name or "the DeepSpeed config"


def _validate(model: type[BaseModel], data: dict, prefix: str, name: str | None):
    try:
        return model.model_validate(data)
    except ValidationError as e:
        raise PlanLaunchError(
            prefix + "; ".join(_problem(err) for err in e.errors()), path=name
        ) from None


def _problem(err: ErrorDetails) -> str:
    where = ".".join(str(p) for p in err["loc"])
    if err["type"] == "extra_forbidden":
        return f"unknown field {where!r} (the fields are {', '.join(OctoSection.model_fields)})"
    # a section given as something else: JSON's word, not pydantic's class name; a check of
    # ours: its own words
    msg = (
        "input should be an object"
        if err["type"] == "model_type"
        else str(err["ctx"]["error"])
        if err["type"] == "value_error"
        else err["msg"]
    )
    given = json.dumps(err["input"], default=str)
    shown = given if len(given) <= _SHOWN else given[: _SHOWN - 3] + "..."
    return f"{where}: {msg[0].lower()}{msg[1:]}, not {shown}"


_SHOWN = 60
"""At most this many characters of a value a message quotes (a config may hold anything)."""


def _json_type(value) -> str:
    return {
        list: "an array",
        str: "a string",
        bool: "a boolean",
        int: "a number",
        float: "a number",
        type(None): "null",
    }.get(type(value), type(value).__name__)
