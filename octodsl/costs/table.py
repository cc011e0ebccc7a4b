"""Costs are data: a per-layer table, wherever it came from (analytical model, profiler,
calibration). The simulator and tuner only ever see `StageCost`s built from it."""

from __future__ import annotations

from dataclasses import dataclass, field

from ..partition import plan_partition
from ..plan import Plan


@dataclass(frozen=True, slots=True)
class LayerCost:
    """Costs of one layer for one micro-batch."""

    kind: str
    """Layer kind (attention, mlp, mamba2, ...)."""
    f: float
    """Forward seconds."""
    b: float
    """Input-gradient backward seconds."""
    w: float
    """Weight-gradient backward seconds."""
    act: float
    """Activation bytes held from F until the input-gradient backward."""
    act_w: float
    """Of `act`, the bytes still held after B until W (released at W; a fused BW frees all)."""
    static: float
    """Parameter + gradient + optimizer-state bytes, held all the time."""
    params: int
    """Parameter count."""
    out_bytes: float
    """Bytes of the activation this layer hands to the next (and of the gradient coming back)."""


@dataclass(frozen=True, slots=True)
class StageCost:
    """A stage's costs per micro-batch: the sum of its layers, plus its message sizes."""

    f: float
    b: float
    w: float
    act: float
    act_w: float
    static: float
    send_bytes: float
    """Activation bytes sent to the next stage (the gradient sent back has the same size)."""
    bw: float | None = None
    """A fused backward (BW) op's seconds, when calibration says it differs from b + w."""
    update: float = 0.0
    """Seconds of the optimizer step over the stage's parameters, once per iteration."""


@dataclass(frozen=True, slots=True)
class Link:
    """Point-to-point link: a message of n bytes takes latency + n / bandwidth seconds."""

    name: str
    latency: float
    bandwidth: float
    """Bytes per second; 0 with latency 0 means communication is free."""

    def time(self, nbytes: float) -> float:
        if self.bandwidth <= 0:
            return self.latency
        return self.latency + nbytes / self.bandwidth


@dataclass(frozen=True)
class Calibration:
    """What calibration against real runs adds to a per-layer table (octodsl.calibrate), all of
    it costs that a per-layer profile cannot see. The defaults change nothing."""

    scale: dict[str, float] = field(default_factory=dict)
    """Per op kind (F, B, W, BW): factor on the summed per-layer seconds of the op's stage
    (BW: on b + w), for what running layers back to back in the executor does to them."""
    overhead: dict[str, float] = field(default_factory=dict)
    """Per op kind: seconds the executor adds to each op (launch, bookkeeping)."""
    update_per_param: float = 0.0
    """Optimizer step seconds per parameter, per iteration."""
    step_overhead: float = 0.0
    """Seconds per iteration the pipeline spends synchronising at the step (gradient-norm
    all-reduce, loss broadcast), after every device is done."""
    link: Link | None = None
    """The fitted link between pipeline devices."""
    cores: float | None = None
    """Processors the pipeline's devices share (None: one each, no sharing)."""
    contention: float = 0.0
    """Slowdown of each device's compute per other device computing at the same time (shared
    memory bandwidth and caches), up to `cores` devices."""
    overlap_slowdown: float = 0.0
    """Slowdown of a device's compute while its own messages are in flight."""
    oversubscription: float = 0.0
    """Slowdown of each device's compute per device computing beyond `cores` (time-slicing)."""

    def op_seconds(self, kind: str, layer_seconds: float) -> float:
        return self.scale.get(kind, 1.0) * layer_seconds + self.overhead.get(kind, 0.0)


@dataclass(slots=True)
class CostTable:
    """Per-layer costs of a model on a device, in the model's layer order."""

    layers: list[LayerCost]
    source: str
    """Where the numbers came from, e.g. 'analytical nemotron-h-8b on H800' or a profile path."""
    tokens_per_microbatch: int = 0
    meta: dict = field(default_factory=dict)
    calibration: Calibration | None = None
    """Fitted against real runs (a calibrated profile); None for plain per-layer costs."""

    def layer_work(self) -> list[float]:
        """F + B + W seconds of each layer: what a partition balances."""
        return [layer.f + layer.b + layer.w for layer in self.layers]

    def stage_ranges(self, plan: Plan) -> list[tuple[int, int]]:
        """The (first, last) layers of each stage: the plan's partition, which must cover this
        model's layers exactly, or for a plan that names no layers the split balanced on
        `layer_work` that the executor runs too (`octodsl.partition.plan_partition`). Raises
        PlanError."""
        return plan_partition(plan, len(self.layers), self.layer_work())

    def stage_costs(self, plan: Plan) -> list[StageCost]:
        """Sum layer costs over each stage of the plan's partition (and apply the calibration).
        Raises PlanError when the partition does not fit the model (`stage_ranges`)."""
        return self.range_costs(self.stage_ranges(plan))

    def range_costs(self, ranges: list[tuple[int, int]]) -> list[StageCost]:
        """The StageCost of each (first, last) layer range."""
        out = []
        for first, last in ranges:
            ls = self.layers[first: last + 1]
            f, b, w = sum(l.f for l in ls), sum(l.b for l in ls), sum(l.w for l in ls)
            cal = self.calibration
            extra = {}
            if cal is not None:
                f, b, w, extra["bw"] = (cal.op_seconds("F", f), cal.op_seconds("B", b),
                                        cal.op_seconds("W", w), cal.op_seconds("BW", b + w))
                extra["update"] = cal.update_per_param * sum(l.params for l in ls)
            out.append(StageCost(
                f=f, b=b, w=w, act=sum(l.act for l in ls), act_w=sum(l.act_w for l in ls),
                static=sum(l.static for l in ls), send_bytes=ls[-1].out_bytes, **extra,
            ))
        return out


def uniform_stage_costs(num_stages: int, f: float, b: float, w: float,
                        send_bytes: float = 0.0) -> list[StageCost]:
    """Every stage costs the same (abstract plans, `--costs F=1,B=1,W=1`); one unit of
    activation per micro-batch, half of it kept until W."""
    return [StageCost(f, b, w, 1.0, 0.5, 0.0, send_bytes) for _ in range(num_stages)]
