"""ZeroBubble schedules (Qi et al., "Zero Bubble Pipeline Parallelism", ICLR 2024): the backward
is split into B (input gradient, on the critical path) and W (weight gradient, free to move),
and W fills what would otherwise be bubbles. ZB-H1 and ZB-H2 are the paper's handcrafted
schedules (section 2), ZB-V its V-shape schedule (section 6)."""

from __future__ import annotations

from collections import deque

from ..plan import Op, placement_loop, placement_v
from ..plan import OpKind as K
from .phases import B, F, Order, Phase, PhasedSchedule, W


def zb_h1(devices: int, microbatches: int) -> PhasedSchedule:
    """1F1B's order of F and B, with device d's weight gradients delayed by d backwards, so
    every device holds P micro-batches (F done, W not yet), the peak of 1F1B's device 0; the
    early B passes shorten the fill, the delayed W passes fill the drain. Bubble
    (P-1)(F+B-W), a third of 1F1B's when F = B = W. The same order as PyTorch's
    ScheduleInterleavedZeroBubble with one stage per rank. For any M the makespan is the
    one-device lower bound or M(F+B+W) + (P-1)(F+B-W), whichever is larger: the bound when
    F = B = W; with B = 2F = 2W the second, which no order within P micro-batches beats (CP-SAT,
    small P)."""
    orders = []
    for d in range(devices):
        warm = min(devices - 1 - d, microbatches)
        o = Order()
        pending: deque[int] = deque()

        def backward(m: int, *, o: Order = o, d: int = d, pending: deque[int] = pending) -> None:
            o.add(B(d, m))
            pending.append(m)
            if m >= d:  # the first d weight gradients wait
                o.add(W(d, pending.popleft()))

        o.phase("warm-up: forwards fill the pipeline")
        for m in range(warm):
            o.add(F(d, m))
        o.phase(
            "steady: forward, backward, weight gradient"
            if d == 0
            else f"steady: forward, backward; weight gradients start after {d} "
            f"backward{'s' * (d > 1)}"
        )
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
    between its first and last op when M >= 2P-1. Peak memory 2P-1 micro-batches. The
    makespan is the one-device lower bound for any M, with F = B = W and with B = 2F = 2W."""
    P, M = devices, microbatches
    orders = []
    for d in range(P):
        warm = min(2 * (P - 1 - d) + 1, M)
        o = Order()
        pending: deque[int] = deque()
        o.phase("warm-up: extra forwards fill the bubble before the first backward")
        for m in range(warm):
            o.add(F(d, m))
        o.phase(
            "steady: backward, weight gradient, forward"
            if d == 0
            else f"steady: backward, forward; weight gradients start after {2 * d} backwards"
        )
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


Times = tuple[float, float, float]
"""F, B and W of one stage (a chunk, on a V); only their ratio matters."""
EQUAL_TIMES: Times = (1.0, 1.0, 1.0)


def zb_v(devices: int, microbatches: int, times: Times = EQUAL_TIMES) -> PhasedSchedule:
    """ZB-V: device d holds chunk 0 = stage d and chunk 1 = stage 2P-1-d; at most 2P chunk
    micro-batches in flight on a device (1F1B's memory).

    From 2P-1 micro-batches on, the paper's handcrafted schedule (also sail-sg's reference code
    and PyTorch's ScheduleZBVZeroBubble): no bubble inside a device with F = B = W, and a
    makespan of 2M(F+B+W) + (P-1)(F+B-W) in chunk times whatever the times, the figure of
    ZeroBubble's own greedy ZB-V scheduler.

    Below 2P-1, the reference builds the pattern for 2P-1 micro-batches and drops the extra
    ones; its weight gradients, placed for a full pipeline, then stall the backwards (P 8, M 8,
    F = B = W = 1 per device: 31 time units against 27.5). Here the forwards and backwards keep
    that order, and each weight gradient runs where its device would otherwise wait for the
    next input, or before a forward that would hold more than 2P chunk micro-batches, as
    simulated with `times`; the rest run at the end. With the times it is built for, the
    makespan is the one-device lower bound or 2M(F+B+W) + (P-1)(F+B-W), whichever is larger
    (tests/gen/test_schedules.py; ZeroBubble's greedy reaches the same figures), e.g. 27.5 and
    39 at P 8, M 8 with F = B = W = 1 and with F = 1, B = 2, W = 1 per device. An order built
    for one ratio can lose at another."""
    P, M = devices, microbatches
    orders = [_zb_v_pattern(P, M, d) for d in range(P)]
    if not zb_v_handcrafted(P, M):
        forward_backward = [
            [op for ph in phases for slot in ph.slots for op in slot.ops if op.kind is not K.W]
            for phases in orders
        ]
        orders = _weight_gradients_in_waits(forward_backward, 2 * P, times, cap=2 * P)
    return PhasedSchedule(2 * P, placement_v(2 * P, P), orders)


def zb_v_handcrafted(devices: int, microbatches: int) -> bool:
    """Whether zb_v is the handcrafted pattern, the same for any op times."""
    return microbatches >= 2 * devices - 1


def _zb_v_pattern(P: int, M: int, d: int) -> list[Phase]:
    """Device d's handcrafted ZB-V order, built for max(M, 2P-1) micro-batches and the ones
    past M dropped, as the reference does."""
    n = max(M, 2 * P - 1)
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
    return o.phases


def _weight_gradients_in_waits(
    orders: list[list[Op]], num_stages: int, times: Times, cap: int
) -> list[list[Phase]]:
    """Each device runs its F and B ops in the given order, each once its inputs are done, and
    a pending weight gradient (oldest first) whenever it would end by the time the next op's
    inputs are, or before a forward that would hold more than `cap` micro-batch-stages; the
    rest at the end. The stages form one chain (F down it, B back up); all ops of a kind take
    one time."""
    took = dict(zip((K.F, K.B, K.W), times, strict=True))
    done: dict[Op, float] = {}
    free = [0.0] * len(orders)
    ran: list[list[Op]] = [[] for _ in orders]
    pending: list[deque[Op]] = [deque() for _ in orders]
    held = [0] * len(orders)
    nxt = [0] * len(orders)

    def run(d: int, op: Op, start: float) -> None:
        done[op] = free[d] = start + took[op.kind]
        ran[d].append(op)

    def advance(d: int) -> bool:
        """Run device d's next F or B, and the W's before it, if its inputs are done."""
        if nxt[d] == len(orders[d]):
            return False
        op = orders[d][nxt[d]]
        inputs = _inputs(op, num_stages)
        if any(i not in done for i in inputs):
            return False
        ready = max((done[i] for i in inputs), default=0.0)
        while pending[d] and (free[d] + took[K.W] <= ready or (op.kind is K.F and held[d] >= cap)):
            run(d, pending[d].popleft(), free[d])
            held[d] -= 1
        run(d, op, max(free[d], ready))
        if op.kind is K.F:
            held[d] += 1
        else:
            pending[d].append(W(op.stage, op.mb))
        nxt[d] += 1
        return True

    while any([advance(d) for d in range(len(orders))]):
        pass
    assert nxt == [len(o) for o in orders], "the F and B order deadlocks"
    return [_waits_phases(r, list(p)) for r, p in zip(ran, pending, strict=True)]


def _inputs(op: Op, num_stages: int) -> list[Op]:
    if op.kind is K.F:
        return [F(op.stage - 1, op.mb)] if op.stage else []
    return [F(op.stage, op.mb)] + ([B(op.stage + 1, op.mb)] if op.stage < num_stages - 1 else [])


def _waits_phases(ran: list[Op], rest: list[Op]) -> list[Phase]:
    o = Order()
    first_b = next(i for i, op in enumerate(ran) if op.kind is K.B)
    o.phase("warm-up: forwards in ZB-V's order")
    for op in ran[:first_b]:
        o.add(op)
    o.phase("steady: backwards as they arrive; weight gradients fill the waits (or free memory)")
    for op in ran[first_b:]:
        o.add(op)
    o.phase("flush: the remaining weight gradients")
    for op in rest:
        o.add(op)
    return o.phases
