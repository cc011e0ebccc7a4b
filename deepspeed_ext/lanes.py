"""Overlap groups that overlap: a group `(F0:7 & BW7:3)` runs its forward on a second execution
lane while this rank's thread runs the backward, so that each op's expert all-to-alls run while
the other op computes (DualPipe's rule, which `octodsl simulate` costs).

Why threads and not a cooperative split of the two ops: the backward runs inside autograd, which
cannot be suspended at an all-to-all and resumed later; a thread can simply wait there. Each lane
waits for its own all-to-alls (asynchronous work handles, through the watchdog), and the other
lane computes meanwhile (torch releases the GIL in its kernels and in `Work.wait`).

The rules that make two ops safe to run at once, and why a group runs in turn otherwise
(`in_turn_reason`):
- ep > 1: without expert all-to-alls there is nothing to hide and the simulator costs such a
  group as its ops in turn, so they run in turn (the same operations either way).
- tp 1: the layers' tp collectives are on their tp group, and collectives on one group must be
  issued in the same order on every rank of it; two threads sharing it would not guarantee that.
  The ep all-to-alls get the same protection from a second ep group (below).
- one forward and one backward (B, BW or W): a forward activates its stage in the module
  (DeepSpeed's `forward_funcs`, its per-layer seeds) and two would race there; a backward
  accumulates weight gradients (and swaps the tied weights' `.grad`, engine `_weight_grads`),
  and two would add into the same `.grad` in an order that changes from run to run. With one of
  each, the ops share only read-only weights and the engine's dictionaries (distinct keys), so
  the group computes exactly what it computes in turn. Ops of the same stage pair safely too.
- neither stage recomputes: selective recompute's scope is process-wide
  (`octodsl.layers.recompute`), and a fully recomputing backward runs a forward.

The forward runs in the lane, the backward on the rank's own thread: autograd may run a backward
on its own worker threads (CUDA), where a thread-local setting would not reach, so the backward
keeps the layers' ep group and the forward issues on the lane's (`expert_parallel.lane`). Every
rank of an ep group runs the same device's program, so each of the two groups sees the same
sequence of all-to-alls on every rank (the lane group: the groups' forwards in program order;
the layers' group: every other op's), and neither lane waits for the other inside a group: no
cross-lane deadlock.

On CUDA each local stage's forwards in a lane run on a stream of that stage's, and their
backward later runs on the same stream (autograd runs a backward op on its forward op's stream):
a group's backward, of another stage, thus computes on another stream than its forward (a
backward of the same stage shares the stream, and its kernels queue behind the forward's).
The lane's stream first waits for the rank's stream (what produced the inputs), the inputs are
recorded on it and the forward's outputs on the rank's stream (so that the caching allocator does
not hand their memory to another stream while one still reads them), and the rank's stream waits
for the lane's before anything after the group. Not exercised here (no GPU in the tests):
benchmarks/gpu_check.sh runs it on GPUs. There the two ep groups are two NCCL communicators
whose kernels may run at the same time; NCCL warns that concurrent communicators can deadlock
when their kernels cannot all be resident on the GPU at once (its documentation, "Using
multiple NCCL communicators concurrently"), which the gpu_check run is there to rule out.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Sequence
from contextlib import nullcontext
from typing import Any

import torch

from ..layers import expert_parallel
from ..plan import Op, OpKind, Recompute, Slot


def in_turn_reason(
    ops: Sequence[Op], recompute: Sequence[Recompute], ep: int, tp: int
) -> str | None:
    """Why the overlap group `ops` runs its ops one after the other (None: they run at once)."""
    if ep == 1:
        return "ep 1: no expert all-to-alls to hide"
    if tp > 1:
        return "at tp > 1 both ops' tp collectives would share their layers' one tp group"
    forwards = [op for op in ops if op.kind is OpKind.F]
    if len(ops) != 2 or len(forwards) != 1:
        return (
            "it does not pair one forward with one backward (two forwards share the module's "
            "active stage; two backwards add into the same gradients)"
        )
    for op in ops:
        if recompute[op.stage] is not Recompute.NONE:
            return f"stage {op.stage} recomputes (recompute's scope is process-wide)"
    return None


def in_turn_note(device: int, groups: Sequence[tuple[Op, ...]], recompute, ep: int, tp: int):
    """At ep > 1, the line naming the first of a device's overlap groups that runs in turn and
    why (None when every group runs at once, or at ep 1, where none do by design)."""
    in_turn = [(ops, why) for ops in groups if (why := in_turn_reason(ops, recompute, ep, tp))]
    if ep == 1 or not in_turn:
        return None
    (ops, why), more = in_turn[0], len(in_turn) - 1
    return f"octodsl: device {device}: overlap group {Slot(ops)} runs its ops in turn: {why}" + (
        f" (and {more} more)" if more else ""
    )


class Lane:
    """The second execution lane of a rank: its ep process group, and on CUDA a stream per
    local stage."""

    def __init__(self, group: Any, device: torch.device, stages: Iterable[int]):
        self.group = group
        self.device = device
        self.cuda = device.type == "cuda"
        self.streams = {s: torch.cuda.Stream(device) for s in stages} if self.cuda else {}

    def run(
        self,
        stage: int,
        inputs: list[torch.Tensor],
        side: Callable[[], None],
        here: Callable[[], None],
        wait: expert_parallel.Wait,
    ) -> None:
        """`side` (a forward of `stage`, reading `inputs`) on the lane, its all-to-alls on the
        lane's group waited with `wait`, while `here` runs on this thread; returns when both are
        done. An exception of either is raised here: `here`'s at once (the lane, a daemon, may be
        stuck on a peer that will never come; the watchdog ends it), else the lane's."""
        stream = self.streams.get(stage)
        if stream is not None:
            stream.wait_stream(torch.cuda.current_stream(self.device))
            for t in inputs:
                if t.is_cuda:
                    t.record_stream(stream)
        grad = torch.is_grad_enabled()  # thread-local in torch: the lane takes this thread's
        errors: list[BaseException] = []

        def lane() -> None:
            try:
                with (
                    torch.set_grad_enabled(grad),
                    torch.cuda.device(self.device) if self.cuda else nullcontext(),
                    torch.cuda.stream(stream) if stream is not None else nullcontext(),
                    expert_parallel.lane(self.group, wait),
                ):
                    side()
            except BaseException as e:  # raised again on the rank's thread
                errors.append(e)

        thread = threading.Thread(target=lane, name=f"octodsl-lane-stage-{stage}", daemon=True)
        thread.start()
        here()
        thread.join()
        if errors:
            raise errors[0]
        if stream is not None:
            torch.cuda.current_stream(self.device).wait_stream(stream)

    def handed_out(self, outputs: list[torch.Tensor]) -> None:
        """After `run`: the forward's outputs, now used on the rank's stream."""
        if self.cuda:
            current = torch.cuda.current_stream(self.device)
            for t in outputs:
                if t.is_cuda:
                    t.record_stream(current)
