"""Plans -> stock DeepSpeed (`octodsl convert plan.octo --to deepspeed`): a Python snippet
building a `PipelineModule` cut where the plan cuts, and the ds_config fragment of its batch and
ZeRO stage, for users of DeepSpeed's own PipelineEngine rather than octodsl's
(deepspeed_ext/, which runs any plan as written).

DeepSpeed 0.19's PipelineModule takes no explicit cuts: its `partition_method`s ('uniform',
'parameters', 'type:REGEX') each balance a weight over the layers
(`PipelineModule._partition_layers`, ds_utils.partition_uniform / partition_balanced), which
gives the plan's cuts only by chance. The snippet therefore subclasses PipelineModule and sets
`parts` in `_partition_layers`, the method its __init__ calls to choose them, as DeepSpeed's
own methods end: `self.parts` (stage s holds layers parts[s] .. parts[s + 1] - 1) and
`self._set_bounds` for this rank's stage (tests/interop/test_deepspeed_out.py runs it).

Stock DeepSpeed runs one stage per pipeline rank, stage s on rank s, in its 1F1B TrainSchedule
with fused backwards; a plan with other placements is refused (exit 1); another order, or split
backwards, is run as that 1F1B, with a warning. ZeRO-2 is refused by its PipelineEngine
("ZeRO-2 and ZeRO-3 are incompatible with pipeline parallelism"), so `zero 2` is too.
Recompute: every stage `full` is `activation_checkpoint_interval` = the most layers of a stage
(one checkpointed block per stage keeps only its input); anything else has no stock equivalent
(one interval for all stages; no selective form) and is left out with a warning. tp > 1: the
topology gets the model-parallel axis (PipeModelDataParallelTopology); splitting the layers
over it is the layers' own job, which a warning says.
"""

from __future__ import annotations

import json

from ..plan import MEGATRON, Plan, Recompute, deepspeed_zero, megatron_only, plan_runtime
from .export import Export, ExportError, is_generated, plan_cuts


def deepspeed_snippet(plan: Plan, source: str = "") -> Export:
    """The PipelineModule snippet and ds_config of a plan that lints clean; ExportError for a
    plan stock DeepSpeed cannot run with its cuts."""
    cuts = plan_cuts(plan, "DeepSpeed's PipelineModule")
    P, h = plan.devices, plan.header
    if plan.num_stages != P or plan.stage_device() != list(range(P)):
        raise ExportError(
            f"stock DeepSpeed runs one stage per pipeline rank, stage s on rank s, in its 1F1B "
            f"TrainSchedule; this plan has {plan.num_stages} stages on {P} devices"
            + ("" if plan.num_stages != P else " placed otherwise")
            + ": run it with octodsl's engine (deepspeed_ext), which runs any plan"
        )
    if h.zero == 2:
        raise ExportError(
            "stock DeepSpeed's PipelineEngine refuses ZeRO-2 with pipeline "
            "parallelism; use zero 1 (or octodsl's engine)"
        )
    warnings = []
    if not is_generated(plan, "1f1b"):
        split = " (it splits backwards into B and W)" if any(plan.split_stages()) else ""
        warnings.append(
            f"the plan's order{split} is not 1F1B: stock DeepSpeed runs its 1F1B "
            "TrainSchedule over these stages instead (octodsl's engine runs the order)"
        )
    modes = set(plan.recompute())
    interval = 0
    if modes == {Recompute.FULL}:
        interval = max(len(s) for s in cuts.symbols)
    elif modes != {Recompute.NONE}:
        shown = ", ".join(
            f"stage {i}: {m}" for i, m in enumerate(plan.recompute()) if m is not Recompute.NONE
        )
        warnings.append(
            f"the recompute section ({shown}) is left out: stock DeepSpeed "
            "checkpoints every stage alike (activation_checkpoint_interval) and has "
            "no selective form"
        )
    if plan_runtime(h) == MEGATRON:
        asks = megatron_only(h)
        warnings.append(
            "the plan is costed for Megatron-LM"
            + (f" ({', '.join(asks)}, which DeepSpeed does not run)" if asks else "")
            + ": DeepSpeed holds other bytes per parameter; `octodsl simulate --target "
            "deepspeed` costs it as DeepSpeed runs it"
            + (" (with those fields off)" if asks else "")
        )
    if h.tp > 1:
        warnings.append(
            f"tp {h.tp}: the topology has a model-parallel axis of {h.tp}, but a stock "
            "PipelineModule does not split layers over it: the layers must be "
            "tensor-parallel themselves (as Megatron-DeepSpeed's are)"
        )
    mbs = h.microbatch_size or cuts.spec.microbatch_size
    config = {
        "train_micro_batch_size_per_gpu": mbs,
        "gradient_accumulation_steps": h.microbatches,
        "train_batch_size": mbs * h.microbatches * h.dp,
        "zero_optimization": deepspeed_zero(h),
    }
    if h.grad_accum_dtype is not None:
        config["data_types"] = {"grad_accum_dtype": h.grad_accum_dtype}
    if h.tp > 1 and not h.sp:
        # stock DeepSpeed partitions pipeline messages over the tp group unless told not to
        parted = h.scatter_gather_messages
        config["pipeline"] = {"pipe_partitioned": parted, "grad_partitioned": parted}
    return Export(_render(plan, source, cuts.parts, interval, config, warnings), warnings)


def _render(
    plan: Plan, source: str, parts: list[int], interval: int, config: dict, warnings: list[str]
) -> str:
    h = plan.header
    P, layers = plan.devices, parts[-1]
    if h.tp > 1:
        topology = f"PipeModelDataParallelTopology(num_pp={P}, num_mp={h.tp}, num_dp={h.dp})"
        topo_import = "PipeModelDataParallelTopology"
    else:
        topology, topo_import = (
            f"PipeDataParallelTopology(num_pp={P}, num_dp={h.dp})",
            "PipeDataParallelTopology",
        )
    title = (
        f'Stock DeepSpeed for plan "{h.name}"'
        + (f" ({source})" if source else "")
        + (", by `octodsl convert --to deepspeed`.")
    )
    lines = [
        f"# {title}",
        f"# `layers`: {h.model}'s {layers} layers in octodsl's order, one module or LayerSpec per",
        f"# symbol of the pattern `octodsl models {h.model}` prints (the embedding first, the LM",
        "# head with its loss last; attention and MLP are separate layers).",
        *[f"# WARNING: {w}" for w in warnings],
        "from deepspeed.pipe import PipelineModule",
        f"from deepspeed.runtime.pipe.topology import {topo_import}",
        "",
        f"PARTS = {parts}",
        '"""Stage s holds layers PARTS[s] to PARTS[s + 1] - 1 (the plan\'s partition)."""',
        "",
        "",
        "class PlanPipelineModule(PipelineModule):",
        '    """A PipelineModule cut at PARTS: DeepSpeed\'s partition methods balance a weight and',
        '    take no explicit cuts, so this sets them where its __init__ asks for them."""',
        "",
        '    def _partition_layers(self, method="parameters"):',
        "        if len(self._layer_specs) != PARTS[-1] or self.num_stages != len(PARTS) - 1:",
        '            raise ValueError(f"the plan cuts {PARTS[-1]} layers into {len(PARTS) - 1} stages, "',
        '                             f"not {len(self._layer_specs)} into {self.num_stages}")',
        "        self.parts = list(PARTS)",
        "        self._set_bounds(start=self.parts[self.stage_id], stop=self.parts[self.stage_id + 1])",
        "",
        "",
        "def pipeline_module(layers, loss_fn=None, **kwargs):",
        '    """The plan\'s pipeline over `layers`; kwargs go to PipelineModule."""',
        f"    return PlanPipelineModule(layers=layers, loss_fn=loss_fn, topology={topology},",
        f"                              activation_checkpoint_interval={interval}, **kwargs)",
        "",
        "",
        "# ds_config fragment: merge into the config given to deepspeed.initialize.",
        f"DS_CONFIG = {_literal(config)}",
        "",
    ]
    return "\n".join(lines)


def _literal(value, depth: int = 0) -> str:
    """`value` (dicts of strings, numbers and booleans) as a Python literal laid out as
    `json.dumps(value, indent=4)` lays out JSON: the same text, but Python's True and False."""
    if isinstance(value, dict) and value:
        pad = "    " * (depth + 1)
        items = ",\n".join(
            f"{pad}{json.dumps(k)}: {_literal(v, depth + 1)}" for k, v in value.items()
        )
        return "{\n" + items + "\n" + "    " * depth + "}"
    return repr(value) if isinstance(value, bool) else json.dumps(value)
