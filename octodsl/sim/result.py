"""`SimResult`: the metrics of one simulated iteration, and its timelines on demand.

Metrics are plain numbers and per-device numpy arrays. Those that rank a plan (the iteration
time, the memory peaks) and the data-parallel phase are computed by `simulate`; the rest
(communication under compute, busy and idle seconds, the bubble, all-to-all hidden by overlap
groups, the lower bound) when first read, from what `simulate` keeps: a tuner simulates
hundreds of plans that only their time and peaks rank. The critical path and the per-op
timeline turn arrays into Python objects, so they are methods the caller asks for
(`critical_nodes` gives the path's compute nodes as an array, for the tuner's schedule moves).
"""

from __future__ import annotations

import functools
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from typing import NamedTuple

import numpy as np

from ..plan import Op, OpKind
from .bounds import lower_bound
from .core import NO_PRED, Timeline, hidden_comm, msg_pred_code, send_stream
from .costs import SimCosts
from .dpcomm import CollectiveSpan, DpComm
from .jit import njit
from .links import Links
from .memory import Memory
from .program import KIND_OF_CODE, SimProgram


@dataclass(frozen=True, slots=True)
class Step:
    """One step of the critical path."""

    kind: str
    """'compute', 'message', or at the end of the iteration 'allreduce' or 'reduce-scatter'
    (the gradients' reduction), 'slowed' (a device's compute, longer by the SMs the
    collectives under it held: `DpComm.slowed`), 'update' (the optimizer step), 'all-gather'
    (ZeRO)."""
    label: str
    device: int
    """The device computing or communicating, or a message's sender."""
    start: float
    end: float
    peer: int | None = None
    """A message's receiver."""


@dataclass(frozen=True, slots=True)
class LinkBusy:
    """One kind of transfer in an iteration (SimResult.link_busy)."""

    link: str
    """The link's name."""
    busy: np.ndarray
    """Per device: seconds of its streams on this kind of transfer."""
    total: float
    """Seconds of these transfers, each counted once (a message once, not at both ends)."""


@dataclass(frozen=True, slots=True)
class OpSpan:
    device: int
    kind: str
    stage: int
    mb: int
    start: float
    end: float

    @property
    def op(self) -> Op:
        return Op(OpKind(self.kind), self.stage, self.mb)

    @property
    def label(self) -> str:
        return self.op.label


@dataclass(frozen=True, slots=True)
class MessageSpan:
    """A message, named after the op whose result it carries: 'F3:5' is F3:5's activation,
    'B4:5' B4:5's input gradient."""

    id: int
    src: int
    dst: int
    kind: str
    stage: int
    mb: int
    start: float
    end: float

    @property
    def producer(self) -> Op:
        """The op whose result the message carries."""
        return Op(OpKind(self.kind), self.stage, self.mb)

    @property
    def label(self) -> str:
        return self.producer.label


class Deferred(NamedTuple):
    """What `simulate` keeps for the metrics a SimResult finds when first read."""

    op_seconds: np.ndarray
    """Per op: its seconds alone (before an overlap group's ops share their slot)."""
    work: np.ndarray
    """Per node: the seconds its ops take together (`SimProgram.per_slot`)."""
    cut_time: np.ndarray
    """Per stage: seconds of one message across its cut."""
    grouped_comm: bool
    """Some overlap group holds ops with all-to-alls."""


@dataclass(frozen=True, eq=False)
class SimResult:
    program: SimProgram
    costs: SimCosts
    iteration_time: float
    """Seconds per training step: the pipeline, the data-parallel communication (dpcomm.py),
    the optimizer step and the step's overhead."""
    pipeline_time: float
    """When the last compute op ends."""
    dp_comm: DpComm
    """The data-parallel copies' collectives and the optimizer step's start."""
    memory: Memory
    seconds: float
    """Wall time `simulate` took."""
    # Raw timing, for the timelines and the critical path.
    op_dur: np.ndarray
    node_dur: np.ndarray
    """Per node: the seconds its slot took in the walk."""
    start: np.ndarray
    end: np.ndarray
    pred: np.ndarray
    msg_start: np.ndarray
    msg_end: np.ndarray
    msg_pred: np.ndarray
    stream_log: np.ndarray
    update: np.ndarray
    """Per device: seconds of its optimizer step, from update_start."""
    links: Links
    """The links the pipeline's messages and the data-parallel collectives took."""
    deferred: Deferred = field(repr=False)
    """What the metrics below that a search does not read come from: they are found when
    first read (a tuner simulates hundreds of plans that only their time and peaks rank)."""

    @functools.cached_property
    def busy(self) -> np.ndarray:
        """Per device: compute seconds (with what the gradient reductions under it slowed it:
        `DpComm.slowed`)."""
        return self.program.per_device(self.node_dur) + self.dp_comm.slowed

    @functools.cached_property
    def idle(self) -> np.ndarray:
        """Per device: iteration_time - busy (the bubble)."""
        return self.iteration_time - self.busy

    @functools.cached_property
    def bubble_ratios(self) -> np.ndarray:
        """Per device: idle / iteration_time."""
        t = self.iteration_time
        return self.idle / t if t > 0 else np.zeros(self.devices)

    @property
    def bubble_ratio(self) -> float:
        """All devices' idle time over all devices' time."""
        t = self.iteration_time
        return float(self.idle.sum() / (self.devices * t)) if t > 0 else 0.0

    @functools.cached_property
    def all_to_all_hidden(self) -> np.ndarray:
        """Per device: seconds of its all-to-alls that overlap groups hide under their other
        ops' compute (`SimProgram.per_slot`: what a group saves on its ops in turn)."""
        p, d = self.program, self.deferred
        return p.per_device(p.per_node(d.op_seconds) - d.work)

    @functools.cached_property
    def lower_bound(self) -> float:
        """`bounds.lower_bound` of the plan and its costs."""
        p, d, costs = self.program, self.deferred, self.costs
        total = float(self.node_dur.sum())
        if d.grouped_comm:
            # an op's all-to-all may hide under another op of its group: a stage's (or a
            # layer's) ops then take no less than their compute, which is what the bound may
            # count
            compute = [replace(c, f=c.f - c.ep_f, b=c.b - c.ep_b, bw=None) for c in costs.stages]
            return lower_bound(p, compute, total, d.cut_time)
        return lower_bound(p, costs.stages, total, d.cut_time, costs.layer_work)

    @property
    def efficiency(self) -> float:
        """lower_bound / iteration_time."""
        t = self.iteration_time
        return self.lower_bound / t if t > 0 else 1.0

    @functools.cached_property
    def _pipeline_comm(self) -> tuple[np.ndarray, np.ndarray]:
        """Per device: seconds its streams carry pipeline messages, and the part of them under
        its own compute (`core.hidden_comm`), found when first read: the tuner reads neither,
        and the merge took a fifth of a walk."""
        p = self.program
        idle = np.zeros(p.devices)  # dev_free and comm_free, which hidden_comm does not read
        t = Timeline(
            p.num_nodes,
            self.start,
            self.end,
            self.pred,
            self.msg_start,
            self.msg_end,
            self.msg_pred,
            self.stream_log,
            idle,
            idle,
        )
        return hidden_comm(p.walk_graph, t)

    @functools.cached_property
    def comm(self) -> np.ndarray:
        """Per device: seconds its communication streams are busy (messages, and data-parallel
        collectives on their own stream)."""
        return self._pipeline_comm[0] + self.dp_comm.total

    @functools.cached_property
    def _comm_hidden(self) -> np.ndarray:
        """Per device: communication seconds under its own compute (messages and collectives)."""
        return self._pipeline_comm[1] + self.dp_comm.hidden

    @functools.cached_property
    def comm_exposed(self) -> np.ndarray:
        """Per device: communication seconds not under the device's own compute."""
        return self.comm - self._comm_hidden

    @property
    def overlap_rate(self) -> float:
        """Communication time under compute over all communication time (1 when there is
        none)."""
        total = float(self.comm.sum())
        return float(self._comm_hidden.sum()) / total if total > 0 else 1.0

    @property
    def devices(self) -> int:
        return self.program.devices

    @property
    def dp(self) -> int:
        """Data-parallel copies of the pipeline."""
        return self.dp_comm.dp

    @property
    def zero(self) -> int:
        """The ZeRO stage of the data-parallel communication."""
        return self.dp_comm.zero

    @property
    def allreduce(self) -> np.ndarray:
        """Per device: seconds of its gradient all-reduce (zero 0; 0 when dp = 1)."""
        return self.dp_comm.allreduce

    @property
    def reduce_scatter(self) -> np.ndarray:
        """Per device: seconds of its gradient reduce-scatters (zero >= 1)."""
        return self.dp_comm.reduce_scatter

    @property
    def all_gather(self) -> np.ndarray:
        """Per device: seconds of its all-gather of the updated parameters (zero >= 1)."""
        return self.dp_comm.all_gather

    @property
    def dp_exposed(self) -> np.ndarray:
        """Per device: data-parallel communication seconds not under its own compute."""
        return self.dp_comm.exposed

    @property
    def update_start(self) -> float:
        """When the optimizer step starts, on every device at once."""
        return self.dp_comm.update_start

    @property
    def peak_memory(self) -> np.ndarray:
        return self.memory.peak

    def peak_ops(self) -> list[str | None]:
        """Per device: the op (or overlap group) at which its memory peaks."""
        return [self.program.node_label(n) if n >= 0 else None for n in self.memory.peak_node]

    @property
    def throughput(self) -> float | None:
        """Tokens per GPU per second, when the micro-batch size in tokens is known: a
        pipeline's tokens per iteration over its devices' GPUs (tp per device)."""
        tokens = self.costs.tokens_per_microbatch
        if not tokens or self.iteration_time <= 0:
            return None
        p = self.program
        return p.microbatches * tokens / (self.iteration_time * p.devices * p.plan.header.tp)

    def link_busy(self) -> dict[str, LinkBusy]:
        """Per kind of transfer, the link it took and its busy seconds per device:
        'tp' (the tensor-parallel collectives inside the ops: StageCost.tp_f, tp_b, tp_w of
        every op a device runs, a fused BW both of tp_b and tp_w; named after the intra-node
        link, which `octodsl simulate` costs them on), 'pipeline_intra_node' and
        'pipeline_inter_node' (the messages a device sends or receives, by the cut's link),
        'dp_intra_node' and 'dp_inter_node' (its data-parallel collectives, by where its
        group sits)."""
        p, links = self.program, self.links
        P = p.devices
        tp = self._per_device(*(self.costs.column("tp_" + k) for k in "fbw"))
        out = {"tp": LinkBusy(links.intra.name, tp, float(tp.sum()))}
        seconds = self.msg_end - self.msg_start
        inter = links.cut_inter[p.msg_boundary]
        for key, where, link in (
            ("pipeline_intra_node", ~inter, links.intra),
            ("pipeline_inter_node", inter, links.inter),
        ):
            w = np.where(where, seconds, 0.0)
            busy = np.bincount(p.msg_src_dev, weights=w, minlength=P) + np.bincount(
                p.msg_dst_dev, weights=w, minlength=P
            )
            out[key] = LinkBusy(link.name, busy, float(w.sum()))
        for key, spans, link in (
            ("dp_intra_node", False, links.intra),
            ("dp_inter_node", True, links.inter),
        ):
            busy = np.where(links.dp_inter == spans, self.dp_comm.total - self.dp_comm.tied, 0.0)
            out[key] = LinkBusy((links.dp_given or link).name, busy, float(busy.sum()))
        if self.dp_comm.tied.any():
            out["tied"] = LinkBusy(
                self.dp_comm.tied_link, self.dp_comm.tied, float(self.dp_comm.tied.sum())
            )
        return out

    def exposed(self) -> dict[str, np.ndarray]:
        """Per kind of communication, per device: the seconds not hidden under compute, as the
        plan's overlap fields have the runtime run it. 'tp': the tp collectives left in the ops
        (all of them, but what `overlap_tp_comm` hides under the GEMMs); 'pipeline': messages
        not under the device's compute; 'grad_reduce': the gradients' data-parallel reduction
        not under compute (`overlap_grad_reduce` runs it during the last backwards);
        'param_gather': the parameters' all-gather the iteration waits for
        (`overlap_param_gather` hides it under the next forwards); 'all_to_all': the
        expert-parallel dispatch and combine all-to-alls in the MoE layers' F and B, but what
        an overlap group hides under its other ops (`all_to_all_hidden`); 'tied': the tied
        word embeddings' all-reduce between the two devices that hold a copy (all of it)."""
        tp = self._per_device(
            *(self.costs.column("tp_" + k) - self.costs.column("tp_hidden_" + k) for k in "fbw")
        )
        dpc = self.dp_comm
        pipeline = self.comm_exposed - dpc.exposed
        return {
            "tp": tp,
            "all_to_all": self.all_to_all - self.all_to_all_hidden,
            "pipeline": np.maximum(pipeline, 0.0),
            "grad_reduce": dpc.reduction_exposed,
            "param_gather": dpc.gather_exposed,
            "tied": dpc.tied,
        }

    @property
    def all_to_all(self) -> np.ndarray:
        """Per device: seconds of expert-parallel all-to-alls in the ops it runs (StageCost.ep_f
        of each F, ep_b of each B or fused BW; W has none)."""
        ep_f = self.costs.column("ep_f")
        return self._per_device(ep_f, self.costs.column("ep_b"), np.zeros_like(ep_f))

    def _per_device(self, f: np.ndarray, b: np.ndarray, w: np.ndarray) -> np.ndarray:
        """Per device: per-stage seconds of F, B and W summed over the ops it runs (a fused BW
        both B's and W's)."""
        p = self.program
        per_op = p.per_op(f, b, w, b + w)
        return p.per_device(p.per_node(per_op))

    def ops(self) -> Iterator[OpSpan]:
        """Every op's interval; the ops of an overlap group split their slot in turn."""
        p = self.program
        for n in range(p.num_nodes):
            t = self.start[n]
            for k in range(p.op_ptr[n], p.op_ptr[n + 1]):
                e = t + self.op_dur[k]
                yield OpSpan(
                    int(p.node_dev[n]),
                    KIND_OF_CODE[p.op_kind[k]].value,
                    int(p.op_stage[k]),
                    int(p.op_mb[k]),
                    float(t),
                    float(e),
                )
                t = e

    def messages(self) -> Iterator[MessageSpan]:
        p = self.program
        for m in range(p.num_messages):
            yield MessageSpan(
                m,
                int(p.msg_src_dev[m]),
                int(p.msg_dst_dev[m]),
                KIND_OF_CODE[p.msg_kind[m]].value,
                int(p.msg_stage[m]),
                int(p.msg_mb[m]),
                float(self.msg_start[m]),
                float(self.msg_end[m]),
            )

    def collectives(self) -> Iterator[CollectiveSpan]:
        """The data-parallel collectives, device by device in stream order."""
        return self.dp_comm.spans(self.program)

    def memory_events(self, device: int) -> list[tuple[float, float]]:
        """(time, bytes) each time the device's memory changes, starting from its static bytes."""
        p, mem = self.program, self.memory
        out = [(0.0, float(mem.static[device]))]
        for n in p.order_nodes[p.order_ptr[device] : p.order_ptr[device + 1]]:
            out.append((float(self.start[n]), float(mem.at_start[n])))
            out.append((float(self.end[n]), float(mem.at_end[n])))
        return out

    def critical_path(self) -> list[Step]:
        """The chain of ops, messages, stream waits and end-of-iteration phases that sets the
        iteration time (but the step's fixed overhead), in order: each step starts when the one
        before it ends."""
        p, dpc = self.program, self.dp_comm
        node, msg, spans = self._pipeline_end()
        reductions = []
        for j in spans:
            k = int(dpc.span_op[j])
            kind = dpc.span_kind(j)
            reductions.append(
                Step(
                    kind,
                    p.op(k).label if k >= 0 else kind,
                    int(dpc.span_dev[j]),
                    float(dpc.span_start[j]),
                    float(dpc.span_end[j]),
                )
            )
        steps = self._path_to(node, msg)[::-1] + reductions
        if not spans and node >= 0:
            d = int(p.node_dev[node])
            if dpc.slowed[d] > 0:  # the collectives under its compute made it end later
                t = float(self.end[node])
                steps.append(
                    Step("slowed", "compute slowed by collectives", d, t, t + float(dpc.slowed[d]))
                )
        tail = self.update + dpc.gather_exposed
        if len(tail) and tail.max() > 0:
            d = int(np.argmax(tail))
            if self.update[d] > 0:
                t = dpc.update_start
                steps.append(Step("update", "update", d, t, t + float(self.update[d])))
            if dpc.gather_exposed[d] > 0:
                t = float(dpc.gather_start[d])
                steps.append(
                    Step("all-gather", "all-gather", d, t, t + float(dpc.gather_exposed[d]))
                )
        return steps

    def critical_nodes(self) -> np.ndarray:
        """The compute nodes of `critical_path`, in its order, without making its steps (a
        schedule move reads a hundred of them, and its steps' labels took longer than the
        simulation)."""
        node, msg, _ = self._pipeline_end()
        is_msg, at = _chain(self.pred, self.msg_pred, self.program.msg_src_node, node, msg)
        return at[~is_msg][::-1]

    def _pipeline_end(self) -> tuple[int, int, list[int]]:
        """Where the critical path leaves the pipeline: its last node (or message, the other
        -1), and the reductions after it that set the step's start (their spans, in order)."""
        p, dpc = self.program, self.dp_comm
        spans: list[int] = []  # last first
        node = msg = -1
        reduced = float(dpc.span_end.max()) if len(dpc.span_end) else 0.0
        if reduced > max(self.pipeline_time, float(dpc.compute_end.max(initial=0.0))):
            # The reductions set the step's start: back along the stream that ended last.
            j = int(np.argmax(dpc.span_end))
            while True:
                if dpc.span_tied[j] and dpc.span_dev[j] != dpc.tied_from:
                    # a collective of two devices: the path goes on on the one that started it
                    lo, hi = dpc.span_ptr[dpc.tied_from], dpc.span_ptr[dpc.tied_from + 1]
                    j = lo + int(np.flatnonzero(dpc.span_tied[lo:hi])[0])
                d = int(dpc.span_dev[j])
                k = int(dpc.span_op[j])
                spans.append(j)
                if not dpc.span_held[j]:
                    break
                j -= 1
            if k >= 0:  # zero 2: it started when its W's slot ended
                node = int(np.searchsorted(p.op_ptr, k, side="right") - 1)
            else:
                node, msg = self._last_on(d)
        elif dpc.slowed.any() and dpc.compute_end.max() > self.pipeline_time:
            # a device's compute, slowed by the collectives under it, ended last
            d = int(np.argmax(dpc.compute_end))
            node = int(p.order_nodes[p.order_ptr[d + 1] - 1])
        elif p.num_nodes:
            node = int(np.argmax(self.end))
        return node, msg, spans[::-1]

    def _last_on(self, d: int) -> tuple[int, int]:
        """(node, message): device d's last compute node, or its stream's last message when that
        ended later (the other -1)."""
        p = self.program
        lo, hi = p.order_ptr[d], p.order_ptr[d + 1]
        last_node = int(p.order_nodes[hi - 1]) if hi > lo else -1
        last_msg = -1
        for k in (send_stream(d), send_stream(d) + 1):  # its send and its receive stream
            lo, hi = p.stream_ptr[k], p.stream_ptr[k + 1]
            m = int(self.stream_log[hi - 1]) if hi > lo else -1
            if m >= 0 and (last_msg < 0 or self.msg_end[m] > self.msg_end[last_msg]):
                last_msg = m
        if last_msg >= 0 and (last_node < 0 or self.msg_end[last_msg] > self.end[last_node]):
            return -1, last_msg
        return last_node, -1

    def _path_to(self, node: int, msg: int) -> list[Step]:
        """The pipeline's chain ending at `node` (or message `msg`), last step first."""
        p = self.program
        is_msg, at = _chain(self.pred, self.msg_pred, p.msg_src_node, node, msg)
        # whole arrays to Python at once: a path of hundreds of steps made one element at a time
        # took longer than the simulation
        nodes, msgs = at[~is_msg], at[is_msg]
        compute = zip(
            p.node_labels(nodes),
            p.node_dev[nodes].tolist(),
            self.start[nodes].tolist(),
            self.end[nodes].tolist(),
            strict=True,
        )
        sent = zip(
            p.msg_labels(msgs),
            p.msg_src_dev[msgs].tolist(),
            self.msg_start[msgs].tolist(),
            self.msg_end[msgs].tolist(),
            p.msg_dst_dev[msgs].tolist(),
            strict=True,
        )
        return [
            Step("message", *next(sent)) if m else Step("compute", *next(compute))
            for m in is_msg.tolist()
        ]


@njit
def _chain(pred, msg_pred, msg_src_node, node, msg):
    """The chain of a walk's predecessors ending at `node` (or message `msg`, node -1), last
    first: per step whether it is a message, and its node or message."""
    is_msg = np.zeros(pred.shape[0] + msg_pred.shape[0], np.bool_)
    at = np.zeros(pred.shape[0] + msg_pred.shape[0], np.int64)
    k = 0
    while node >= 0 or msg >= 0:
        if node >= 0:
            at[k] = node
            before = pred[node]
            node = msg = -1
            if before >= 0:
                node = before
            elif before != NO_PRED:
                msg = msg_pred_code(before)
        else:
            is_msg[k] = True
            at[k] = msg
            before = msg_pred[msg]
            if before < 0:
                node, msg = msg_src_node[msg], -1
            else:
                node, msg = -1, before
        k += 1
    return is_msg[:k], at[:k]
