"""`gen 1f1b` and the simulator against DeepSpeed's stock pipeline schedule itself.

benchmarks/published_deepspeed.py transcribes DeepSpeed's `TrainSchedule` (0.4.0 to 0.6.7, the
releases BLOOM and MT-NLG ran) into each rank's computes and blocking sends and receives, and
replays them on NCCL's point-to-point semantics (benchmarks/published_interleaved.py's replay).
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from octodsl.gen import generate

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import published_deepspeed as deepspeed_loop  # noqa: E402
import published_interleaved as replays  # noqa: E402

SHAPES = [(p, m) for p in (2, 3, 4, 5, 8) for m in (1, 2, p - 1, p, p + 1, 3 * p)]
"""Fewer micro-batches than stages too: the schedule's fill and drain alone."""


def _replay(p: int, m: int, f: float, b: float, msg: float, host: float = 0.0) -> float:
    loops = [deepspeed_loop.train_schedule(p, m, r, host) for r in range(p)]
    return replays.replay_loops(p, 1, loops, [[f] * p], [[b] * p], [msg] * p).time


def test_the_step_mapping_is_deepspeeds():
    # The step -> (micro-batch, forward) mapping has not changed since 0.4.0: the installed
    # DeepSpeed checks the transcription (only the order of each step's sends and receives
    # changed later, which the transcription keeps as 0.4.0-0.6.7 had it).
    from deepspeed.runtime.pipe.schedule import TrainSchedule

    for p, m in SHAPES:
        for stage in range(p):
            sched = TrainSchedule(micro_batches=m, stages=p, stage_id=stage)
            for step in range(2 * (m + p - 1)):
                got = deepspeed_loop._step(stage, p, step)
                assert got == sched._step_to_micro_batch(step), (p, m, stage, step)


@pytest.mark.parametrize("p,m", SHAPES)
def test_gen_1f1b_is_deepspeeds_order(p, m):
    plan = generate("1f1b", p, m)
    for rank in range(p):
        ours = [str(slot).replace("BW", "B") for slot in plan.schedule[rank]]
        theirs = [
            f"{a[1]}{rank}:{a[2]}" for a in deepspeed_loop.train_schedule(p, m, rank) if a[0] == "C"
        ]
        assert ours == theirs, f"rank {rank}"


@pytest.mark.parametrize("p,m", SHAPES)
def test_its_lockstep_costs_nothing_by_itself(p, m):
    # Equal stages and free messages: every rendezvous is met as the stages reach it, and the
    # schedule takes 1F1B's (m + p - 1)(F + B). Whole numbers of seconds: the sums are exact.
    assert _replay(p, m, 1.0, 2.0, 0.0) == (m + p - 1) * 3.0


@pytest.mark.parametrize("p,m", [(4, 8), (8, 24)])
def test_messages_and_the_host_wait_add_to_it(p, m):
    free = _replay(p, m, 1.0, 2.0, 0.0)
    sent = _replay(p, m, 1.0, 2.0, 0.1)
    # every stage waits out each transfer it takes part in, so more than one per op
    assert sent > free + 2 * (m + p - 1) * 0.1
    assert _replay(p, m, 1.0, 2.0, 0.1, host=0.05) > sent
