"""DualPipeV (DeepSeek's DualPipe folded into a V, https://github.com/deepseek-ai/DualPipe), as
DeepSpeed 0.19.8 runs it (deepspeed/runtime/pipe/schedule.py, DualPipeVSchedule).

Device d holds stage d (phase 0: activations flow away from device 0) and stage 2P-1-d (phase
1: they flow back), so device 0 both embeds and computes the loss. In the main phase each step
overlaps the forward of one phase with the backward of the other. DeepSpeed keeps the weight
gradient inside the backward (the reference DualPipe defers some), so every backward is a
fused BW here too.

M >= 2P, as DeepSpeed and the reference require. With uniform chunk times and free messages
the makespan is 2M(F+B+W) + (P-2)F + 2(P-1)(B+W) (F = B = W and B = 2F = 2W, tested): DeepSeek's
published bubble (PP/2-1)(F&B + B - 3W) with the full backward B + W, a pair F&B = F + B + W,
no W deferred, less the one F of the turn-around pair DeepSpeed does not overlap; above
the lower bound (P 4, M 8, F = B = W = 1: 62 against 57): the order is DeepSpeed's, made to
hide communication under the overlapped pairs; the simulator hides each op's expert all-to-alls
under the other op of its pair (`SimProgram.per_slot`) and runs the rest back to back."""

from __future__ import annotations

from ..plan import OpKind as K
from ..plan import placement_v
from .phases import Order, PhasedSchedule, ScheduleError


def dualpipe_v(devices: int, microbatches: int) -> PhasedSchedule:
    P, M = devices, microbatches
    if M < 2 * P:
        raise ScheduleError(
            f"dualpipev needs at least 2 x devices = {2 * P} micro-batches, got {M}"
        )
    orders = []
    for d in range(P):
        c0, c1 = d, 2 * P - 1 - d
        o = Order()

        def overlap(fwd: int, bwd: int, *, o: Order = o) -> None:
            o.add(o.next(K.F, fwd), o.next(K.BW, bwd))

        o.phase("warm-up: phase-0 forwards")
        for _ in range(2 * (P - d - 1)):
            o.put(K.F, c0)
        o.phase("warm-up: phase-0 and phase-1 forwards in turn")
        for _ in range(d + 1):
            o.put(K.F, c0)
            o.put(K.F, c1)
        o.phase("warm-up: phase-1 backward, then forward")
        for _ in range(P - d - 1):
            o.put(K.BW, c1)
            o.put(K.F, c1)
        o.phase("steady: each forward overlapped with a backward of the other phase")
        for i in range(M - 2 * P + d + 1):
            if i == 0 and d == P - 1:
                # DeepSpeed does not overlap the turn-around's first pair (smaller bubble).
                o.put(K.F, c0)
                o.put(K.BW, c1)
            else:
                overlap(c0, c1)
            overlap(c1, c0)
        o.phase("cool-down: phase-1 backward, then forward overlapped with phase-0 backward")
        for _ in range(P - d - 1):
            o.put(K.BW, c1)
            overlap(c1, c0)
        o.phase("cool-down: backwards of both phases")
        for _ in range(d + 1):
            o.put(K.BW, c1)
            o.put(K.BW, c0)
        o.phase("cool-down: the last phase-0 backwards")
        for _ in range(P - d - 1):
            o.put(K.BW, c0)
        orders.append(o.phases)
    return PhasedSchedule(2 * P, placement_v(2 * P, P), orders)
