"""Costs are data: a per-layer table, wherever it came from (analytical model, profiler,
calibration). The simulator and tuner only ever see `StageCost`s built from it."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace

from ..partition import plan_partition
from ..plan import DEEPSPEED, Header, Plan, PlanError, Recompute, plan_runtime
from .levers import Zero, recomputed
from .param_bytes import StaticBytes, accum_problem


class AccumulationError(PlanError):
    """A plan whose runtime does not accumulate its model's gradients in the dtype it names
    (`CostTable.plan_bytes`)."""


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
    sel_f: float = 0.0
    """Seconds selective recompute adds to B: the forward of what it drops (`sel_act`)."""
    sel_act: float = 0.0
    """Of `act`, the bytes selective recompute drops after F (0: nothing to drop, or a
    measured table that does not know)."""
    tp_f: float = 0.0
    """Of `f`, the seconds of the layer's tensor-parallel collectives (on the tp group's link;
    0 at tp 1)."""
    tp_b: float = 0.0
    """Of `b`, the seconds of its tensor-parallel collectives."""
    tp_w: float = 0.0
    """Of `w`, the seconds of its tensor-parallel collectives (the input's all-gather again
    under sequence parallelism)."""
    tp_hidden_f: float = 0.0
    """Of `tp_f`, the seconds the overlap saves and so are not in `f` (Megatron's
    `--tp-comm-overlap`, the plan's `overlap_tp_comm`; 0 without it): those that run under the
    layer's GEMMs, less what they slow the GEMMs by holding SMs (`devices.CommSms.tp`)."""
    tp_hidden_b: float = 0.0
    tp_hidden_w: float = 0.0
    update: float = 0.0
    """Seconds of the optimizer step over the layer's parameters, unsharded (0: unknown)."""
    grad_acc: float = 0.0
    """Seconds per micro-batch of adding the layer's weight gradient into Megatron-LM's
    gradient buffer (fp32 for a bf16 model) by a pass of its own (0 for a measured W, which
    includes it); a runtime accumulating in another dtype scales it
    (`StaticBytes.accumulation`), a plan with `grad_accumulation_fusion` has the GEMM do it
    instead."""
    host_f: float = 0.0
    """Seconds the host takes to launch the layer's F beyond its kernels' run, which an op pays
    when it starts after waiting for a message (a pipeline's ops; a single device streams its
    ops back to back and hides it): `Overheads.f_seconds`."""
    host_b: float = 0.0
    msg_bytes: float | None = None
    """Bytes one GPU sends across a cut after this layer (None: `out_bytes`): 1/tp of it under
    Megatron's scatter/gather of pipeline messages (the plan's `scatter_gather_messages`)."""
    ep_f: float = 0.0
    """Of `f`, the seconds of the layer's expert-parallel all-to-alls (dispatch and combine, on
    the ep group's links; 0 at ep 1 and for layers without experts)."""
    ep_b: float = 0.0
    """Of `b`, the seconds of the reverse all-to-alls (W has none)."""
    expert_params: int = 0
    """Of `params`, the routed experts' this GPU holds (1 / ep of them): their static bytes are
    sharded over the dp / ep copies that hold the same experts, and their gradients reduced over
    those (`CostTable.range_costs`, `expert_grad_bytes`)."""

    @property
    def expert_fraction(self) -> float:
        """Of the layer's parameters on this GPU, the routed experts' share."""
        return self.expert_params / self.params if self.params else 0.0

    @property
    def message_bytes(self) -> float:
        """Bytes one GPU sends across a cut after this layer."""
        return self.out_bytes if self.msg_bytes is None else self.msg_bytes

    def w_run(self, accumulation: float) -> float:
        """W seconds as a stage runs it: with `accumulation` times the gradient-accumulation
        pass (`StaticBytes.accumulation`: 0 when the GEMM does it)."""
        return self.w + accumulation * self.grad_acc


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
    """Seconds of the optimizer step over the stage's parameters, once per iteration (this
    copy's shard of them under ZeRO)."""
    act_b: float = 0.0
    """Bytes B (or BW) brings back when it starts, by recomputing what F dropped; B releases
    `act + act_b - act_w` when it ends (0 without recompute)."""
    tp_f: float = 0.0
    """Of `f`, seconds of tensor-parallel collectives (LayerCost.tp_f summed)."""
    tp_b: float = 0.0
    """Of `b`, seconds of tensor-parallel collectives (a full recompute's forward included)."""
    tp_w: float = 0.0
    """Of `w`, seconds of tensor-parallel collectives."""
    tp_hidden_f: float = 0.0
    """Of `tp_f`, the seconds `overlap_tp_comm` saves (LayerCost.tp_hidden_f), not in `f`."""
    tp_hidden_b: float = 0.0
    tp_hidden_w: float = 0.0
    ep_f: float = 0.0
    """Of `f`, seconds of expert-parallel all-to-alls (LayerCost.ep_f summed)."""
    ep_b: float = 0.0
    """Of `b`, seconds of expert-parallel all-to-alls (a full recompute's forward included)."""

    @property
    def fused_backward(self) -> float:
        """A fused backward (BW) op's seconds: `bw` where calibration gave one, else b + w."""
        return self.b + self.w if self.bw is None else self.bw


@dataclass(frozen=True, slots=True)
class Link:
    """Point-to-point link: a message of n bytes takes latency + n / bandwidth seconds."""

    name: str
    latency: float
    """Seconds per message."""
    bandwidth: float
    """Bytes per second; 0 with latency 0 means communication is free."""
    source: str = field(default="", compare=False, repr=False)
    """Where the figures come from (a built-in's measurement, a link file's citation); not part
    of what the link is: two links of the same figures are equal."""

    def time(self, nbytes: float) -> float:
        if self.bandwidth <= 0:
            return self.latency
        return self.latency + nbytes / self.bandwidth

    def ring(self, nbytes: float, ranks: int, passes: int) -> float:
        """`passes` times round a ring of `ranks`: each pass is ranks - 1 steps, each moving
        nbytes / ranks to the next rank (a pass moves (ranks - 1) / ranks x nbytes per rank and
        costs ranks - 1 latencies). An all-reduce is 2 passes, a reduce-scatter or an
        all-gather 1 (Patarasuk and Yuan 2009; NCCL's ring algorithms)."""
        return 0.0 if ranks <= 1 else passes * (ranks - 1) * self.time(nbytes / ranks)


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
    _ranges: dict[tuple, StageCost] = field(
        default_factory=dict, init=False, repr=False, compare=False
    )
    """`range_cost` by its arguments (the layers are never changed in place)."""
    _sums: dict[tuple, float] = field(default_factory=dict, init=False, repr=False, compare=False)
    """`grad_params` and `expert_grad_params` by their name and layers, likewise: a tuner costs
    hundreds of new layouts, each stage a range of layers it has mostly summed before."""

    def static_bytes(self, runtime: str = DEEPSPEED, accum: str | None = None) -> StaticBytes:
        """Bytes per parameter `runtime` holds of this table's model (meta `dtype`, default
        bf16), its gradients accumulated in `accum` (None: the runtime's default), against the
        `bytes_per_param` (default 16) its `LayerCost.static` counts."""
        return StaticBytes(
            self.meta.get("dtype", "bf16"),
            runtime,
            float(self.meta.get("bytes_per_param", 16)),
            accum,
        )

    def plan_bytes(self, h: Header) -> StaticBytes:
        """`static_bytes` as a plan's header says: its runtime (`plan_runtime`) and
        `grad_accum_dtype`. Raises PlanError when that runtime does not accumulate in it at the
        header's ZeRO stage (`param_bytes.accum_problem`): AccumulationError."""
        pb = self.static_bytes(plan_runtime(h), h.grad_accum_dtype)
        why = accum_problem(pb.dtype, pb.runtime, h.zero, h.reduce_scatter, h.grad_accum_dtype)
        if why is not None:
            raise AccumulationError(why)
        return pb

    @property
    def ep(self) -> int:
        """The expert-parallel degree the table is costed at (meta `ep`, default 1)."""
        return int(self.meta.get("ep", 1))

    def layer_statics(self, zero: int, dp: int, held: StaticBytes | None = None) -> list[float]:
        """Each layer's static bytes as `held` says (default `static_bytes()`) at ZeRO stage
        `zero` over `dp` copies: its routed experts' part sharded over the dp / ep copies that
        hold the same experts only (as `range_costs` shards a stage)."""
        pb = held or self.static_bytes()
        share = pb.share(zero, dp)
        if self.ep == 1:
            return [share * l.static for l in self.layers]
        experts = pb.share(zero, max(1, dp // self.ep)) - share
        return [(share + experts * l.expert_fraction) * l.static for l in self.layers]

    def grad_params(self, first: int = 0, last: int | None = None) -> float:
        """Gradients of layers `first..last` (default: all) the data-parallel collectives
        reduce, in parameters (`StaticBytes.reduce_bytes` each)."""
        return self._summed("params", first, last)

    def expert_grad_params(self, first: int = 0, last: int | None = None) -> float:
        """Of `grad_params`, the routed experts' (`LayerCost.expert_params`), which under
        expert parallelism are reduced over dp / ep copies only."""
        return self._summed("expert_params", first, last)

    def _summed(self, name: str, first: int, last: int | None) -> float:
        """LayerCost's `name` summed over layers `first..last` (default: to the end);
        remembered."""
        stop = len(self.layers) if last is None else last + 1
        key = (name, first, stop)
        got = self._sums.get(key)
        if got is None:
            got = self._sums[key] = float(
                sum(getattr(layer, name) for layer in self.layers[first:stop])
            )
        return got

    def pipelined(self) -> CostTable:
        """This table for a pipeline's ops, which wait for messages: each layer's host launch
        time (`host_f`, `host_b`) in its F and B (the same table when there is none)."""
        if not any(l.host_f or l.host_b for l in self.layers):
            return self
        layers = [
            replace(l, f=l.f + l.host_f, b=l.b + l.host_b, host_f=0.0, host_b=0.0)
            for l in self.layers
        ]
        return replace(self, layers=layers)

    def layer_work(self) -> list[float]:
        """F + B + W seconds of each layer, W with its gradient-accumulation pass (as octodsl's
        executor runs it): what a partition balances."""
        return [layer.f + layer.b + layer.w + layer.grad_acc for layer in self.layers]

    def stage_ranges(self, plan: Plan) -> list[tuple[int, int]]:
        """The (first, last) layers of each stage: the plan's partition, which must cover this
        model's layers exactly, or for a plan that names no layers the split balanced on
        `layer_work` that the executor runs too (`octodsl.partition.plan_partition`). Raises
        PlanError."""
        return plan_partition(plan, len(self.layers), self.layer_work())

    def stage_costs(
        self, plan: Plan, ranges: list[tuple[int, int]] | None = None
    ) -> list[StageCost]:
        """Sum layer costs over each stage of the plan's partition (`ranges`, default
        `stage_ranges(plan)`), with the plan's recompute, ZeRO sharding and accumulation fusion
        (and the calibration), static bytes and accumulation passes as the plan's runtime runs
        them (`plan_bytes`), F and B with the host's launch time when the plan spans devices
        (`pipelined`). Raises PlanError when the partition does not fit the model, or the
        runtime does not accumulate in the plan's `grad_accum_dtype`."""
        h = plan.header
        ranges = self.stage_ranges(plan) if ranges is None else ranges
        table = self.pipelined() if plan.devices > 1 else self
        held = self.plan_bytes(h)
        costs = table.range_costs(
            ranges, plan.recompute(), h.zero, h.dp, h.grad_accumulation_fusion, held
        )
        copy = self.tied_copy(plan)
        if copy is not None:
            costs[copy] = self._with_copy(
                costs[copy], h.zero, h.dp, h.grad_accumulation_fusion, held
            )
        return costs

    def tied_copy(self, plan: Plan) -> int | None:
        """The stage that holds its own copy of tied word embeddings, if any: the LM head's,
        when the plan puts it on another device than the embedding. DeepSpeed's pipeline
        engine (`TiedLayerSpec`, octodsl's executor included) and Megatron-LM both keep that
        copy, with its gradient and optimizer state, and all-reduce its gradient with the
        embedding's after the last backward (the simulator times it: sim/dpcomm.py)."""
        if not self.meta.get("tied_embeddings"):
            return None
        if self.layers[0].kind != "embedding" or self.layers[-1].kind != "lm_head_loss":
            return None
        devices = plan.stage_device()
        return len(devices) - 1 if devices and devices[0] != devices[-1] else None

    def _with_copy(
        self, cost: StageCost, zero: int, dp: int, fused: bool, held: StaticBytes
    ) -> StageCost:
        """`cost` with the tied embeddings' copy: the embedding's bytes and optimizer step (its
        own stage cost's), and the accumulation of the head's weight gradient into it."""
        emb = self.range_cost(0, 0, Recompute.NONE, zero, dp, fused, held)
        return replace(
            cost,
            static=cost.static + emb.static,
            update=cost.update + emb.update,
            w=cost.w + held.accumulation(fused) * self.layers[0].grad_acc,
        )

    def input_bytes(self, first: int) -> float:
        """Bytes a stage starting at layer `first` receives: the previous layer's output, or
        the token ids the embedding keeps."""
        return self.layers[first - 1].out_bytes if first > 0 else self.layers[0].act

    def range_costs(
        self,
        ranges: list[tuple[int, int]],
        recompute: Sequence[Recompute] = (),
        zero: int = 0,
        dp: int = 1,
        fused_accumulation: bool = False,
        held: StaticBytes | None = None,
    ) -> list[StageCost]:
        """The StageCost of each (first, last) layer range; `recompute[i]` (default none) is
        what range i recomputes, `zero` and `dp` shard its static bytes (as `held` says,
        default `static_bytes()`) and optimizer step (the routed experts' over their dp / ep
        copies); W adds each layer's gradient-accumulation pass as `held`'s runtime runs it,
        unless `fused_accumulation`."""
        return [
            self.range_cost(
                first,
                last,
                recompute[i] if i < len(recompute) else Recompute.NONE,
                zero,
                dp,
                fused_accumulation,
                held,
            )
            for i, (first, last) in enumerate(ranges)
        ]

    def range_cost(
        self,
        first: int,
        last: int,
        mode: Recompute = Recompute.NONE,
        zero: int = 0,
        dp: int = 1,
        fused_accumulation: bool = False,
        held: StaticBytes | None = None,
    ) -> StageCost:
        """One range of `range_costs`, remembered: a tuner's layouts share most of their
        stages (a moved cut changes two)."""
        key = (first, last, mode, zero, dp, fused_accumulation, held or self.static_bytes())
        cost = self._ranges.get(key)
        if cost is None:
            cost = self._ranges[key] = self._sum_range(*key)
        return cost

    def _sum_range(
        self,
        first: int,
        last: int,
        mode: Recompute,
        zero: int,
        dp: int,
        fused_accumulation: bool,
        pb: StaticBytes,
    ) -> StageCost:
        ls = self.layers[first : last + 1]
        f, b = sum(l.f for l in ls), sum(l.b for l in ls)
        accumulation = pb.accumulation(fused_accumulation)
        w = sum(l.w_run(accumulation) for l in ls)
        act, act_w = sum(l.act for l in ls), sum(l.act_w for l in ls)
        tp_f, tp_b, tp_w = (
            sum(l.tp_f for l in ls),
            sum(l.tp_b for l in ls),
            sum(l.tp_w for l in ls),
        )
        hid_f, hid_b, hid_w = (
            sum(l.tp_hidden_f for l in ls),
            sum(l.tp_hidden_b for l in ls),
            sum(l.tp_hidden_w for l in ls),
        )
        again, kept = recomputed(
            mode,
            f,
            act,
            sum(l.sel_f for l in ls),
            sum(l.sel_act for l in ls),
            self.input_bytes(first),
        )
        ep_f, ep_b = sum(l.ep_f for l in ls), sum(l.ep_b for l in ls)
        if mode is Recompute.FULL:  # the whole forward again, its collectives too
            tp_b, hid_b, ep_b = tp_b + tp_f, hid_b + hid_f, ep_b + ep_f
        share = pb.share(zero, dp)
        static = share * sum(l.static for l in ls)
        sharded_update = sum(l.update for l in ls) / (dp if Zero(zero).shards_optimizer else 1)
        ep = self.ep
        if ep > 1:  # the experts' part sharded over their own copies, the dp / ep that hold them
            expert_copies = max(1, dp // ep)
            fraction = [l.expert_fraction for l in ls]
            expert_static = sum(l.static * x for l, x in zip(ls, fraction, strict=True))
            expert_update = sum(l.update * x for l, x in zip(ls, fraction, strict=True))
            static += (pb.share(zero, expert_copies) - share) * expert_static
            if Zero(zero).shards_optimizer:
                sharded_update += expert_update * (1 / expert_copies - 1 / dp)
        cal = self.calibration
        extra = {}
        update = sharded_update
        if cal is not None:
            again = cal.scale.get("F", 1.0) * again
            f, b, w, extra["bw"] = (
                cal.op_seconds("F", f),
                cal.op_seconds("B", b),
                cal.op_seconds("W", w),
                cal.op_seconds("BW", b + w),
            )
            extra["bw"] += again
            update = cal.update_per_param * sum(l.params for l in ls)
            update /= dp if Zero(zero).shards_optimizer else 1  # its shard
        return StageCost(
            f=f,
            b=b + again,
            w=w,
            act=kept,
            act_w=act_w,
            static=static,
            send_bytes=ls[-1].message_bytes,
            act_b=act - kept,
            tp_f=tp_f,
            tp_b=tp_b,
            tp_w=tp_w,
            update=update,
            tp_hidden_f=hid_f,
            tp_hidden_b=hid_b,
            tp_hidden_w=hid_w,
            ep_f=ep_f,
            ep_b=ep_b,
            **extra,
        )


def uniform_stage_costs(
    num_stages: int, f: float, b: float, w: float, send_bytes: float = 0.0
) -> list[StageCost]:
    """Every stage costs the same (abstract plans, `--costs F=1,B=1,W=1`); one unit of
    activation per micro-batch, half of it kept until W."""
    return [StageCost(f, b, w, 1.0, 0.5, 0.0, send_bytes) for _ in range(num_stages)]
