"""`gen interleaved` and the simulator against Megatron-LM's interleaved loop itself.

benchmarks/published_interleaved.py transcribes `forward_backward_pipelining_with_interleaving`
(ZeroBubble's Megatron-LM fork, branch 'arxiv', commit f68d3879,
megatron/core/pipeline_parallel/schedules.py, as the zerobubble2024 1F1B-I rows ran it) into
each rank's computes, posts and waits, and replays them on NCCL's point-to-point semantics. Two
things hold here: octodsl's interleaved order is that loop's, op by op, whenever the loop runs
1F1B (p > 2, p | m, m > p); and with `overlap_p2p_comm` the simulator's iteration is the loop's,
although the loop waits on its sends too (before the next op of the same kind) and posts a
receive only where it posts it: those waits never bind when every stage costs the same.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from octodsl.costs import Link, uniform_stage_costs
from octodsl.gen import generate
from octodsl.sim import simulate

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import published_interleaved as megatron  # noqa: E402

SHAPES = [(4, 2, 8), (4, 4, 12), (8, 3, 24), (8, 2, 16), (16, 3, 48)]
"""(p, v, m), p | m and m > p: Megatron's loop runs its warm-up, 1F1B and cool-down."""


@pytest.mark.parametrize("p,v,m", SHAPES)
def test_gen_interleaved_is_megatrons_order(p, v, m):
    plan = generate("interleaved", p, m, v)
    for rank in range(p):
        ours = [str(slot).replace("BW", "B") for slot in plan.schedule[rank]]
        loop = [f"{kind}{stage}:{mb}" for kind, stage, mb in megatron.megatron_order(p, v, m, rank)]
        assert ours == loop, f"rank {rank}"


@pytest.mark.parametrize("p,v,m", SHAPES[:4])
@pytest.mark.parametrize("f,b,comm", [(1.0, 2.0, 0.3), (1.0, 2.0, 1.0), (1.0, 1.0, 0.1)])
def test_simulator_times_megatrons_overlapped_loop(p, v, m, f, b, comm):
    plan = generate("interleaved", p, m, v, mesh={"overlap_p2p_comm": True})
    costs = uniform_stage_costs(plan.num_stages, f, b / 2, b / 2)
    ours = simulate(plan, costs, Link("p2p", comm, 0.0)).pipeline_time
    loop = megatron.replay(p, v, m, [[f] * p] * v, [[b] * p] * v, [comm] * (p * v), True)
    # the same sums of the same durations along the same critical path: equal to rounding
    assert loop.time == pytest.approx(ours, rel=1e-9)
