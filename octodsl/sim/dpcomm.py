"""The end of an iteration across the data-parallel copies: each device reduces its stages'
gradients over the `dp` copies of its pipeline position, every device takes its optimizer step,
and under ZeRO each gathers the updated parameters back.

Each device has a data-parallel stream on its dp link (links.py: the inter-node link when its
group spans nodes), beside its message stream (a collective runs on its own communicator); the
collectives' times are bounds.py's ring formulas.
- zero 0: one all-reduce of the device's gradient bytes, once its compute and its messages are
  done. It does not overlap the cool-down: DeepSpeed's pipeline engine reduces after the last
  micro-batch.
- zero 1: the all-reduce split in its two halves (the same bytes in ring algorithms): a
  reduce-scatter where the all-reduce was (no overlap either), then the optimizer step on this
  copy's shard (StageCost.update is already divided by dp), then an all-gather of the updated
  parameters (in the model's dtype, as many bytes as the gradients).
- zero 2: gradients stay sharded while they accumulate, so each W (or fused BW) is followed by a
  reduce-scatter of its stage's gradient bytes (DeepSpeed's stage-2 semantics: M times zero 1's
  volume), queued one after another on the device's data-parallel stream, from the end of the
  W's slot (results leave an overlap group when it ends). They overlap the device's later
  compute, the cool-down included; then the step and the all-gather as zero 1.
- `reduce_scatter false` (zero >= 1): each reduce-scatter above is an all-reduce instead (twice
  its ring passes), every copy then updating only its shard: DeepSpeed with
  `zero_optimization.reduce_scatter: false`, and DeepSpeed's BF16 optimizer in the pipeline
  engine (`_bf16_reduce_grads` all-reduces the gradients; BLOOM trained so).
The gradient bytes are the runtime's (`SimCosts.grad_reduce_bytes`: fp32 for a bf16 model in
Megatron-LM, the model's dtype in DeepSpeed).
- expert parallelism (`ep` > 1): the routed experts' share of a stage's gradients (and, under
  ZeRO, of its parameters) goes round a ring of the dp / ep copies that hold the same experts
  (the expert-data-parallel group), the rest round all dp copies, one after the other on the
  same stream and link (`_ring_seconds`; the expert group is a subset of the dp group's ranks).
- tied word embeddings (`TiedReduce`, a copy on the LM head's device): the two copies'
  gradients are all-reduced between the embedding's device and the head's, a blocking
  collective of the two (it starts when both are ready), in the runtime's order: DeepSpeed's
  pipeline engine before the data-parallel reduction (`ReduceTiedGrads`, then `ReduceGrads`,
  0.19's TrainSchedule; `_exec_reduce_tied_grads` reduces the BF16 optimizer's fp32 `_hp_grad`,
  else `.grad`), Megatron-LM after it (`finalize_model_grads`: `finish_grad_sync`, then
  `_allreduce_word_embedding_grads` of the fp32 `main_grad`; the same order in 2021's
  `train_step`). Nothing of it is under compute.
The optimizer step starts on every device at once, when the last compute op has ended and every
device's gradients are reduced (DeepSpeed synchronises the pipeline there); each device's
all-gather starts when its own step ends.

Megatron's overlaps (the plan's header, docs/models-and-costs.md "Overlaps"):
- `overlap_grad_reduce` (zero 0 and 1): the gradients are reduced in buckets (BUCKET_PARAMS
  parameters, megatron-core's default) as the last micro-batch's backward produces them, a
  stage's once its last W (or BW) starts: its collective starts with that op (or when the stream
  is free) and ends no sooner than that op's end plus one bucket's share of it (the last bucket
  is ready only when the op ends).
- `overlap_param_gather` (zero >= 1): each bucket's all-gather runs under the next iteration's
  forwards, which need the parameters bucket by bucket: the first bucket's is exposed, and
  what the device's forwards cannot cover (the all-gather beyond its F seconds).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

import numpy as np

from ..costs.levers import Zero
from ..costs.table import Link
from ..plan import Op, OpKind
from .bounds import ring_all_gather_time, ring_reduction_time
from .core import Timeline
from .jit import njit
from .program import KIND_CODE, SimProgram

TIED = "tied-allreduce"
"""The collective kind of the tied embeddings' all-reduce."""
_W = KIND_CODE[OpKind.W]
_BW = KIND_CODE[OpKind.BW]

BUCKET_PARAMS = 40_000_000
"""Parameters per gradient bucket: megatron-core's default, max(40M, 1M x dp)
(`DistributedDataParallelConfig.bucket_size`)."""


def buckets(params: np.ndarray, dp: int) -> np.ndarray:
    """Gradient buckets of each stage's `params` parameters over `dp` copies (at least 1)."""
    size = max(BUCKET_PARAMS, 1_000_000 * dp)
    return np.maximum(1, np.ceil(np.asarray(params, float) / size)).astype(np.int64)


@dataclass(frozen=True, slots=True)
class TiedReduce:
    """The all-reduce of tied word embeddings' two copies' gradients (module docstring)."""

    seconds: float
    devices: tuple[int, int]
    """The embedding's device and the LM head's."""
    first: bool
    """Before the data-parallel reduction (DeepSpeed's order), else after it (Megatron-LM's)."""
    link: str
    """The name of the link between the two devices."""


@dataclass(frozen=True, slots=True)
class CollectiveSpan:
    """One data-parallel collective on a device's data-parallel stream."""

    device: int
    kind: str
    """'allreduce', 'reduce-scatter', 'all-gather' or 'tied-allreduce' (the two copies of tied
    word embeddings)."""
    start: float
    end: float
    after: Op | None = None
    """Under zero 2: the W (or BW) whose gradients the reduce-scatter carries."""

    @property
    def label(self) -> str:
        return self.kind if self.after is None else f"{self.kind} {self.after.label}"


@dataclass(frozen=True, eq=False)
class DpComm:
    """Per device, seconds on its data-parallel stream, and when each collective runs."""

    zero: int
    dp: int
    allreduce: np.ndarray
    """Per device: seconds of its gradient all-reduce (zero 0, dp > 1; else 0)."""
    reduce_scatter: np.ndarray
    """Per device: seconds of its gradient reduce-scatters, all of them (zero >= 1)."""
    all_gather: np.ndarray
    """Per device: seconds of its all-gather of the updated parameters (zero >= 1)."""
    reduction_hidden: np.ndarray
    """Per device: of its gradient reduction's seconds, the ones its overlap saves: under its
    own compute, less what they slow it (`slowed`)."""
    span_ptr: np.ndarray
    """CSR offsets: device d's gradient reductions, in stream order, are span_ptr[d]:span_ptr[d + 1]."""
    span_dev: np.ndarray
    """Per reduction: its device."""
    span_start: np.ndarray
    span_end: np.ndarray
    span_op: np.ndarray
    """Per reduction: the op (numbered as SimProgram.op_ptr) it follows under zero 2, else -1."""
    span_held: np.ndarray
    """Per reduction: True when it waited for the one before it on the stream."""
    update_start: float
    """When the optimizer step starts, on every device at once."""
    gather_start: np.ndarray
    """Per device: when its all-gather starts (its step's end)."""
    gather_exposed: np.ndarray
    """Per device: the seconds of its all-gather the iteration waits for (all of it, but the
    part under the next forwards with `overlap_param_gather`, which costs the forwards the
    SMs it holds)."""
    reduction_kind: str
    """The gradients' collective, 'allreduce' or 'reduce-scatter' (`Zero.reduction`)."""
    tied: np.ndarray
    """Per device: seconds of the tied embeddings' all-reduce (on the two devices that hold a
    copy; else 0)."""
    span_tied: np.ndarray
    """Per span: True for the tied embeddings' all-reduce (one span on each of its devices)."""
    tied_from: int
    """The device whose readiness started the tied all-reduce (-1: none)."""
    tied_link: str
    """The name of the link it took ('' without one)."""
    slowed: np.ndarray
    """Per device: seconds its compute runs longer for the gradient reductions under it (the
    SMs they hold), counted at its compute's end; not in `reduction_hidden`."""
    compute_end: np.ndarray
    """Per device: when its compute ends, `slowed` included."""

    def span_kind(self, j: int) -> str:
        """Span j's collective."""
        return TIED if self.span_tied[j] else self.reduction_kind

    @property
    def hidden(self) -> np.ndarray:
        """Per device: data-parallel seconds under its own compute (this iteration's, or the
        next one's forwards for an overlapped all-gather)."""
        return self.reduction_hidden + self.all_gather - self.gather_exposed

    @property
    def total(self) -> np.ndarray:
        """Per device: seconds of data-parallel communication (the tied all-reduce included)."""
        return self.allreduce + self.reduce_scatter + self.all_gather + self.tied

    @property
    def exposed(self) -> np.ndarray:
        """Per device: data-parallel communication seconds not under its own compute."""
        return self.total - self.hidden

    @property
    def reduction(self) -> np.ndarray:
        """Per device: seconds of its gradient reduction (all-reduce or reduce-scatters)."""
        return self.allreduce + self.reduce_scatter

    @property
    def reduction_exposed(self) -> np.ndarray:
        """Per device: of its gradient reduction, the seconds not under its own compute."""
        return self.reduction - self.reduction_hidden

    def spans(self, program: SimProgram) -> Iterator[CollectiveSpan]:
        """Every collective, device by device in stream order."""
        for d in range(len(self.span_ptr) - 1):
            for j in range(self.span_ptr[d], self.span_ptr[d + 1]):
                k = int(self.span_op[j])
                yield CollectiveSpan(
                    d,
                    self.span_kind(j),
                    float(self.span_start[j]),
                    float(self.span_end[j]),
                    program.op(k) if k >= 0 else None,
                )
            if self.all_gather[d] > 0:
                start = float(self.gather_start[d])
                yield CollectiveSpan(d, "all-gather", start, start + float(self.all_gather[d]))


def dp_comm(
    p: SimProgram,
    t: Timeline,
    grad_bytes: np.ndarray,
    zero: int,
    ranks: int,
    links: Sequence[Link],
    pipeline_time: float,
    update: np.ndarray,
    stage_buckets: np.ndarray | None = None,
    overlap_grad: bool = False,
    overlap_param: bool = False,
    forward: np.ndarray | None = None,
    param_bytes: np.ndarray | None = None,
    reduce_scatter: bool = True,
    expert_share: np.ndarray | None = None,
    ep: int = 1,
    tied: TiedReduce | None = None,
    slowdown: float | np.ndarray = 0.0,
) -> DpComm:
    """The data-parallel communication after walk `t`: `grad_bytes` per stage, `update` each
    device's optimizer-step seconds, over `ranks` copies on `links` (one per device; the
    module's model). With the overlaps, `stage_buckets` (per stage, `buckets`) and `forward`
    (per device, its F seconds) say how much of them hides. The all-gather moves `param_bytes`
    per stage (default: as many as the gradients). Under ZeRO the gradients are
    reduce-scattered, or with `reduce_scatter` false all-reduced (the header's field).
    `expert_share`: per stage, the fraction of its parameters that are routed experts spread
    over an `ep` group, reduced (and gathered) over ranks / ep copies. `tied`: the tied
    embeddings' all-reduce (None: no copy). `slowdown`: per device (or for all), the fraction
    of its rate its compute loses while a collective runs under it (the SMs the collective
    holds: `links.dp_overlap_slowdown`)."""
    P = p.devices
    stage = Zero(zero)
    kind = stage.reduction(reduce_scatter)
    stage_links = [links[d] for d in p.stage_device.tolist()]
    device_bytes = np.bincount(p.stage_device, weights=grad_bytes, minlength=P)
    none = np.zeros(P)
    share = expert_share if expert_share is not None and ep > 1 else None

    def split(whole: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        return (none, whole) if kind == "reduce-scatter" else (whole, none)

    def reduction(nbytes: np.ndarray, on: Sequence[Link], per_device: bool) -> np.ndarray:
        """The gradient reduction of `nbytes` (per stage, or per device) on links `on`."""
        expert = _expert_part(p, nbytes, share, grad_bytes, per_device)
        return _split_ring(
            lambda b, r, k: ring_reduction_time(b, r, k, zero, reduce_scatter),
            nbytes,
            expert,
            ranks,
            ep,
            on,
        )

    stage_buckets = np.ones(p.num_stages, np.int64) if stage_buckets is None else stage_buckets
    ready = np.maximum(t.dev_free, t.comm_free)
    tied_secs = none
    if tied is not None and tied.seconds > 0 and tied.devices[0] != tied.devices[1]:
        tied_secs = np.zeros(P)
        tied_secs[list(tied.devices)] = tied.seconds
    else:
        tied = None
    before = tied is not None and tied.first
    if overlap_grad and not stage.shards_gradients and ranks > 1:
        ring = reduction(grad_bytes, stage_links, False)
        ptr, start, end, op, held = _during_last_backwards(
            p, t.start, t.end, ring, stage_buckets.astype(float)
        )
        dev = np.repeat(np.arange(P), np.diff(ptr))
        whole = np.bincount(dev, weights=end - start, minlength=P)
        allreduce, scattered = split(whole)
        hidden = _under_compute(p.order_ptr, p.order_nodes, t.start, t.end, ptr, start, end)
        # a span waits for its buckets between their collectives: these run its ring seconds
        busy: np.ndarray = np.bincount(dev, weights=ring[p.op_stage[op]], minlength=P)
    elif stage.shards_gradients and ranks > 1:
        ptr, start, end, op, held = _after_each_w(
            p.order_ptr,
            p.order_nodes,
            p.op_ptr,
            p.op_kind,
            p.op_stage,
            t.end,
            reduction(grad_bytes, stage_links, False),
        )
        dev = np.repeat(np.arange(P), np.diff(ptr))
        busy = np.bincount(dev, weights=end - start, minlength=P)
        allreduce, scattered = split(busy)
        hidden = _under_compute(p.order_ptr, p.order_nodes, t.start, t.end, ptr, start, end)
    else:
        # One collective per device, once its compute and its messages are done: nothing of
        # it is under the device's compute.
        ptr, dev = np.arange(P + 1), np.arange(P)
        start = ready.copy()
        op, held = np.full(P, -1), np.zeros(P, bool)
        if tied is not None and before:  # the two devices' reductions wait for it
            pair = list(tied.devices)
            start[pair] = ready[pair].max() + tied.seconds
            held[pair] = True
        whole = reduction(device_bytes, links, True)
        end = start + whole
        allreduce, scattered = split(whole)
        hidden = busy = none
    # the compute under a collective runs on the SMs the collective leaves it, so what the
    # overlap hides costs `slowdown` of it in compute seconds (of the collectives' running
    # seconds, not their waits for buckets), at the device's compute's end
    slowed = slowdown * np.minimum(hidden, busy)
    hidden = hidden - slowed
    compute_end = t.dev_free + slowed
    ready = np.maximum(compute_end, t.comm_free)  # for the tied all-reduce: the slowed compute
    span_tied = np.zeros(len(start), bool)
    tied_from = -1
    if tied is not None:
        ptr, dev, start, end, op, held, span_tied, tied_from = _with_tied(
            ptr, start, end, op, held, ready, tied.devices, tied.seconds, before
        )
    update_start = max(
        pipeline_time, float(compute_end.max(initial=0.0)), float(end.max(initial=0.0))
    )
    stage_params = grad_bytes if param_bytes is None else param_bytes
    gathered = np.bincount(p.stage_device, weights=stage_params, minlength=P)
    gather = (
        _split_ring(
            ring_all_gather_time,
            gathered,
            _expert_part(p, gathered, share, stage_params, True),
            ranks,
            ep,
            links,
        )
        if stage.gathers_parameters
        else none
    )
    exposed = gather
    if overlap_param and stage.gathers_parameters:
        per_device = np.maximum(1, np.bincount(p.stage_device, weights=stage_buckets, minlength=P))
        fwd = none if forward is None else forward
        exposed = np.maximum(gather / per_device, gather - fwd)
        exposed = exposed + slowdown * (gather - exposed)  # the forwards under it run slower
    return DpComm(
        zero,
        ranks,
        allreduce,
        scattered,
        gather,
        hidden,
        ptr,
        dev,
        start,
        end,
        op,
        held,
        update_start,
        update_start + update,
        exposed,
        kind,
        tied_secs,
        span_tied,
        tied_from,
        "" if tied is None else tied.link,
        slowed,
        compute_end,
    )


def _with_tied(ptr, start, end, op, held, ready, devices, seconds, before):
    """The reduction spans (CSR per device, as `dp_comm` builds them) with the tied
    embeddings' all-reduce on each of its two devices: first on their streams (`before`) or
    last. It starts when both devices are ready (their compute and messages done, and after
    their reductions unless `before`). Returns the new CSR offsets, device, start, end, op,
    held, which spans are the tied one, and the device that started it."""
    P = len(ptr) - 1
    own = {
        d: ready[d] if before or ptr[d] == ptr[d + 1] else max(ready[d], end[ptr[d + 1] - 1])
        for d in devices
    }
    origin = max(devices, key=lambda d: (own[d], -d))
    t0 = own[origin]
    rows: list[tuple[int, float, float, int, bool, bool]] = []
    for d in range(P):
        mine = [
            (d, float(start[j]), float(end[j]), int(op[j]), bool(held[j]), False)
            for j in range(ptr[d], ptr[d + 1])
        ]
        if d in own:
            waited = not before and ptr[d] < ptr[d + 1] and end[ptr[d + 1] - 1] >= t0
            span = (d, t0, t0 + seconds, -1, bool(waited), True)
            mine = [span, *mine] if before else [*mine, span]
        rows.extend(mine)
    counts = np.bincount([r[0] for r in rows], minlength=P)
    new_ptr = np.zeros(P + 1, np.int64)
    new_ptr[1:] = np.cumsum(counts)
    cols = list(zip(*rows, strict=True)) if rows else [()] * 6
    return (
        new_ptr,
        np.array(cols[0], np.int64),
        np.array(cols[1], float),
        np.array(cols[2], float),
        np.array(cols[3], np.int64),
        np.array(cols[4], bool),
        np.array(cols[5], bool),
        origin,
    )


def _expert_part(
    p: SimProgram,
    nbytes: np.ndarray,
    share: np.ndarray | None,
    stage_bytes: np.ndarray,
    per_device: bool,
) -> np.ndarray | None:
    """Of `nbytes` (per stage, or per device summing `stage_bytes` over its stages), the routed
    experts' bytes, each stage's `share` of them (None: no expert parallelism)."""
    if share is None:
        return None
    if not per_device:
        return nbytes * share
    return np.bincount(p.stage_device, weights=stage_bytes * share, minlength=p.devices)


def _split_ring(
    seconds: Callable[[np.ndarray, int, Sequence[Link]], np.ndarray],
    nbytes: np.ndarray,
    expert: np.ndarray | None,
    ranks: int,
    ep: int,
    links: Sequence[Link],
) -> np.ndarray:
    """`seconds(bytes, ranks, links)` of a ring collective over the dp copies, the routed
    experts' part `expert` of `nbytes` going round the ranks / ep copies that hold the same
    experts instead (one after the other on the device's stream); all of it over `ranks`
    without expert parallelism (`expert` None)."""
    if expert is None:
        return seconds(nbytes, ranks, links)
    return seconds(nbytes - expert, ranks, links) + seconds(expert, max(1, ranks // ep), links)


@njit
def _after_each_w(order_ptr, order_nodes, op_ptr, op_kind, op_stage, end, seconds):
    """Zero 2's reduce-scatters: one after each W or BW op (seconds[stage] each), from the end
    of its slot, one after another on the device's stream. CSR offsets per device, start, end,
    the op, and whether each waited for the one before."""
    P = order_ptr.shape[0] - 1
    ptr = np.zeros(P + 1, np.int64)
    for d in range(P):
        count = 0
        for i in range(order_ptr[d], order_ptr[d + 1]):
            n = order_nodes[i]
            for k in range(op_ptr[n], op_ptr[n + 1]):
                if op_kind[k] == _W or op_kind[k] == _BW:
                    count += 1
        ptr[d + 1] = ptr[d] + count
    K = ptr[P]
    start = np.zeros(K)
    stop = np.zeros(K)
    op = np.zeros(K, np.int64)
    held = np.zeros(K, np.bool_)
    for d in range(P):
        j = ptr[d]
        free = 0.0
        for i in range(order_ptr[d], order_ptr[d + 1]):
            n = order_nodes[i]
            for k in range(op_ptr[n], op_ptr[n + 1]):
                if op_kind[k] == _W or op_kind[k] == _BW:
                    s = end[n]
                    if free > s:
                        s = free
                        held[j] = True
                    free = s + seconds[op_stage[k]]
                    start[j] = s
                    stop[j] = free
                    op[j] = k
                    j += 1
    return ptr, start, stop, op, held


def _during_last_backwards(
    p: SimProgram,
    start: np.ndarray,
    end: np.ndarray,
    seconds: np.ndarray,
    stage_buckets: np.ndarray,
):
    """overlap_grad_reduce's reductions: per device, one per stage, starting with the stage's
    last W (or BW) op, in the order those ops run, one after another on the device's stream;
    each ends no sooner than its op's end plus one bucket's share (seconds[stage] /
    stage_buckets[stage]). CSR offsets per device, start, end, the op, and whether each waited
    for the one before."""
    node_of = np.repeat(np.arange(p.num_nodes), np.diff(p.op_ptr))
    pos = np.empty(p.num_nodes, np.int64)
    pos[p.order_nodes] = np.arange(len(p.order_nodes))
    ops = np.flatnonzero((p.op_kind == _W) | (p.op_kind == _BW))
    # each stage's backward that runs last: sort by (stage, position) and keep each stage's last
    ops = ops[np.lexsort((pos[node_of[ops]], p.op_stage[ops]))]
    last = ops[np.r_[p.op_stage[ops][1:] != p.op_stage[ops][:-1], True]] if len(ops) else ops
    last = last[np.lexsort((pos[node_of[last]], p.node_dev[node_of[last]]))]
    dev = p.node_dev[node_of[last]]
    ptr = np.zeros(p.devices + 1, np.int64)
    ptr[1:] = np.cumsum(np.bincount(dev, minlength=p.devices))
    t0, t1, held = np.zeros(len(last)), np.zeros(len(last)), np.zeros(len(last), bool)
    free = np.zeros(p.devices)
    for j, k in enumerate(last.tolist()):
        n, d, st = int(node_of[k]), int(dev[j]), int(p.op_stage[k])
        held[j] = free[d] > start[n]
        t0[j] = max(start[n], free[d])
        t1[j] = free[d] = max(t0[j] + seconds[st], end[n] + seconds[st] / stage_buckets[st])
    return ptr, t0, t1, last, held


@njit
def _under_compute(order_ptr, order_nodes, start, end, span_ptr, span_start, span_end):
    """Per device: seconds of its spans under its own compute nodes. Both are disjoint and in
    time order on a device, so one merge per device suffices."""
    P = order_ptr.shape[0] - 1
    out = np.zeros(P)
    for d in range(P):
        i = order_ptr[d]
        i1 = order_ptr[d + 1]
        for j in range(span_ptr[d], span_ptr[d + 1]):
            a = span_start[j]
            b = span_end[j]
            while i < i1 and end[order_nodes[i]] <= a:
                i += 1
            k = i
            while k < i1 and start[order_nodes[k]] < b:
                lo = max(a, start[order_nodes[k]])
                hi = min(b, end[order_nodes[k]])
                if hi > lo:
                    out[d] += hi - lo
                k += 1
    return out
