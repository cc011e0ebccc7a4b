"""Bytes per parameter held for training, by dtype, runtime and ZeRO stage: the one place static
memory's per-parameter bytes come from (`CostTable.static_bytes`; docs/models-and-costs.md,
"Bytes per parameter and ZeRO"). Each figure is what the runtime's code allocates and keeps
between iterations, per parameter on one of `dp` data-parallel copies:

Megatron-LM (docs/source/api-guide/dist_optimizer.md, "the theoretical number of bytes per
parameter": bf16 18, with the distributed optimizer 6 + 12/d; fp16 20, 4 + 16/d; fp32 16,
8 + 8/d). Its DDP keeps every gradient in a contiguous `main_grad` buffer, fp32 for bf16
(`validate_args` forces `accumulate_allreduce_grads_in_fp32`), the model's dtype otherwise
(`models.spec.grad_accumulator_bytes`); the bf16 `.grad` is added into it and freed, or never
made with gradient-accumulation fusion. The distributed optimizer (a plan's `zero 1`) shards the
optimizer state only: its "Key steps" reduce-scatter into the whole gradient buffer in place, so
`zero 2` keeps the buffer whole too. The optimizer state is the fp32 master copy and Adam's m and
v (12), for fp16 also the fp32 main gradients (16), for fp32 m and v (8).

DeepSpeed 0.19 in octodsl's executor, with a config that sets no `data_types` (the executor and
its examples set none; `engine.get_data_types` then accumulates in the model's dtype):
- bf16, zero 0: `engine._do_optimizer_sanity_check` picks the BF16_Optimizer in a pipeline
  (bf16_optimizer.py). `_setup_for_real_optimizer` keeps the flat bf16 parameters (2), a
  whole-model flat gradient buffer in `grad_acc_dtype`, bf16 here (2), and an fp32 master
  partition of 1/dp of the flat parameters with Adam's m and v on it (12/dp: it shards over the
  data-parallel group at stage 0 too); each parameter's bf16 `.grad` stays allocated (2): the
  executor's `_weight_grads` (deepspeed_ext/engine.py) zeroes it with `clear_lp_grads()` and adds
  it with `update_hp_grads(clear_lp_grads=False)`. 2 + (2 + 2) + 12/dp. (fp32 accumulation,
  `data_types.grad_accum_dtype: fp32`, is refused at stage 0: "unsupported mix".)
- bf16 and fp16, zero 1: DeepSpeedZeroOptimizer (zero/stage_1_and_2.py): flat low-precision
  parameters (2), their `.grad` accumulated in place (2; stage 1 does not partition gradients),
  `single_partition_of_fp32_groups` and Adam's state on it (12/dp). 2 + 2 + 12/dp.
- fp16, zero 0: FP16_Optimizer (fp16/fused_optimizer.py): fp16 parameters and gradients, a whole
  fp32 copy (`fp32_groups_flat`) and Adam's m and v: 2 + 2 + 12.
- fp32, zero 0: the plain optimizer: 4 + 4 + 8. zero 1: the ZeRO optimizer's fp32 partition is a
  clone of the parameters' (`weights_partition = ...clone()`): 4 + 4 + 12/dp.
- zero 2 (ZeRO's stage 2, Rajbhandari et al. 2020; DeepSpeed's pipeline engine refuses it, so a
  plan at zero 2 is Megatron's: `plan.plan_runtime`): the gradients sharded too.

Buffers that live only during the optimizer step (DeepSpeed's fp32 gradient partition, the
all-gather's buckets) are not counted.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..models.spec import DTYPE_BYTES, grad_accumulator_bytes
from ..plan import DEEPSPEED, MEGATRON
from .levers import Zero


@dataclass(frozen=True, slots=True)
class ParamBytes:
    """Bytes per parameter held for training, by part."""

    weights: float
    """The parameter in the compute dtype."""
    grads: float
    """Its gradient: what the runtime keeps of it between micro-batches."""
    optimizer: float
    """Optimizer state: fp32 master copy and Adam m and v for a low-precision model."""

    @property
    def total(self) -> float:
        return self.weights + self.grads + self.optimizer


def param_bytes(dtype: str, runtime: str, zero: int, dp: int = 1) -> ParamBytes:
    """Bytes per parameter on one of `dp` copies of a `dtype` model that `runtime` trains at
    ZeRO stage `zero`, by part (the module's docstring says where each comes from)."""
    d = float(DTYPE_BYTES[dtype])
    stage = Zero(zero)
    if runtime == MEGATRON:
        optimizer = {"bf16": 12.0, "fp16": 16.0, "fp32": 8.0}[dtype]
        return ParamBytes(
            d,
            float(grad_accumulator_bytes(dtype)),
            optimizer / (dp if stage.shards_optimizer else 1),
        )
    if runtime != DEEPSPEED:
        raise ValueError(f"unknown runtime {runtime!r}")
    if stage is Zero.NONE:
        if dtype == "bf16":  # BF16_Optimizer: .grad and the flat buffer, master sharded
            return ParamBytes(d, 2 * d, 12 / dp)
        return ParamBytes(d, d, 12.0 if dtype == "fp16" else 8.0)
    return ParamBytes(d, d / (dp if stage.shards_gradients else 1), 12 / dp)


@dataclass(frozen=True, slots=True)
class StaticBytes:
    """A cost table's static bytes under one runtime: its `LayerCost.static` counts `nominal`
    bytes per parameter (the table's `bytes_per_param`), of which the runtime holds
    `param_bytes(dtype, runtime, zero, dp)` on each copy (none when `nominal` is 0)."""

    dtype: str
    runtime: str
    nominal: float

    @property
    def weights(self) -> float:
        """Bytes per parameter in the model's dtype: what the parameters' all-gather moves."""
        return float(DTYPE_BYTES[self.dtype])

    def sharded(self, zero: int, dp: int) -> ParamBytes:
        """Bytes per parameter on one of `dp` copies at ZeRO stage `zero`, by part."""
        if self.nominal <= 0:
            return ParamBytes(0.0, 0.0, 0.0)
        return param_bytes(self.dtype, self.runtime, zero, dp)

    def per_device(self, zero: int, dp: int) -> float:
        """`sharded(zero, dp)`'s total."""
        return self.sharded(zero, dp).total

    def share(self, zero: int, dp: int) -> float:
        """`per_device` over `nominal`: the factor on a table's `LayerCost.static`."""
        return self.per_device(zero, dp) / self.nominal if self.nominal > 0 else 1.0
