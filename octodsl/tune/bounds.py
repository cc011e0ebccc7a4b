"""The lower bounds on every plan of a `Problem` (tune/problem.py): whatever its partition,
placement, schedule and recompute choice, no plan the tuner may produce runs faster. The tuner
reports its plans' efficiency against `lower_bound`; the whole-cluster search ranks and prunes
configurations by `tight_lower_bound`, the largest of the others. `layout_lower_bound` holds
for the plans of one layout only (benchmarks/tuner_gap.py: how much of a gap is the order's)."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import numpy as np

from ..costs.levers import Zero, recomputed
from ..costs.table import Link
from ..plan import Recompute
from ..sim.bounds import ring_all_gather_time, ring_reduction_time
from ..sim.links import dp_links, dp_rails, dp_spans_nodes

if TYPE_CHECKING:
    from collections.abc import Callable

    from .pipeline.layout import StageLayout
    from .problem import Problem


def fastest_dp_links(problem: Problem) -> list[Link]:
    """Per device, for the bounds: its data-parallel link's latency (octodsl.sim.links: the
    inter-node link when its group spans nodes) with the fastest bandwidth of any device's.
    A plan chooses how many gradient bytes each device holds, so the sum over devices of
    their ring times is at least every device's latencies plus all the bytes on the fastest
    link (one link for all devices: exactly the simulator's sum, whatever the split)."""
    inter = problem.inter_link or problem.link
    links = dp_links(problem.link, inter, dp_spans_nodes(problem.mesh), dp_rails(problem.mesh))
    bandwidths = [k.bandwidth for k in links]
    best = 0.0 if min(bandwidths) <= 0 else max(bandwidths)  # 0: one of them is free
    return [Link(k.name, k.latency, best) for k in links]


def least_kept(problem: Problem) -> np.ndarray:
    """Per layer, the fewest activation bytes a micro-batch keeps from its forward to its
    input-gradient backward with a recompute mode allowed (full keeps only the stage's
    input, counted as none of any layer's: a true lower bound whatever the cuts)."""
    return _by_mode(problem)[1].min(axis=0)


def _by_mode(problem: Problem) -> tuple[np.ndarray, np.ndarray]:
    """`_recomputed()` for every allowed mode: per mode (rows) and layer (columns), the seconds
    B runs again and the bytes F keeps."""
    pairs = [_recomputed(problem, m) for m in problem.modes]
    return np.array([a for a, _ in pairs]), np.array([k for _, k in pairs])


def _room(problem: Problem) -> float:
    """The bytes the devices have beside all the static bytes, the problem's memory limit each
    (which the caller has checked is set)."""
    assert problem.memory is not None
    return problem.devices * float(problem.memory) - float(problem.layer_static().sum())


def _recomputed(problem: Problem, mode: Recompute) -> tuple[np.ndarray, np.ndarray]:
    """Per layer, the seconds B runs again and the bytes a micro-batch keeps from F to B under
    `mode` (`levers.recomputed` layer by layer; full keeps the stage's input, counted as none
    of any layer's)."""
    # the forward run again, its all-to-alls left out as in `Problem.work` (a group may hide them)
    f, ep_f, act, sel_f, sel_act = (
        problem.column(k) for k in ("f", "ep_f", "act", "sel_f", "sel_act")
    )
    again, kept = recomputed(mode, f - ep_f, act, sel_f, sel_act, 0.0)
    zero = np.zeros(len(f))  # a mode's scalar (none's 0 seconds) as one per layer
    return zero + again, zero + kept


def lower_bound(problem: Problem) -> float:
    """No plan runs faster than the largest of: all work spread evenly over the devices; the
    heaviest layer times the micro-batches (a layer is never split); one micro-batch's path
    through every layer (all forwards, the input-gradient backwards down to some layer, its
    W), messages left out since a plan may keep layers together. Unlike the simulator's
    bound, which is a plan's (its stages, its messages), this one holds for every plan of
    the problem, so all are measured against the same number."""
    f, b, w = problem.column("f"), problem.column("b"), w_run(problem)
    b_from = np.cumsum(b[::-1])[::-1]
    path = float(f.sum()) + float(np.max(b_from + w))
    work = run_work(problem)
    return max(
        float(work.sum()) * problem.microbatches / problem.devices,
        float(work.max()) * problem.microbatches,
        path,
    ) + step_seconds(problem)


def w_run(problem: Problem) -> np.ndarray:
    """Each layer's W as every plan of the problem runs it: with its gradient-accumulation pass
    as the header's runtime runs it (`Problem.accumulation`: none when fused into the GEMM)."""
    return problem.column("w") + problem.accumulation()


def run_work(problem: Problem) -> np.ndarray:
    """`Problem.work` with the gradient-accumulation pass each W runs (`w_run`)."""
    return problem.work + (w_run(problem) - problem.column("w"))


def step_seconds(problem: Problem) -> float:
    """What the optimizer step adds to any plan's iteration: every device steps when the last
    compute has ended, over its own layers' share (ZeRO-sharded as the header says), so the
    iteration ends no sooner than the compute's end plus the average step over the devices
    (the sum over the layers is the same however they are split), plus a calibration's
    per-iteration overhead (octodsl.sim.simulate)."""
    h, table = problem.header, problem.table
    whole = table.range_costs(
        [(0, len(table.layers) - 1)], (), h.zero, h.dp, h.grad_accumulation_fusion, problem.held
    )[0]
    cal = table.calibration
    return whole.update / problem.devices + (0.0 if cal is None else cal.step_overhead)


def tight_lower_bound(problem: Problem) -> float:
    """The largest of tight_terms(): lower_bound() made tighter by the wait of each layer's
    device and by the memory limit (memory_lower_bound()). The wait: no op of a layer can
    start before the forwards of the layers before it (for the first micro-batch), and after
    the layer's last input-gradient backward come either its remaining W or the backwards of
    the layers before it. So per
    layer: forwards before + M x (F + B) + max(M x W, backwards before). Where one layer
    outweighs a device's fair share (an LM head on 16 devices), this is what even a perfect
    plan needs, and lower_bound() cannot be reached. The work over the devices counts each
    device's wait for its first op too (work_with_leads(): the fill every plan pays).

    A true lower bound over every plan the tuner may produce with the levers allowed: its
    work and waits are without recompute time (recompute only adds to B), and its memory
    term counts the fewest bytes the allowed recompute modes hold and the static bytes
    under the header's ZeRO sharding; recompute_lower_bound() weighs the recompute time a
    mode costs against the bytes it saves, and fill_lower_bound() the idle of the fill that
    the memory limit forces. The data-parallel collectives no plan avoids count too
    (dp_seconds(), dp_stream_bound())."""
    return max(tight_terms(problem).values())


def tight_terms(problem: Problem) -> dict[str, float]:
    """tight_lower_bound()'s terms, each under what it counts (what `tune`'s title names)."""
    f, b, ep_f, ep_b = (problem.column(k) for k in ("f", "b", "ep_f", "ep_b"))
    w = w_run(problem)
    before_f = np.cumsum(f) - f
    before_b = np.cumsum(b) - b
    m = problem.microbatches
    # the layer's M forwards and backwards less their all-to-alls, which overlap groups of them
    # may hide (`Problem.work`); one micro-batch's chain of ops takes each op's whole time
    layer = before_f + m * (f - ep_f + b - ep_b) + np.maximum(m * w, before_b)
    before, after = dp_seconds(problem)
    step = step_seconds(problem)
    return {
        "all work over the devices": lower_bound(problem) + after,
        "each layer's wait for the first forward": float(layer.max()) + after + step,
        "the activations the memory limit leaves room for": memory_lower_bound(problem)
        + after
        + step,
        "each device's wait for its first forward": work_with_leads(problem)
        + before
        + after
        + step,
        "the recompute the memory limit calls for": recompute_lower_bound(problem),
        "the forwards the memory holds before the first backward": fill_lower_bound(problem),
        "the reduce-scatter after each backward": dp_stream_bound(problem),
    }


def work_with_leads(problem: Problem) -> float:
    """All work over the devices, each device's wait for its first op (its lead) added: no
    device's compute ends before its lead plus its own work, and the optimizer step waits for
    every device's, so the step starts no sooner than their average (tight_lower_bound()
    adds the collectives and the step).

    The leads: every op of a layer waits for that micro-batch's forwards of all the layers
    before it (each op its whole time, messages left out), so a device waits at least the
    forwards before its first layer. Devices that hold layers have distinct first layers, so
    k of them wait at least the forwards before layers 0, 1, ..., k - 1 in all: L_k. With k
    devices holding all the work W (micro-batches x `run_work`), the average of lead plus work
    over them is at least (L_k + W) / k; a plan uses some k <= P, so the bound is the least of
    these, which is W / P plus the leads' average L_P / P wherever leaving a device idle
    costs more than it saves (always, but for a few tiny layers on many devices). The leads
    are the fill no plan avoids; where the work is even over many devices they add about
    (P - 1) / 3 forwards of a layer (16 devices of nemotron-h-56b: 47 ms)."""
    work = problem.microbatches * float(run_work(problem).sum())
    f = problem.column("f")
    k = np.arange(1, min(problem.devices, len(f)) + 1)
    before = np.cumsum(f) - f  # the forwards before layer j
    leads = np.cumsum(before)[k - 1]  # L_k: before layers 0 .. k - 1
    return float(np.min((leads + work) / k))


def dp_seconds(problem: Problem) -> tuple[float, float]:
    """What the data-parallel collectives add to any plan's iteration, on average over the
    devices (octodsl.sim.dpcomm's model), as (before, after) the optimizer step: before it,
    each device's gradient all-reduce (zero 0) or reduce-scatter (zero 1; an all-reduce with
    `reduce_scatter false`) runs after its
    own compute (zero 2's reduce-scatters overlap later compute: none counted); after it
    (the step waits for all of them and for the last compute), each device's all-gather of
    the parameters (zero 1 and 2). Ring times are linear in the bytes plus a latency per
    device, so their sum over the devices is the same however the layers are split (with
    devices on different links, at least `fastest_dp_links()`'s): so
    T >= (all compute + P x before) / P + after, and T >= (the pipeline) + after. What the
    header overlaps counts as hidden: the reduction under `overlap_grad_reduce` (it runs under
    the last backwards), the all-gather under `overlap_param_gather` (under the next forwards)."""
    h, P = problem.header, problem.devices
    if h.dp <= 1:
        return 0.0, 0.0
    held, params = problem.held, np.full(P, problem.table.grad_params() / P)
    even = params * held.reduce_bytes  # the gradients reduced, the parameters gathered
    links = fastest_dp_links(problem)
    gathered = params * held.weights
    zero = Zero(h.zero)
    after = (
        float(ring_all_gather_time(gathered, h.dp, links).sum()) / P
        if zero.gathers_parameters and not h.overlap_param_gather
        else 0.0
    )
    if zero.shards_gradients or h.overlap_grad_reduce:  # under later compute: none counted
        return 0.0, after
    return float(ring_reduction_time(even, h.dp, links, zero, h.reduce_scatter).sum()) / P, after


def dp_stream_bound(problem: Problem) -> float:
    """Under zero 2, no plan runs faster than its data-parallel streams: each W (or BW) is
    followed by a reduction of its stage's gradient bytes on its device's stream, one
    after another, and the step waits for the last; so T >= (all devices' M reduce-scatters
    of all their bytes) / P + the all-gather after the step (dp_seconds()), the sum the same
    however the layers are split and more stages only adding latencies. 0 otherwise. It
    binds where the gradients are large for the compute (jamba-v0.1, qwen3-next-80b)."""
    h, P = problem.header, problem.devices
    if not Zero(h.zero).shards_gradients or h.dp <= 1:
        return 0.0
    even = np.full(P, problem.table.grad_params() * problem.held.reduce_bytes / P)
    stream = problem.microbatches * float(
        ring_reduction_time(even, h.dp, fastest_dp_links(problem), h.zero, h.reduce_scatter).sum()
    )
    return stream / P + dp_seconds(problem)[1] + step_seconds(problem)


def memory_lower_bound(problem: Problem) -> float:
    """No plan within the memory limit runs faster than this (0 without a limit, inf when
    the static bytes alone overflow the devices). A micro-batch holds a layer's activations
    from the start of its forward to the end of its input-gradient backward, at least the F
    and B of that layer and of every later one, and the part kept for W through W too. In
    an iteration of T seconds the devices offer T x (P x limit - all static bytes)
    byte-seconds beside the static bytes, so T >= M x (byte-seconds held per micro-batch) /
    (P x limit - all static bytes). It binds when the memory left beside the parameters
    throttles the micro-batches in flight (nemotron-h-56b on 16 devices of 80 GiB).

    With recompute, a micro-batch keeps `least_kept()` of a layer from F to B, holds the
    rest only while its stage's B runs (at least the layer's B and the forward it runs again:
    a recompute costs its bytes for its seconds), and the part for W until W as before;
    static bytes are ZeRO-sharded (`share`)."""
    if problem.memory is None:
        return 0.0
    _, held = _per_mode(problem)
    return float(held.min(axis=0).sum())


def recompute_lower_bound(problem: Problem) -> float:
    """The work and memory terms together, over the recompute modes allowed: per layer, a
    mode costs its recompute seconds on some device (all work / P) and its byte-seconds in
    the memory left beside the static bytes (memory_lower_bound()). For any choice of
    modes T >= max(work / P, memory term) >= l x work / P + (1 - l) x memory term for every
    l in [0, 1], and the right side is smallest with each layer's own best mode for that l:
    so the largest of these minima over l is a lower bound whatever modes a plan picks
    (stages pick per stage, which is one of the per-layer choices). It binds where memory
    forces recompute and recompute costs time (nemotron-h-56b on 8 devices of 80 GiB).
    The data-parallel collectives (dp_seconds()) add to the work side before and after the
    step, to the memory side (the pipeline's time) after it; the devices' leads
    (work_with_leads()) to the work side: recompute only adds work, which leaving devices idle
    spreads over fewer of them, so the leads' share is at least that of the work without it."""
    extra, held = _per_mode(problem)
    work = problem.microbatches * run_work(problem) / problem.devices
    before, after = dp_seconds(problem)  # the data-parallel collectives, on both sides
    before += work_with_leads(problem) - float(work.sum())  # and the devices' leads
    after += step_seconds(problem)  # and the optimizer step after the pipeline
    if problem.memory is None:
        return float((work + extra.min(axis=0)).sum()) + before + after
    if not np.isfinite(held).all():
        return math.inf

    def g(lam: float) -> float:
        return (
            float((lam * (work + extra) + (1 - lam) * held).min(axis=0).sum())
            + lam * before
            + after
        )

    # g is concave (a minimum of linear functions of l)
    return _concave_top(g, 0.0, 1.0)


def _concave_top(g: Callable[[float], float], lo: float, hi: float) -> float:
    """The top of a concave `g` on [lo, hi], by ternary search: the bounds above are each the
    largest of a family of lower bounds g(x), so every value computed is one, and the largest
    seen is returned (never more than the top, whatever the rounding)."""
    best = max(g(lo), g(hi))
    for _ in range(60):
        a, b = lo + (hi - lo) / 3, hi - (hi - lo) / 3
        ga, gb = g(a), g(b)
        best = max(best, ga, gb)
        lo, hi = (a, hi) if ga < gb else (lo, b)
    return best


def fill_lower_bound(problem: Problem) -> float:
    """No plan within the memory limit runs faster than this (0 without a limit): the idle
    time of the pipeline's fill, which the memory limit forces.

    Until the first input-gradient backward starts, the devices only run forwards, and every
    forward they have started holds its kept bytes (a forward's bytes are held from its
    start; none is freed before a backward). That first backward waits for one micro-batch's
    forwards through every layer, and so does the end of the last forward: for at least
    a = (all the layers' F) seconds from the start either no backward has started or some
    forward is still to come, and in that span the devices only forward. If the forwards
    started in it are y seconds of work, the devices idle P x a - y seconds of it at least,
    and every op not started in it still runs after it: P x T >= P x a + all work - y (the
    ops' whole seconds, recompute included). The bytes of those forwards fit beside the
    static bytes (memory_lower_bound()'s room), so y is at most the largest forward work
    whose kept bytes fit (M forwards per layer, each its F and its `least_kept`-like bytes
    under the layer's mode). By linear-programming duality that is at most
    u x room + sum over layers of M x max(0, F - u x kept) for any u >= 0, so for every u,
    with each layer's best mode for that u (its recompute seconds against the forwards its
    bytes allow), the right side is a lower bound; the largest over u is one too (concave in
    u: a ternary search finds it). The data-parallel collectives and the step add as in
    work_with_leads(), whose leads this bound's idle includes.

    It binds where a micro-batch's activations are large for the room beside the parameters
    and there are few micro-batches to spread the fill over (jamba-v0.1 on 4 devices of 80
    GiB: the room holds under two micro-batches' forwards of the four a fill needs).
    Full recompute keeps none of a layer's bytes here (its stage's input is counted as none
    of any layer's), so where it is allowed it costs its recompute seconds instead."""
    if problem.memory is None:
        return 0.0
    room = _room(problem)
    if room <= 0:
        return 0.0  # memory_lower_bound() says inf: no plan fits
    P, M = problem.devices, problem.microbatches
    f, ep_f = problem.column("f"), problem.column("ep_f")
    fw = f - ep_f  # a forward's work as run_work() counts it
    again, kept = _by_mode(problem)
    if _forwards_that_fit(M * fw, M * kept.max(axis=0), room) >= P * float(f.sum()):
        return 0.0  # the room holds all the span could run, whatever the modes: no idle
    before, after = dp_seconds(problem)
    fixed = M * float(run_work(problem).sum()) + P * float(f.sum())

    def g(u: float) -> float:
        per_layer = (M * again - M * np.maximum(0.0, fw - u * kept)).min(axis=0)
        return (fixed - u * room + float(per_layer.sum())) / P

    # beyond u = max(F / kept) every layer's forwards are priced out and g only falls
    positive = kept > 0
    hi = float((np.broadcast_to(fw, kept.shape)[positive] / kept[positive]).max(initial=0.0))
    return _concave_top(g, 0.0, hi) + before + after + step_seconds(problem)


def _forwards_that_fit(seconds: np.ndarray, kept: np.ndarray, room: float) -> float:
    """The most forward seconds whose bytes fit in `room`: per layer `seconds` of forwards
    holding `kept` bytes for each of its seconds' share, the fewest bytes per second first
    (the fractional knapsack, an upper bound on whole forwards)."""
    # bytes without seconds last (they fit no forward work); no bytes first
    per_second = np.divide(kept, seconds, out=np.full_like(kept, np.inf), where=seconds > 0)
    per_second[kept <= 0] = 0.0
    order = np.argsort(per_second, kind="stable")
    need = np.cumsum(kept[order])
    whole = int(np.searchsorted(need, room, side="right"))  # layers whose forwards all fit
    done = float(seconds[order[:whole]].sum())
    if whole < len(order):
        left = room - (float(need[whole - 1]) if whole else 0.0)
        done += left / per_second[order[whole]]
    return done


def _per_mode(problem: Problem) -> tuple[np.ndarray, np.ndarray]:
    """Per allowed mode (rows) and layer (columns): the recompute seconds the layer adds to
    an iteration over the devices (M x extra B seconds / P), and the seconds its held
    byte-seconds take of the memory left beside the static bytes (inf when none is left;
    0 without a limit)."""
    f, b, act, act_w = (problem.column(k) for k in ("f", "b", "act", "act_w"))
    w = w_run(problem)
    later = np.cumsum((f + b)[::-1])[::-1]  # F + B of each layer and all after it
    again, kept = _by_mode(problem)
    M = problem.microbatches
    extra = M * again / problem.devices
    # what F does not keep, B brings back when it starts and holds to its end: through the
    # layer's B and the forward it runs again, which the B of the layer's stage includes
    bytes_s = np.array(
        [
            M * (k * later + (act - k) * (b + a) + act_w * w)
            for a, k in zip(again, kept, strict=True)
        ]
    )
    if problem.memory is None:
        return extra, np.zeros_like(bytes_s)
    room = _room(problem)
    if room <= 0:
        return extra, np.where(bytes_s > 0, math.inf, 0.0)
    return extra, bytes_s / room


def layout_lower_bound(problem: Problem, layout: StageLayout) -> float:
    """No plan of this layout (partition, placement and recompute modes) runs faster,
    whatever its schedule: tight_lower_bound(), and per device its own compute with its
    waits, and its own memory.

    The compute, as tight_lower_bound()'s wait per layer but per device: its first op waits
    for the forwards of the stages before its first stage s (for that micro-batch); every F
    and B of its stages (with their recompute; less the expert all-to-alls an overlap group
    may hide) ends by the last B of s, after which come either its remaining Ws or the
    backwards of the stages before s.

    The memory, as memory_lower_bound() but kept apart per device and per stage as the
    simulator holds it (octodsl.sim.memory): F's kept bytes from F's start through the
    forwards and backwards of every later stage and the stage's own backward; what the
    backward brings back by recompute for its whole seconds, recompute included; the part
    for W through W; all of it in the device's own memory beside its own static bytes (inf
    when none is left for activations a stage holds). Where the pooled bounds let a device
    with little room borrow another's, or let a stage's recompute cost nothing in bytes,
    this bound does not. Messages count as free, as in the other bounds. After the pipeline,
    each device's optimizer step over its own stages (`step_seconds`)."""
    sim_costs = problem.sim_costs(problem.skeleton(layout))
    costs = sim_costs.stages
    f, b, w, bw, act, act_b, act_w, ep_f, ep_b, static, update = (
        np.array([getattr(c, k) for c in costs], float)
        for k in (
            "f",
            "b",
            "w",
            "fused_backward",
            "act",
            "act_b",
            "act_w",
            "ep_f",
            "ep_b",
            "static",
            "update",
        )
    )
    back = np.minimum(b, bw)  # the backward's seconds, run split (B) or fused (BW)
    after_back = np.minimum(w, bw - back)  # and after it, the part for W still held
    later = np.cumsum((f + back)[::-1])[::-1]  # F + backward of each stage and all after it
    held = act * later + act_b * back + np.minimum(act_w, act + act_b) * after_back
    M, P = problem.microbatches, problem.devices
    dev = np.asarray(layout.devices)
    first = np.full(P, len(costs))  # each device's first stage in the pipeline's order
    np.minimum.at(first, dev, np.arange(len(costs)))
    used = first < len(costs)
    fb = M * np.bincount(dev, weights=f - ep_f + back - ep_b, minlength=P)[used]
    wait_f = (np.cumsum(f) - f)[first[used]]
    wait_b = (np.cumsum(back) - back)[first[used]]
    rest = M * np.bincount(dev, weights=after_back, minlength=P)[used]
    pipeline = float(np.max(wait_f + fb + np.maximum(rest, wait_b)))
    if problem.memory is not None:
        room = problem.memory - np.bincount(dev, weights=static, minlength=P)
        need = M * np.bincount(dev, weights=held, minlength=P)
        if ((room <= 0) & (need > 0)).any():
            return math.inf
        pipeline = max(
            pipeline, float(np.max(np.divide(need, room, where=room > 0, out=np.zeros(P))))
        )
    # each device steps over its own stages once the last compute has ended
    steps = np.bincount(dev, weights=update, minlength=P)
    after = max(float(steps.max()), float(steps.mean()) + dp_seconds(problem)[1])
    return max(tight_lower_bound(problem), pipeline + after + sim_costs.step_overhead)
