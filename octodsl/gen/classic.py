"""Schedules with a fused backward: GPipe, 1F1B and Megatron's interleaved 1F1B."""

from __future__ import annotations

from ..plan import placement_loop
from .phases import BW, F, Order, PhasedSchedule, ScheduleError


def gpipe(devices: int, microbatches: int) -> PhasedSchedule:
    """Every forward, then every backward (in micro-batch order, as PyTorch's ScheduleGPipe):
    bubble (P-1)(F+B+W), all M micro-batches' activations held at once. The makespan
    (M+P-1)(F+B+W) is the lower bound for any M: the last device cannot start before (P-1)F,
    and its last backward is followed by one on each of the P-1 devices upstream."""
    orders = []
    for d in range(devices):
        o = Order()
        o.phase("forward: every micro-batch")
        for m in range(microbatches):
            o.add(F(d, m))
        o.phase("backward: every micro-batch")
        for m in range(microbatches):
            o.add(BW(d, m))
        orders.append(o.phases)
    return PhasedSchedule(devices, placement_loop(devices, devices), orders)


def one_f_one_b(devices: int, microbatches: int) -> PhasedSchedule:
    """PipeDream-Flush / Megatron 1F1B: GPipe's bubble, so GPipe's optimal makespan for any M,
    with at most min(P-d, M) micro-batches in flight on device d."""
    orders = []
    for d in range(devices):
        # Device d runs P-1-d forwards before its first backward can come back; the steady
        # forward makes P-d micro-batches in flight (P on device 0).
        warm = min(devices - 1 - d, microbatches)
        o = Order()
        o.phase("warm-up: forwards fill the pipeline")
        for m in range(warm):
            o.add(F(d, m))
        o.phase("steady: one forward, one backward")
        for m in range(microbatches - warm):
            o.add(F(d, m + warm))
            o.add(BW(d, m))
        o.phase("cool-down: the backwards still in flight")
        for m in range(microbatches - warm, microbatches):
            o.add(BW(d, m))
        orders.append(o.phases)
    return PhasedSchedule(devices, placement_loop(devices, devices), orders)


def interleaved(devices: int, microbatches: int, chunks: int) -> PhasedSchedule:
    """Megatron-LM's interleaved 1F1B: chunk c of device d is stage c*P + d. Micro-batches go in
    groups of g; within a group, forwards take chunk 0 for every micro-batch of the group, then
    chunk 1, ...; backwards the same with the chunks reversed. Megatron uses g = P (so needs
    P | M); for other M, g is the smallest divisor of M not below P, which is what PyTorch's
    ScheduleInterleaved1F1B picks whenever it accepts M (M divisible by M // P). Needs M >= P.
    The makespan, V*M(F+B+W) + (P-1)(F+B+W) in chunk times, is the lower bound for every such
    M with a fused backward."""
    P, M, V = devices, microbatches, chunks
    if V < 2:
        raise ScheduleError("interleaved needs --chunks 2 or more (with one chunk it is 1f1b)")
    if M < P:
        raise ScheduleError(
            f"interleaved needs at least as many micro-batches as devices ({P}), got {M}"
        )
    g = next(k for k in range(P, M + 1) if M % k == 0)
    # (micro-batch, chunk) in forward order.
    table = [(m, c) for first in range(0, M, g) for c in range(V) for m in range(first, first + g)]
    total = M * V
    orders = []
    for d in range(P):
        # The forwards of chunks 0..V-2 of the first group, plus 2 per device downstream.
        warm = min((V - 1) * g + 2 * (P - 1 - d), total)

        def fwd(k: int, *, d: int = d):
            m, c = table[k]
            return F(c * P + d, m)

        def bwd(k: int, *, d: int = d):
            m, c = table[k]
            return BW((V - 1 - c) * P + d, m)

        o = Order()
        o.phase("warm-up: forwards of every chunk fill the pipeline")
        for k in range(warm):
            o.add(fwd(k))
        o.phase("steady: one forward, one backward")
        for k in range(total - warm):
            o.add(fwd(k + warm))
            o.add(bwd(k))
        o.phase("cool-down: the backwards still in flight")
        for k in range(total - warm, total):
            o.add(bwd(k))
        orders.append(o.phases)
    return PhasedSchedule(P * V, placement_loop(P * V, P), orders)
