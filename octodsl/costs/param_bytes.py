"""Bytes per parameter held for training, by dtype, runtime and ZeRO stage: the one place static
memory's per-parameter bytes come from (`CostTable.static_bytes`; docs/models-and-costs.md,
"Bytes per parameter and ZeRO"). Each figure is what the runtime's code allocates and keeps
between iterations, per parameter on one of `dp` data-parallel copies:

Megatron-LM (docs/source/api-guide/dist_optimizer.md, "the theoretical number of bytes per
parameter": bf16 18, with the distributed optimizer 6 + 12/d; fp16 20, 4 + 16/d; fp32 16,
8 + 8/d). Its DDP keeps every gradient in a contiguous `main_grad` buffer, fp32 for bf16
(`validate_args` forces `accumulate_allreduce_grads_in_fp32`), the model's dtype otherwise
(`grad_accumulator_bytes`); the bf16 `.grad` is added into it and freed, or never
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

With `data_types.grad_accum_dtype: fp32` (a plan's `grad_accum_dtype fp32`) at stage 1,
`_do_optimizer_sanity_check` picks the BF16_Optimizer for a bf16 model instead, as BLOOM trained
("FP32 grad accumulation for the pipeline", bigscience tr11-176B-ml chronicles.md): the flat bf16
parameters (2), each `.grad` (2), the whole-model fp32 gradient buffer (4), the sharded master
and Adam state (12/dp); the pipeline engine all-reduces it (`_bf16_reduce_grads`).

Buffers that live only during the optimizer step (DeepSpeed's fp32 gradient partition, the
all-gather's buckets) are not counted.

The gradients' dtypes (`accum_dtype`, `StaticBytes.reduce_bytes`): Megatron-LM accumulates and
reduces a bf16 model's in fp32 (`grad_accumulator_bytes`), others in the model's dtype. DeepSpeed
accumulates in `data_types.grad_accum_dtype` (default the model's dtype: `get_data_types`) and
reduces in `communication_data_type`, the model's dtype for bf16 and fp16 unless a config sets
it (`engine.communication_data_type`; `allreduce_bucket` casts the accumulated gradients to it),
in 0.19 as in 0.6.3 and 0.6.5, the releases of BLOOM's training months.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..models.spec import DTYPE_BYTES
from ..plan import ACCUM_DTYPES, DEEPSPEED, MEGATRON, RUNTIME_NAMES
from .levers import Zero


def grad_accumulator_bytes(dtype: str) -> int:
    """Bytes per element of Megatron-LM's gradient buffer (`main_grad`), which it accumulates
    over the micro-batches in and reduces from: fp32 for a bf16 model (its validate_args forces
    `accumulate_allreduce_grads_in_fp32` with bf16, "bfloat16 requires gradient accumulation
    and all-reduce to be done in fp32"), else the model's dtype."""
    return 4 if dtype == "bf16" else DTYPE_BYTES[dtype]


def default_accum(dtype: str, runtime: str) -> str:
    """The dtype `runtime` accumulates a `dtype` model's gradients in when a plan does not say:
    Megatron-LM's accumulator (`grad_accumulator_bytes`: fp32 for bf16), DeepSpeed's model
    dtype."""
    if runtime == MEGATRON and grad_accumulator_bytes(dtype) != DTYPE_BYTES[dtype]:
        return "fp32"
    return dtype


def accum_problem(
    dtype: str, runtime: str, zero: int, reduce_scatter: bool, accum: str | None
) -> str | None:
    """Why `runtime` does not accumulate a `dtype` model's gradients in `accum` (a plan's
    `grad_accum_dtype`) at ZeRO stage `zero`, as octodsl models it; None when it does (or the
    plan leaves it to the runtime's default)."""
    own = default_accum(dtype, runtime)
    if accum is None or accum == own:
        return None
    who = RUNTIME_NAMES[runtime]
    if runtime == DEEPSPEED and dtype == "bf16" and accum == "fp32":
        if zero != 1:
            return (
                f"grad_accum_dtype fp32 with zero {zero}: DeepSpeed accumulates a bf16 model's "
                "gradients in fp32 at zero 1 only (its BF16 optimizer; at zero 0 it refuses "
                "the mix)"
            )
        if reduce_scatter:
            return (
                "grad_accum_dtype fp32 at zero 1: DeepSpeed's BF16 optimizer, which it runs "
                "then, all-reduces the gradients; give reduce_scatter false"
            )
        return None
    also = " (or fp32 at zero 1)" if runtime == DEEPSPEED and dtype == "bf16" else ""
    return (
        f"grad_accum_dtype {accum}: {who} accumulates a {dtype} model's gradients in {own}"
        f"{also}, not {accum}"
    )


def accumulate_bytes(dtype: str, accum: str) -> int:
    """Bytes per parameter an unfused gradient accumulation moves each micro-batch: it reads the
    new gradient (the model's dtype) and reads and writes the accumulator (`accum`): 2 + 4 + 4
    for bf16 into fp32 (Megatron's `main_grad.add_(grad)`), 2 + 2 + 2 into bf16 (autograd's
    `.grad` in DeepSpeed), 4 + 4 + 4 for fp32."""
    return DTYPE_BYTES[dtype] + 2 * DTYPE_BYTES[accum]


assert set(ACCUM_DTYPES) == set(DTYPE_BYTES)


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


def param_bytes(
    dtype: str, runtime: str, zero: int, dp: int = 1, accum: str | None = None
) -> ParamBytes:
    """Bytes per parameter on one of `dp` copies of a `dtype` model that `runtime` trains at
    ZeRO stage `zero`, its gradients accumulated in `accum` (None: `default_accum`), by part
    (the module's docstring says where each comes from)."""
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
    if dtype == "bf16" and accum == "fp32":  # BF16_Optimizer: .grad and the fp32 buffer
        return ParamBytes(d, d + DTYPE_BYTES["fp32"], 12 / dp)
    return ParamBytes(d, d / (dp if stage.shards_gradients else 1), 12 / dp)


@dataclass(frozen=True, slots=True)
class StaticBytes:
    """A cost table's static bytes under one runtime: its `LayerCost.static` counts `nominal`
    bytes per parameter (the table's `bytes_per_param`), of which the runtime holds
    `param_bytes(dtype, runtime, zero, dp)` on each copy (none when `nominal` is 0)."""

    dtype: str
    runtime: str
    nominal: float
    accum: str | None = None
    """The plan's `grad_accum_dtype` (None: the runtime's default, `default_accum`)."""

    @property
    def weights(self) -> float:
        """Bytes per parameter in the model's dtype: what the parameters' all-gather moves."""
        return float(DTYPE_BYTES[self.dtype])

    @property
    def accum_dtype(self) -> str:
        """The dtype the gradients are accumulated in over the micro-batches."""
        return self.accum or default_accum(self.dtype, self.runtime)

    @property
    def reduce_bytes(self) -> float:
        """Bytes per gradient the data-parallel collectives move: Megatron-LM's accumulator
        (fp32 for bf16), DeepSpeed's `communication_data_type` (the model's dtype)."""
        if self.runtime == DEEPSPEED:
            return float(DTYPE_BYTES[self.dtype])
        return float(grad_accumulator_bytes(self.dtype))

    def accumulation(self, fused: bool) -> float:
        """The factor on a table's `LayerCost.grad_acc` (the pass into Megatron-LM's
        accumulator) for the pass this runtime runs: 0 when the GEMM accumulates itself
        (`grad_accumulation_fusion`)."""
        if fused:
            return 0.0
        table = accumulate_bytes(self.dtype, default_accum(self.dtype, MEGATRON))
        return accumulate_bytes(self.dtype, self.accum_dtype) / table

    def sharded(self, zero: int, dp: int) -> ParamBytes:
        """Bytes per parameter on one of `dp` copies at ZeRO stage `zero`, by part."""
        if self.nominal <= 0:
            return ParamBytes(0.0, 0.0, 0.0)
        return param_bytes(self.dtype, self.runtime, zero, dp, self.accum)

    def per_device(self, zero: int, dp: int) -> float:
        """`sharded(zero, dp)`'s total."""
        return self.sharded(zero, dp).total

    def share(self, zero: int, dp: int) -> float:
        """`per_device` over `nominal`: the factor on a table's `LayerCost.static`."""
        return self.per_device(zero, dp) / self.nominal if self.nominal > 0 else 1.0
