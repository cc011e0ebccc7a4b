"""The plan IR: one typed object for a whole pipeline plan.

Everything in octodsl produces or consumes a `Plan`: the parser lowers `.octo` text into one,
`gen` and the tuner build them, lint, the simulator and the executor read them.

A Plan may be *invalid* (a gap in the partition, a missing op): it is what the user wrote, and
lint says what is wrong with it. Code past lint (the DAG, the simulator, the executor) may assume
a plan that lints clean; `Plan.stage_device()` raises on an invalid placement.

Ops and slots are slotted dataclasses, not pydantic models: a large plan holds tens of
thousands of them and the tuner builds plans in a loop. The header is validated by pydantic.
"""

from __future__ import annotations

import enum
import re
from dataclasses import dataclass, field

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator

from . import limits
from .errors import OctoError


@dataclass(frozen=True, slots=True)
class Span:
    """A source range, 1-based lines and columns; `end_col` is one past the last character."""

    line: int
    col: int
    end_line: int
    end_col: int


class Recompute(str, enum.Enum):
    """What a stage drops after its forward and recomputes in its backward."""

    NONE = "none"
    """Keep every activation from F to B."""
    FULL = "full"
    """Keep only the stage's input; B runs the stage's forward again first."""
    SELECTIVE = "selective"
    """Drop the activations that are large and cheap to recompute (per layer kind:
    docs/models-and-costs.md); B recomputes them first."""

    def __str__(self) -> str:
        return self.value


class OpKind(str, enum.Enum):
    """What an op computes for one (stage, micro-batch)."""

    F = "F"
    """Forward."""
    B = "B"
    """Backward for the input gradient only; a W op must follow for the weight gradient."""
    W = "W"
    """Backward for the weight gradient only (B was split off)."""
    BW = "BW"
    """Fused full backward: input and weight gradient together."""

    def __str__(self) -> str:
        return self.value


_LABEL = re.compile(r"(BW|F|B|W)(0|[1-9][0-9]{0,11}):(0|[1-9][0-9]{0,11})")
"""An op's label: the kind, then stage and micro-batch in ASCII digits without leading zeros
(so that each op has exactly one label), at most 12 digits (below limits.MAX_INT)."""


@dataclass(frozen=True, slots=True)
class Op:
    """One unit of work: `kind` for micro-batch `mb` on stage `stage`. Its text form is its
    `label` ("F3:5", "BW0:2"), which `Op.parse` reads back; every report, trace and message
    names an op by it."""

    kind: OpKind
    stage: int
    mb: int
    span: Span | None = field(default=None, compare=False, hash=False, repr=False)

    def key(self) -> tuple[OpKind, int, int]:
        return (self.kind, self.stage, self.mb)

    @property
    def label(self) -> str:
        return f"{self.kind.value}{self.stage}:{self.mb}"

    @classmethod
    def parse(cls, text: str) -> Op:
        """The op `text` is the label of; PlanError unless it is exactly one (no spaces, signs,
        leading zeros or non-ASCII digits)."""
        m = _LABEL.fullmatch(text)
        if m is None:
            raise PlanError(
                f"{text!r} is not an op: write the kind (F, B, W or BW), the stage, a "
                "colon and the micro-batch, as in F3:5 or BW0:2"
            )
        return cls(OpKind(m[1]), int(m[2]), int(m[3]))

    def __str__(self) -> str:
        return self.label


@dataclass(frozen=True, slots=True)
class Slot:
    """One step of a device's order: a single op, or an overlap group run together."""

    ops: tuple[Op, ...]
    span: Span | None = field(default=None, compare=False, hash=False, repr=False)

    @property
    def overlapped(self) -> bool:
        return len(self.ops) > 1

    def __str__(self) -> str:
        if len(self.ops) == 1:
            return str(self.ops[0])
        return "(" + " & ".join(str(op) for op in self.ops) + ")"


OVERLAPS = ("overlap_tp_comm", "overlap_grad_reduce", "overlap_param_gather", "overlap_p2p_comm")
"""The header's overlap fields: communication a runtime may hide under compute."""
RUNTIME_SWITCHES = ("grad_accumulation_fusion", "scatter_gather_messages", "reduce_scatter")
"""The runtime fields beside the overlaps (each its own true/false option on the commands)."""
RUNTIME_FIELDS = (*OVERLAPS, *RUNTIME_SWITCHES)
"""Header fields that say how the runtime runs the plan's ops (docs/models-and-costs.md,
"Overlaps")."""


PIPELINE_ZERO = 1
"""The highest ZeRO stage DeepSpeed's pipeline engine, and so octodsl's executor, runs at any
pipeline depth (the executor refuses more; `tune --gpus --target deepspeed` proposes no more)."""

DEEPSPEED, MEGATRON = "deepspeed", "megatron"
RUNTIMES = (DEEPSPEED, MEGATRON)
RUNTIME_NAMES = {DEEPSPEED: "DeepSpeed", MEGATRON: "Megatron-LM"}
ACCUM_DTYPES = ("fp32", "bf16", "fp16")
"""The dtypes a plan's `grad_accum_dtype` names."""
"""The runtimes a plan is costed for: octodsl's executor on DeepSpeed's pipeline engine, and
Megatron-LM (`tune --gpus --target`, the bytes per parameter: octodsl.costs.param_bytes)."""

MEGATRON_ONLY = (
    "overlap_tp_comm",
    "overlap_grad_reduce",
    "overlap_param_gather",
    "grad_accumulation_fusion",
)
"""Runtime fields whose `true` only Megatron-LM runs (octodsl's executor and DeepSpeed's pipeline
engine run each of them the other way: see their `Header` fields)."""


def plan_runtime(h: Header) -> str:
    """The runtime a plan is costed for, for what differs between runtimes (the bytes per
    parameter): its header's `runtime` when written, else the one the header implies:
    Megatron-LM when it asks for what only Megatron runs in a pipeline (`megatron_only`), else
    octodsl's executor on DeepSpeed (docs/models-and-costs.md, "Bytes per parameter and ZeRO")."""
    if h.runtime is not None:
        return h.runtime
    return MEGATRON if megatron_only(h) else DEEPSPEED


def megatron_only(h: Header) -> list[str]:
    """What the header asks for that only Megatron-LM runs in a pipeline, as written in a
    plan: the `MEGATRON_ONLY` fields that are true, and a ZeRO stage above `PIPELINE_ZERO`."""
    found = [f"{name} true" for name in MEGATRON_ONLY if getattr(h, name)]
    return found + ([f"zero {h.zero}"] if h.zero > PIPELINE_ZERO else [])


def runtime_conflict(h: Header) -> str | None:
    """Lint's E407, also what `simulate` and `tune` refuse from their options: a plan for
    DeepSpeed's pipeline engine that asks for what only Megatron-LM runs."""
    found = megatron_only(h) if h.runtime == DEEPSPEED else []
    if not found:
        return None
    return (
        f"runtime deepspeed with {', '.join(found)}: DeepSpeed's pipeline engine, which "
        f"octodsl's executor runs, does not run {'it' if len(found) == 1 else 'them'}"
    )


def deepspeed_zero(h: Header) -> dict:
    """The DeepSpeed config's `zero_optimization` fields a plan's header decides: the stage,
    and under ZeRO `reduce_scatter: false` where the header says so (DeepSpeed's default is
    true), for `convert --to deepspeed` and the executor alike."""
    out: dict = {"stage": h.zero}
    if h.zero > 0 and not h.reduce_scatter:
        out["reduce_scatter"] = False
    return out


def zero_without_copies(zero: int, dp: int) -> str | None:
    """Lint's W404, also what `simulate --zero` and `models --zero` warn of: ZeRO shards over
    the data-parallel copies, and with one copy there is nothing to shard."""
    if zero == 0 or dp > 1:
        return None
    what = "optimizer state" if zero == 1 else "optimizer state and gradients"
    return (
        f"zero {zero} with dp 1: there is only one copy of the pipeline, no other to shard "
        f"the {what} over"
    )


class Header(BaseModel):
    """The `plan "name" { ... }` block."""

    model_config = ConfigDict(extra="forbid")

    name: str
    """Plan name, free text."""
    devices: int = Field(ge=1, le=limits.MAX_DEVICES)
    """Pipeline devices (ranks of one pipeline)."""
    microbatches: int = Field(ge=1, le=limits.MAX_MICROBATCHES)
    """Micro-batches per iteration (gradient-accumulation steps)."""
    model: str | None = None
    """Built-in model name or path to a model spec; None for an abstract plan."""
    microbatch_size: int | None = Field(default=None, ge=1, le=limits.MAX_MICROBATCH_SIZE)
    """Sequences per micro-batch."""
    seq_len: int | None = Field(default=None, ge=1, le=limits.MAX_SEQ_LEN)
    """Tokens per sequence."""
    dp: int = Field(default=1, ge=1, le=limits.MAX_DP)
    """Data-parallel degree: copies of this pipeline."""
    zero: int = Field(default=0, ge=0, le=2)
    """ZeRO stage over the `dp` copies: 0 nothing sharded, 1 the optimizer state (fp32 master
    copy, Adam m and v), 2 the gradients as well."""
    memory: int | None = Field(default=None, ge=1, le=limits.MAX_MEMORY)
    """Memory limit per device, bytes (per GPU of the device's tensor-parallel group)."""
    tp: int = Field(default=1, ge=1, le=limits.MAX_TP)
    """Tensor-parallel degree: GPUs that run each pipeline device's layers together (a
    "device" is then a tp group of GPUs)."""
    sequence_parallel: bool | None = None
    """Megatron's sequence parallelism within the tp group (norms, residuals and the messages
    between stages split along the sequence); None: on when tp > 1 (`Header.sp`)."""
    ep: int = Field(default=1, ge=1, le=limits.MAX_DP)
    """Expert-parallel degree of every MoE layer: the experts spread over `ep` consecutive
    data-parallel copies (Megatron-core carves the ep group out of dp), each holding 1/ep of
    them; ep divides dp and every MoE layer's expert count (`octodsl.models.ep`)."""
    gpus_per_node: int = Field(default=8, ge=1, le=limits.MAX_GPUS_PER_NODE)
    """GPUs per node: which ranks share the intra-node link (octodsl.mesh)."""
    overlap_tp_comm: bool = False
    """The tp collectives run under the GEMMs next to them (Megatron's `--tp-comm-overlap`);
    false: in line, as octodsl's executor runs them (docs/models-and-costs.md, "Overlaps")."""
    overlap_grad_reduce: bool = False
    """The gradients' data-parallel reduction runs in buckets during the last backwards
    (Megatron's `--overlap-grad-reduce`); false: after the last micro-batch, as DeepSpeed's
    pipeline engine (octodsl's executor) reduces them."""
    overlap_param_gather: bool = False
    """Under ZeRO, the updated parameters' all-gather runs under the next iteration's forwards
    (Megatron's `--overlap-param-gather`); false: after the optimizer step."""
    overlap_p2p_comm: bool = True
    """Pipeline sends and receives run beside compute (octodsl's executor; Megatron's
    `--overlap-p2p-comm`); false: each op waits for its own sends to finish (Megatron's
    default 1F1B, DeepSpeed's stock pipeline engine)."""
    scatter_gather_messages: bool = False
    """Without sequence parallelism, each GPU of a tp group sends 1/tp of a pipeline message
    and the receivers gather it over NVLink: Megatron's scatter/gather, and DeepSpeed's stock
    pipeline engine with tp > 1 (`PartitionedTensor`: hard-wired in 0.5 and 0.6, the config's
    `pipeline.pipe_partitioned`, default true, since); false: each sends the whole activation,
    as octodsl's executor does (it refuses true)."""
    grad_accumulation_fusion: bool = False
    """The weight-gradient GEMMs add into the gradient buffer themselves (Megatron's
    `--gradient-accumulation-fusion`, Transformer Engine); false: each micro-batch's weight
    gradient is added by a pass of its own, as autograd does in octodsl's executor."""
    runtime: str | None = None
    """The runtime the plan is costed for (`RUNTIMES`): deepspeed (octodsl's executor on
    DeepSpeed's pipeline engine) or megatron (Megatron-LM), which hold different bytes per
    parameter (octodsl.costs.param_bytes); None: the one the other fields imply
    (`plan_runtime`)."""
    reduce_scatter: bool = True
    """Under ZeRO, the gradients are reduce-scattered to their shards (DeepSpeed's
    `zero_optimization.reduce_scatter`, its default, and Megatron's distributed optimizer);
    false: all-reduced, each copy then updating its shard (DeepSpeed with `reduce_scatter:
    false`, and its BF16 optimizer in the pipeline engine, which BLOOM trained with)."""
    grad_accum_dtype: str | None = None
    """The dtype the gradients are accumulated in over the micro-batches (`ACCUM_DTYPES`;
    DeepSpeed's `data_types.grad_accum_dtype`): what their buffer holds, and what each unfused
    accumulation moves. None: the runtime's default, fp32 for a bf16 model in Megatron-LM, the
    model's dtype in DeepSpeed (octodsl.costs.param_bytes); DeepSpeed takes fp32 for a bf16
    model at zero 1 too, with `reduce_scatter false` (its BF16 optimizer, as BLOOM trained)."""
    spans: dict[str, Span] = Field(default_factory=dict, exclude=True, repr=False)
    """Where each field was written, for diagnostics."""

    @field_validator("runtime", "grad_accum_dtype")
    @classmethod
    def _one_of_names(cls, value: str | None, info: ValidationInfo) -> str | None:
        names = {"runtime": RUNTIMES, "grad_accum_dtype": ACCUM_DTYPES}[str(info.field_name)]
        if value is not None and value not in names:
            raise ValueError(f"must be one of {', '.join(names)}, not {value[:40]!r}")
        return value

    def runtime_changes(self) -> list[tuple[str, bool]]:
        """The runtime fields (RUNTIME_FIELDS) that differ from their defaults, as set."""
        return [
            (name, getattr(self, name))
            for name in RUNTIME_FIELDS
            if getattr(self, name) != Header.model_fields[name].default
        ]

    @property
    def sp(self) -> bool:
        """Whether sequence parallelism is on: as written, else whenever tp > 1."""
        return self.tp > 1 if self.sequence_parallel is None else self.sequence_parallel


@dataclass(slots=True)
class Stage:
    """A stage: the consecutive layers `first..last` (inclusive), or abstract (both None)."""

    first: int | None = None
    last: int | None = None
    symbols: str | None = None
    """The stage's layer-pattern symbols when the partition was written as a pattern."""
    span: Span | None = field(default=None, compare=False, repr=False)
    recompute: Recompute = Recompute.NONE
    """What the stage recomputes (the plan's `recompute` section)."""
    recompute_span: Span | None = field(default=None, compare=False, repr=False)
    """Where the stage's `recompute` line is written."""

    @property
    def abstract(self) -> bool:
        return self.first is None

    @property
    def num_layers(self) -> int:
        return 0 if self.first is None or self.last is None else self.last - self.first + 1

    @property
    def bounds(self) -> tuple[int, int]:
        """(first, last) of a stage that names its layers; PlanError for an abstract one."""
        if self.first is None or self.last is None:
            raise PlanError("an abstract stage names no layers")
        return self.first, self.last


@dataclass(slots=True)
class DevicePlacement:
    """`device D: stages s1, s2, ...` as written."""

    device: int
    stages: tuple[int, ...]
    span: Span | None = field(default=None, compare=False, repr=False)


class PlanError(OctoError):
    """A plan that cannot be interpreted (lint reports the details with positions)."""


@dataclass(slots=True)
class Plan:
    """A whole pipeline plan: header, partition, placement and per-device schedule."""

    header: Header
    stages: list[Stage]
    placement: list[DevicePlacement]
    schedule: list[list[Slot]]
    """schedule[d] is device d's order. Length equals header.devices for a well-formed plan."""
    partition_span: Span | None = field(default=None, compare=False, repr=False)
    placement_span: Span | None = field(default=None, compare=False, repr=False)
    schedule_spans: list[Span | None] = field(default_factory=list, compare=False, repr=False)
    """Where each device's schedule block starts."""
    schedule_span: Span | None = field(default=None, compare=False, repr=False)
    """Where the schedule section is; None for a plan written without one."""

    @property
    def num_stages(self) -> int:
        return len(self.stages)

    @property
    def devices(self) -> int:
        return self.header.devices

    @property
    def microbatches(self) -> int:
        return self.header.microbatches

    def stage_device(self) -> list[int]:
        """Device of each stage; raises PlanError unless every stage is placed exactly once."""
        n = len(self.stages)
        out: list[int | None] = [None] * n
        for entry in self.placement:
            for s in entry.stages:
                if not 0 <= s < n or out[s] is not None:
                    raise PlanError(f"stage {s} is out of range or placed twice")
                out[s] = entry.device
        if any(d is None for d in out):
            raise PlanError("some stage is not placed on any device")
        return out  # type: ignore[return-value]

    def device_stages(self) -> list[list[int]]:
        """Stages held by each device, in the order written."""
        out: list[list[int]] = [[] for _ in range(self.devices)]
        for entry in self.placement:
            if 0 <= entry.device < self.devices:
                out[entry.device].extend(entry.stages)
        return out

    def ops(self):
        """Every op of the schedule as (device, slot index, op)."""
        for d, slots in enumerate(self.schedule):
            for i, slot in enumerate(slots):
                for op in slot.ops:
                    yield d, i, op

    def recompute(self) -> list[Recompute]:
        """What each stage recomputes."""
        return [s.recompute for s in self.stages]

    def split_stages(self) -> list[bool]:
        """Whether each stage splits its backward (uses B + W) rather than a fused BW."""
        split = [False] * self.num_stages
        for _, _, op in self.ops():
            if op.kind is OpKind.W and 0 <= op.stage < self.num_stages:
                split[op.stage] = True
        return split

    def same_as(self, other: Plan) -> bool:
        """Equal in meaning: header values, partition, placement and orders (positions ignored)."""
        return (
            self.header.model_dump() == other.header.model_dump()
            and [(s.first, s.last, s.symbols, s.recompute) for s in self.stages]
            == [(s.first, s.last, s.symbols, s.recompute) for s in other.stages]
            and sorted((p.device, p.stages) for p in self.placement)
            == sorted((p.device, p.stages) for p in other.placement)
            and self.schedule == other.schedule
        )


def placement_loop(num_stages: int, devices: int) -> list[DevicePlacement]:
    """Looped (interleaved) placement: stage s on device s mod devices."""
    return [DevicePlacement(d, tuple(range(d, num_stages, devices))) for d in range(devices)]


def placement_v(num_stages: int, devices: int) -> list[DevicePlacement]:
    """V-shape placement: down the devices and back up, 2 * devices stages, so that device d
    holds stages d and 2 * devices - 1 - d (the first and last stage on device 0)."""
    if num_stages != 2 * devices:
        raise PlanError(f"a V placement needs 2 x devices = {2 * devices} stages, not {num_stages}")
    return [DevicePlacement(d, (d, 2 * devices - 1 - d)) for d in range(devices)]
