"""What the tuner is asked: a model's per-layer costs (one GPU's share at the header's tp),
devices, micro-batches, a memory limit, the links inside and between nodes and the memory levers
it may pull (ZeRO over dp copies in the header, recompute, what of a given plan it must keep);
and the one way it turns a layout and a schedule into a Plan."""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Iterator, Literal

import numpy as np
from pydantic import ValidationError

from .. import limits
from ..costs.devices import INTER_NODE_LINK, get_device, get_link
from ..costs.resolve import cost_table, header_costing
from ..costs.table import CostTable, Link, StageCost
from ..errors import OctoError
from ..mesh import Mesh
from ..models import load_model
from ..plan import Header, Plan, Recompute, Slot
from ..sim.links import dp_links, dp_rails, dp_spans_nodes
from ..units import size
from .layout import SAVING, StageLayout

AUTO: Literal["auto"] = "auto"
"""`--recompute auto`: the tuner picks each stage's mode."""
RecomputeChoice = Recompute | Literal["auto"]


def recompute_everywhere(plan: Plan, mode: Recompute) -> Plan:
    """`plan` with every stage recomputing `mode`."""
    return replace(plan, stages=[replace(s, recompute=mode) for s in plan.stages])


@dataclass(frozen=True)
class Keep:
    """What of a given plan the tuner must not change (`--keep`)."""

    cuts: tuple[int, ...]
    """The partition: every plan has exactly these stages."""
    devices: tuple[int, ...] | None = None
    """The placement too (None: searched)."""

    @classmethod
    def of(cls, plan: Plan, placement: bool) -> Keep:
        layout = StageLayout.of(plan)
        return cls(layout.cuts, layout.devices if placement else None)

    def allows(self, layout: StageLayout) -> bool:
        return layout.cuts == self.cuts and self.devices in (None, layout.devices)


def check_size(model: str, num_layers: int, devices: int, microbatches: int) -> None:
    """OctoError unless the tuner can work on this many devices and micro-batches: a pipeline
    of 2 or more devices (one device has nothing to partition or place), each holding at
    least one layer, and plans within MAX_OPS with one stage per device and split backwards
    (the fewest ops of the plans it tries)."""
    if devices < 2:
        raise OctoError(f"tune needs at least 2 devices (a pipeline), not {devices}; a single "
                        "device runs every layer in one stage: `octodsl gen 1f1b -p 1 -m "
                        f"{microbatches} --model {model}` writes that plan")
    if devices > num_layers:
        raise OctoError(f"{model} has {num_layers} layers: tune takes 2 to {num_layers} devices "
                        f"(each device holds at least one layer), not {devices}")
    ops = 3 * devices * microbatches
    if ops > limits.MAX_OPS:
        raise OctoError(f"{devices} devices x {microbatches} micro-batches make at least {ops:,} "
                        f"ops per plan, more than octodsl's limit of {limits.MAX_OPS:,}; use "
                        f"at most {limits.MAX_OPS // (3 * devices):,} micro-batches")


@dataclass
class Problem:
    table: CostTable
    """Per layer, one GPU's share at the header's tp (and sequence parallelism)."""
    header: Header
    """Header of every plan the tuner writes: devices, micro-batches, model, memory limit, the
    mesh (dp, tp, gpus_per_node) and ZeRO."""
    link: Link
    """Between pipeline devices of one node (and the dp collectives of a group in one node)."""
    recompute: RecomputeChoice = AUTO
    """What the stages may recompute: AUTO, the tuner picks per stage; a mode, every stage
    recomputes that way (`none` never)."""
    keep: Keep | None = None
    """What every plan keeps of a given one (None: everything is searched)."""
    inter_link: Link | None = None
    """Between nodes: pipeline messages and dp collectives that leave a node (None: `link`)."""
    work: np.ndarray = field(init=False, repr=False)
    """F + B + W seconds of each layer."""

    def __post_init__(self) -> None:
        # A pipeline's ops wait for messages, so each pays the host's launch time: in the
        # layers' F and B here, for the bounds and estimates as for the simulator
        self.table = self.table.pipelined()
        self.work = np.array([l.f + l.b + l.w for l in self.table.layers])

    @classmethod
    def create(cls, model: str, devices: int, microbatches: int, *, device: str = "H800",
               memory: int | None = None, link: str | Link | None = None,
               microbatch_size: int | None = None, seq_len: int | None = None,
               name: str | None = None, dp: int = 1, zero: int = 0,
               recompute: RecomputeChoice = AUTO, inter_link: str | Link | None = INTER_NODE_LINK,
               **mesh) -> Problem:
        """Analytical costs of a model (built-in name or spec path) on a built-in device, one GPU's
        share at `tp` with the tp collectives on `link` (default: the device's node link); `dp`,
        `zero` and `mesh` (header fields: tp, sequence_parallel, gpus_per_node, the runtime
        fields) go into the header of every plan.
        Pipeline messages and dp collectives that leave a node take `inter_link` (None: `link`).
        Raises OctoError with a message for the user."""
        try:
            intra = link if isinstance(link, Link) else get_link(link or get_device(device).node_link)
            header = Header(name=name or f"tuned-{model}-p{devices}-m{microbatches}",
                            devices=devices, microbatches=microbatches, model=model,
                            microbatch_size=microbatch_size, seq_len=seq_len, memory=memory,
                            dp=dp, zero=zero, **mesh)
            table = cost_table(model=model, device=device, tp_link=intra, **header_costing(header))
            check_size(model, len(table.layers), devices, microbatches)
            why = unsplit_sequence(seq_len or load_model(model).seq_len, header.tp, header.sp)
            if why is not None:
                raise OctoError(why)
        except ValidationError as e:  # a value out of the plan header's (or the spec's) range
            first = e.errors()[0]
            raise OctoError(f"{'.'.join(map(str, first['loc']))}: {first['msg']} (given "
                            f"{first['input']!r})") from None
        inter = inter_link if isinstance(inter_link, Link) or inter_link is None else get_link(inter_link)
        return cls(table, header, intra, recompute, inter_link=inter)

    @property
    def mesh(self) -> Mesh:
        return Mesh.of(self.header)

    def dp_links(self) -> list[Link]:
        """Per device, for the bounds: its data-parallel link's latency (octodsl.sim.links: the
        inter-node link when its group spans nodes) with the fastest bandwidth of any device's.
        A plan chooses how many gradient bytes each device holds, so the sum over devices of
        their ring times is at least every device's latencies plus all the bytes on the fastest
        link (one link for all devices: exactly the simulator's sum, whatever the split)."""
        inter = self.inter_link or self.link
        links = dp_links(self.link, inter, dp_spans_nodes(self.mesh), dp_rails(self.mesh))
        bandwidths = [k.bandwidth for k in links]
        best = 0.0 if min(bandwidths) <= 0 else max(bandwidths)  # 0: one of them is free
        return [Link(k.name, k.latency, best) for k in links]

    @property
    def devices(self) -> int:
        return self.header.devices

    @property
    def microbatches(self) -> int:
        return self.header.microbatches

    @property
    def num_layers(self) -> int:
        return len(self.table.layers)

    @property
    def memory(self) -> int | None:
        return self.header.memory

    @property
    def share(self) -> float:
        """The factor ZeRO over the header's dp copies puts on a layer's static bytes. Only what
        reads `LayerCost.static` itself applies it: `CostTable.stage_costs` shards by the
        plan's header already."""
        return self.table.param_bytes.share(self.header.zero, self.header.dp)

    def layer_static(self) -> np.ndarray:
        """Each layer's static bytes on its device, ZeRO applied."""
        return self.share * np.array([l.static for l in self.table.layers], float)

    @property
    def modes(self) -> tuple[Recompute, ...]:
        """The recompute modes a stage may have, least saving first."""
        return SAVING if self.recompute == AUTO else (Recompute(self.recompute),)

    def modes_of(self, layout: StageLayout) -> tuple[Recompute, ...]:
        """What each stage of `layout` recomputes in the plan `skeleton` makes of it: its own
        modes under AUTO, else the problem's mode everywhere."""
        if self.recompute == AUTO:
            return layout.recompute
        return (Recompute(self.recompute),) * layout.num_stages

    def least_kept(self) -> np.ndarray:
        """Per layer, the fewest activation bytes a micro-batch keeps from its forward to its
        input-gradient backward with a recompute mode allowed (full keeps only the stage's
        input, counted as none of any layer's: a true lower bound whatever the cuts)."""
        kept = self._kept()
        return np.min([kept[m] for m in self.modes], axis=0)

    def _kept(self) -> dict[Recompute, np.ndarray]:
        """Per mode, what a micro-batch keeps of each layer from F to B (full: the stage's
        input, counted as none of any layer's)."""
        act, sel_act = (np.array([getattr(l, k) for l in self.table.layers], float)
                        for k in ("act", "sel_act"))
        return {Recompute.NONE: act, Recompute.SELECTIVE: act - sel_act,
                Recompute.FULL: np.zeros_like(act)}

    def allows(self, layout: StageLayout) -> bool:
        """Whether the tuner may produce a plan of this layout (`keep`)."""
        return self.keep is None or self.keep.allows(layout)

    def adopt(self, plan: Plan) -> Plan:
        """`plan` with the problem's recompute mode on every stage (as is under AUTO)."""
        return plan if self.recompute == AUTO else recompute_everywhere(plan, Recompute(self.recompute))

    def lower_bound(self) -> float:
        """No plan runs faster than the largest of: all work spread evenly over the devices; the
        heaviest layer times the micro-batches (a layer is never split); one micro-batch's path
        through every layer (all forwards, the input-gradient backwards down to some layer, its
        W), messages left out since a plan may keep layers together. Unlike the simulator's
        bound, which is a plan's (its stages, its messages), this one holds for every plan of
        the problem, so all are measured against the same number."""
        layers = self.table.layers
        b_from = np.cumsum([l.b for l in reversed(layers)])[::-1]
        path = sum(l.f for l in layers) + float(np.max(b_from + [l.w for l in layers]))
        return max(float(self.work.sum()) * self.microbatches / self.devices,
                   float(self.work.max()) * self.microbatches, path)

    def tight_lower_bound(self) -> float:
        """lower_bound() made tighter by the wait of each layer's device and by the memory limit
        (memory_lower_bound()). The wait: no op of a layer can start before the forwards of the
        layers before it (for the first micro-batch), and after the layer's last input-gradient
        backward come either its remaining W or the backwards of the layers before it. So per
        layer: forwards before + M x (F + B) + max(M x W, backwards before). Where one layer
        outweighs a device's fair share (an LM head on 16 devices), this is what even a perfect
        plan needs, and lower_bound() cannot be reached.

        A true lower bound over every plan the tuner may produce with the levers allowed: its
        work and waits are without recompute time (recompute only adds to B), and its memory
        term counts the fewest bytes the allowed recompute modes hold and the static bytes
        under the header's ZeRO sharding; recompute_lower_bound() weighs the recompute time a
        mode costs against the bytes it saves. The data-parallel collectives no plan avoids
        count too (dp_seconds(), dp_stream_bound())."""
        f, b, w = (np.array([getattr(l, k) for l in self.table.layers]) for k in "fbw")
        before_f = np.cumsum(f) - f
        before_b = np.cumsum(b) - b
        m = self.microbatches
        layer = before_f + m * (f + b) + np.maximum(m * w, before_b)
        before, after = self.dp_seconds()
        return max(max(self.lower_bound(), float(layer.max()), self.memory_lower_bound()) + after,
                   self.microbatches * float(self.work.sum()) / self.devices + before + after,
                   self.recompute_lower_bound(), self.dp_stream_bound())

    def dp_seconds(self) -> tuple[float, float]:
        """What the data-parallel collectives add to any plan's iteration, on average over the
        devices (octodsl.sim.dpcomm's model), as (before, after) the optimizer step: before it,
        each device's gradient all-reduce (zero 0) or reduce-scatter (zero 1) runs after its
        own compute (zero 2's reduce-scatters overlap later compute: none counted); after it
        (the step waits for all of them and for the last compute), each device's all-gather of
        the parameters (zero 1 and 2). Ring times are linear in the bytes plus a latency per
        device, so their sum over the devices is the same however the layers are split (with
        devices on different links, at least `dp_links()`'s): so
        T >= (all compute + P x before) / P + after, and T >= (the pipeline) + after."""
        from ..sim.bounds import (ring_all_gather_time, ring_allreduce_time,
                                  ring_reduce_scatter_time)

        h, P = self.header, self.devices
        if h.dp <= 1:
            return 0.0, 0.0
        even = np.full(P, self.table.grad_bytes() / P)
        links = self.dp_links()
        gathered = even * self.table.param_bytes.weights / self.table.grad_reduce_bytes
        after = float(ring_all_gather_time(gathered, h.dp, links).sum()) / P if h.zero >= 1 else 0.0
        if h.zero == 0:
            return float(ring_allreduce_time(even, h.dp, links).sum()) / P, after
        if h.zero == 1:
            return float(ring_reduce_scatter_time(even, h.dp, links).sum()) / P, after
        return 0.0, after

    def dp_stream_bound(self) -> float:
        """Under zero 2, no plan runs faster than its data-parallel streams: each W (or BW) is
        followed by a reduce-scatter of its stage's gradient bytes on its device's stream, one
        after another, and the step waits for the last; so T >= (all devices' M reduce-scatters
        of all their bytes) / P + the all-gather after the step (dp_seconds()), the sum the same
        however the layers are split and more stages only adding latencies. 0 otherwise. It
        binds where the gradients are large for the compute (jamba-v0.1, qwen3-next-80b)."""
        from ..sim.bounds import ring_reduce_scatter_time

        h, P = self.header, self.devices
        if h.zero < 2 or h.dp <= 1:
            return 0.0
        even = np.full(P, self.table.grad_bytes() / P)
        stream = self.microbatches * float(ring_reduce_scatter_time(even, h.dp, self.dp_links()).sum())
        return stream / P + self.dp_seconds()[1]

    def memory_lower_bound(self) -> float:
        """No plan within the memory limit runs faster than this (0 without a limit, inf when
        the static bytes alone overflow the devices). A micro-batch holds a layer's activations
        from the start of its forward to the end of its input-gradient backward, at least the F
        and B of that layer and of every later one, and the part kept for W through W too. In
        an iteration of T seconds the devices offer T x (P x limit - all static bytes)
        byte-seconds beside the static bytes, so T >= M x (byte-seconds held per micro-batch) /
        (P x limit - all static bytes). It binds when the memory left beside the parameters
        throttles the micro-batches in flight (nemotron-h-56b on 16 devices of 80 GiB).

        With recompute, a micro-batch keeps `least_kept()` of a layer from F to B, holds the
        rest only while its stage's B runs (at least the layer's B), and the part for W until
        W as before; static bytes are ZeRO-sharded (`share`)."""
        if self.memory is None:
            return 0.0
        _, held = self._per_mode()
        return float(held.min(axis=0).sum())

    def recompute_lower_bound(self) -> float:
        """The work and memory terms together, over the recompute modes allowed: per layer, a
        mode costs its recompute seconds on some device (all work / P) and its byte-seconds in
        the memory left beside the static bytes (memory_lower_bound()). For any choice of
        modes T >= max(work / P, memory term) >= l x work / P + (1 - l) x memory term for every
        l in [0, 1], and the right side is smallest with each layer's own best mode for that l:
        so the largest of these minima over l is a lower bound whatever modes a plan picks
        (stages pick per stage, which is one of the per-layer choices). It binds where memory
        forces recompute and recompute costs time (nemotron-h-56b on 8 devices of 80 GiB).
        The data-parallel collectives (dp_seconds()) add to the work side before and after the
        step, to the memory side (the pipeline's time) after it."""
        extra, held = self._per_mode()
        work = self.microbatches * self.work / self.devices
        before, after = self.dp_seconds()  # the data-parallel collectives, on both sides
        if self.memory is None:
            return float((work + extra.min(axis=0)).sum()) + before + after
        if not np.isfinite(held).all():
            return math.inf

        def g(lam: float) -> float:
            return (float((lam * (work + extra) + (1 - lam) * held).min(axis=0).sum())
                    + lam * before + after)

        # g is concave (a minimum of linear functions of l): a ternary search finds its top;
        # every value it computes is a lower bound, so the largest seen is one.
        lo, hi = 0.0, 1.0
        best = max(g(0.0), g(1.0))
        for _ in range(60):
            a, b = lo + (hi - lo) / 3, hi - (hi - lo) / 3
            ga, gb = g(a), g(b)
            best = max(best, ga, gb)
            lo, hi = (a, hi) if ga < gb else (lo, b)
        return best

    def _per_mode(self) -> tuple[np.ndarray, np.ndarray]:
        """Per allowed mode (rows) and layer (columns): the recompute seconds the layer adds to
        an iteration over the devices (M x extra B seconds / P), and the seconds its held
        byte-seconds take of the memory left beside the static bytes (inf when none is left;
        0 without a limit)."""
        layers = self.table.layers
        f, b, w, act, act_w, sel_f = (np.array([getattr(l, k) for l in layers], float)
                                      for k in ("f", "b", "w", "act", "act_w", "sel_f"))
        later = np.cumsum((f + b)[::-1])[::-1]  # F + B of each layer and all after it
        kept = self._kept()
        # The seconds B runs again.
        again = {Recompute.NONE: np.zeros_like(f), Recompute.SELECTIVE: sel_f, Recompute.FULL: f}
        M = self.microbatches
        extra = np.array([M * again[m] / self.devices for m in self.modes])
        bytes_s = np.array([M * (kept[m] * later + (act - kept[m]) * b + act_w * w)
                            for m in self.modes])
        if self.memory is None:
            return extra, np.zeros_like(bytes_s)
        room = self.devices * float(self.memory) - float(self.layer_static().sum())
        if room <= 0:
            return extra, np.where(bytes_s > 0, math.inf, 0.0)
        return extra, bytes_s / room

    def why_no_plan_fits(self, advice: bool = True) -> str | None:
        """Why no partition can fit the memory limit, for the user; None when some may. A
        device holds its layers' static bytes (ZeRO-sharded) all the time and, while its
        deepest stage runs the first micro-batch, what that micro-batch keeps of all its layers
        (`least_kept()`), and while a stage's B runs all of its activations: so the static
        bytes, what one micro-batch keeps of all layers and the most any layer brings back must
        fit in all the devices' memory together, and each layer's static bytes and activations
        in one device's. (memory_lower_bound() is finite whenever this is None.) With `advice`
        the message goes on to name the levers that would make room (`_levers_hint`) and, for
        all layers, the devices that would; without, it is the cause alone (for a caller that
        gives its own advice, as `tune --gpus` names GPUs)."""
        short = self._static_room()
        if short is None:
            return None
        limit = self.memory
        assert limit is not None, "only a memory limit leaves no room"
        layers = self.table.layers
        P = self.devices
        total, need, layer = short
        if layer is None:
            cause = (f"no plan fits in {size(limit)} per device: on {P} devices the parameters, "
                     f"gradients and optimizer state take {size(total / P)} per device "
                     f"({self.sharding()}) and one micro-batch's activations "
                     f"{size(need / P)} more{self._recompute_note()}")
            return cause if not advice else (
                cause + "; use " + self._levers_hint(need, limit)
                + f"at least {math.ceil((total + need) / limit)} devices, a larger memory "
                "limit or smaller micro-batches")
        cause = (f"no plan fits in {size(limit)} per device: layer {layer} ({layers[layer].kind}) "
                 f"alone holds {size(total + need)} with one micro-batch's "
                 f"activations ({self.sharding()})")
        return cause if not advice else (
            cause + "; use " + self._levers_hint(need, limit, layer=layer)
            + "a larger memory limit or smaller micro-batches")

    def _static_room(self) -> tuple[float, float, int | None] | None:
        """None when why_no_plan_fits() finds room; else (static bytes, activation bytes, None)
        of all the layers when they overflow all the devices, or (static, activations, i) of
        a layer i that overflows one device."""
        limit = self.memory
        if limit is None:
            return None
        static = self.layer_static()
        act = np.array([l.act for l in self.table.layers], float)
        kept = self.least_kept()
        need = float(kept.sum() + (act - kept).max())
        total = float(static.sum())
        if total + need > self.devices * limit:
            return total, need, None
        i = int(np.argmax(static + act))
        if static[i] + act[i] > limit:
            return float(static[i]), float(act[i]), i
        return None

    def sharding(self) -> str:
        """'zero 1, dp 8' (and ', tp 4' at tp > 1): the levers the static bytes are split by."""
        h = self.header
        return f"zero {h.zero}, dp {h.dp}" + (f", tp {h.tp}" if h.tp > 1 else "")

    def _recompute_note(self) -> str:
        if self.recompute == AUTO:
            return " even with recompute"
        return "" if self.recompute == Recompute.NONE else f" with {self.recompute} recompute"

    def _levers_hint(self, need: float, limit: int, layer: int | None = None) -> str:
        """The memory levers not pulled yet that would leave room: ZeRO over enough copies,
        recompute, a larger tp; '' when none would."""
        h = self.header
        raw = np.array([l.static for l in self.table.layers], float)
        pb = self.table.param_bytes
        fits = (lambda share: share * raw[layer] + need <= limit) if layer is not None else (
            lambda share: share * float(raw.sum()) + need <= self.devices * limit)
        hints = []
        for zero in (1, 2):
            if zero <= h.zero:
                continue
            dp = next((d for d in (max(h.dp, 2), 4, 8, 16, 32, 64) if d >= h.dp
                       and fits(pb.share(zero, d))), None)
            if dp is not None:
                per = pb.share(zero, dp) * (float(raw[layer]) if layer is not None
                                            else float(raw.sum()) / self.devices)
                hints.append(f"ZeRO (`--zero {zero} --dp {dp}` leaves {size(per)} static per "
                             f"{'device' if layer is None else 'layer'}, more copies less)")
                break
        if self.recompute != AUTO and layer is None:
            hints.append("recompute (`--recompute auto`)")
        tp = self.tp_that_fits()
        if tp is not None:
            hints.append(f"tensor parallelism (`--tp {tp}` splits every layer over {tp} GPUs)")
        return "".join(h + ", " for h in hints)

    def tp_that_fits(self) -> int | None:
        """The smallest of `larger_tps()` at which why_no_plan_fits() finds nothing; None if
        none."""
        return next((tp for tp, other in self.larger_tps() if other._static_room() is None), None)

    def larger_tps(self) -> Iterator[tuple[int, Problem]]:
        """Each tp above the header's that keeps a tp group in a node (divides gpus_per_node)
        and that the model splits over, smallest first, with this problem at that tp (none for
        costs that are not a built-in device's analytical ones)."""
        h = self.header
        if h.model is None or "device" not in self.table.meta or self.table.meta.get("profile"):
            return
        for tp in range(h.tp + 1, h.gpus_per_node + 1):
            if h.gpus_per_node % tp:
                continue
            try:
                yield tp, self.at_tp(tp)
            except OctoError:  # the model does not split over this tp
                continue

    def at_tp(self, tp: int) -> Problem:
        """This problem at a larger tensor-parallel degree: its costs again at that tp (sequence
        parallelism as the header says, by default on), the same levers. OctoError when the
        model does not split over `tp`."""
        h = self.header.model_copy(update={"tp": tp})
        m = self.table.meta
        table = cost_table(model=h.model, device=m["device"], tp_link=self.link,
                           **header_costing(h))
        return replace(self, table=table, header=h)

    def skeleton(self, layout: StageLayout) -> Plan:
        """A plan with the layout's partition, placement and recompute (`modes_of`) and an
        empty schedule."""
        stages = layout.with_recompute(self.modes_of(layout)).stages()
        return Plan(self.header.model_copy(), stages, layout.placement(self.devices),
                    [[] for _ in range(self.devices)])

    def stage_costs(self, plan: Plan) -> list[StageCost]:
        return self.table.stage_costs(plan)

    def with_schedule(self, plan: Plan, schedule: list[list[Slot]]) -> Plan:
        return replace(plan, schedule=schedule)


def unsplit_sequence(seq_len: int, tp: int, sequence_parallel: bool) -> str | None:
    """Why sequence parallelism cannot split a sequence over the tp group (lint's E703), or
    None: its length must be a multiple of tp."""
    if tp == 1 or not sequence_parallel or seq_len % tp == 0:
        return None
    return (f"sequence parallelism splits the sequence over tp {tp}, but its length {seq_len} "
            f"is not a multiple of {tp} (give a --seq-len that is, or --sequence-parallel false)")
