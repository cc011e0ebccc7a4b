"""ZeroBubble schedules (Qi et al., "Zero Bubble Pipeline Parallelism", ICLR 2024): the backward
is split into B (input gradient, on the critical path) and W (weight gradient, free to move),
and W fills what would otherwise be bubbles. ZB-H1 and ZB-H2 are the paper's handcrafted
schedules (section 2), ZB-V its V-shape schedule (section 6)."""

from __future__ import annotations

from collections import deque

from ..plan import OpKind as K
from ..plan import placement_loop, placement_v
from .phases import B, F, Order, PhasedSchedule, W


def zb_h1(devices: int, microbatches: int) -> PhasedSchedule:
    """1F1B's order of F and B, with device d's weight gradients delayed by d backwards, so
    every device holds P micro-batches (F done, W not yet), the peak of 1F1B's device 0; the
    early B passes shorten the fill, the delayed W passes fill the drain. Bubble
    (P-1)(F+B-W), a third of 1F1B's when F = B = W. The same order as PyTorch's
    ScheduleInterleavedZeroBubble with one stage per rank."""
    orders = []
    for d in range(devices):
        warm = min(devices - 1 - d, microbatches)
        o = Order()
        pending: deque[int] = deque()

        def backward(m: int) -> None:
            o.add(B(d, m))
            pending.append(m)
            if m >= d:  # the first d weight gradients wait
                o.add(W(d, pending.popleft()))

        o.phase("warm-up: forwards fill the pipeline")
        for m in range(warm):
            o.add(F(d, m))
        o.phase("steady: forward, backward, weight gradient" if d == 0 else
                f"steady: forward, backward; weight gradients start after {d} "
                f"backward{'s' * (d > 1)}")
        for m in range(microbatches - warm):
            o.add(F(d, m + warm))
            backward(m)
        o.phase("cool-down: the backwards still in flight")
        for m in range(microbatches - warm, microbatches):
            backward(m)
        o.phase("flush: the delayed weight gradients")
        while pending:
            o.add(W(d, pending.popleft()))
        orders.append(o.phases)
    return PhasedSchedule(devices, placement_loop(devices, devices), orders)


def zb_h2(devices: int, microbatches: int) -> PhasedSchedule:
    """More warm-up forwards (2(P-1-d)+1 on device d) fill the bubble before the first B; W
    waits until 2P-1 micro-batches are in flight on every device, and the drain's W passes
    trail the B passes, so the pipeline is a parallelogram: with F = B = W no device idles
    between its first and last op when M >= 2P-1. Peak memory 2P-1 micro-batches."""
    P, M = devices, microbatches
    orders = []
    for d in range(P):
        warm = min(2 * (P - 1 - d) + 1, M)
        o = Order()
        pending: deque[int] = deque()
        o.phase("warm-up: extra forwards fill the bubble before the first backward")
        for m in range(warm):
            o.add(F(d, m))
        o.phase("steady: backward, weight gradient, forward" if d == 0 else
                f"steady: backward, forward; weight gradients start after {2 * d} backwards")
        for m in range(M - warm):
            o.add(B(d, m))
            pending.append(m)
            if m >= 2 * d:  # 2P-1 micro-batches are in flight: free one before the next F
                o.add(W(d, pending.popleft()))
            o.add(F(d, m + warm))
        o.phase("cool-down: each backward followed by a delayed weight gradient")
        for m in range(M - warm, M):
            o.add(B(d, m))
            pending.append(m)
            o.add(W(d, pending.popleft()))
        o.phase("flush: the remaining weight gradients")
        while pending:
            o.add(W(d, pending.popleft()))
        orders.append(o.phases)
    return PhasedSchedule(P, placement_loop(P, P), orders)


def zb_v(devices: int, microbatches: int) -> PhasedSchedule:
    """The paper's handcrafted ZB-V (also sail-sg's reference code and PyTorch's
    ScheduleZBVZeroBubble): device d holds chunk 0 = stage d and chunk 1 = stage 2P-1-d.
    Built for max(M, 2P-1) micro-batches and the ones past M dropped, as the reference does,
    so any M works; zero bubble with F = B = W needs M >= 2P-1."""
    P, M = devices, microbatches
    n = max(M, 2 * P - 1)
    orders = []
    for d in range(P):
        c0, c1 = d, 2 * P - 1 - d
        o = Order(keep=M)

        def fbw(chunk: int) -> None:
            o.put(K.F, chunk)
            o.put(K.B, chunk)
            o.put(K.W, chunk)

        o.phase("warm-up: chunk-0 forwards")
        for _ in range(2 * (P - d) - 1):
            o.put(K.F, c0)
        o.phase("warm-up: chunk-1 and chunk-0 forwards in turn")
        for _ in range(d):
            o.put(K.F, c1)
            o.put(K.F, c0)
        o.phase("warm-up: chunk-1 forward, backward and weight gradient")
        for _ in range(P - d):
            fbw(c1)
        o.phase("steady: forward, backward and weight gradient of each chunk")
        while o.count(K.F, c1) < o.count(K.F, c0) or o.count(K.F, c0) < n:
            if o.count(K.F, c0) < n:
                o.put(K.F, c0)
            o.put(K.B, c0)
            o.put(K.W, c0)
            fbw(c1)
        o.phase("cool-down: backwards of both chunks, weight gradients delayed")
        for _ in range(d):
            o.put(K.B, c0)
            o.put(K.B, c1)
        o.phase("cool-down: chunk-0 backward and a delayed weight gradient")
        for _ in range(P - d):
            o.put(K.B, c0)
            o.put(K.W, c0)
        o.phase("flush: the remaining weight gradients")
        for chunk in (c1, c0):
            while o.count(K.W, chunk) < o.count(K.B, chunk):
                o.put(K.W, chunk)
        orders.append(o.phases)
    return PhasedSchedule(2 * P, placement_v(2 * P, P), orders)
