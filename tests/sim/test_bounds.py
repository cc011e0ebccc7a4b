"""The lower bound's one-micro-batch path is the longest path of micro-batch 0's ops under the
dependency rule (octodsl.dag.producers), which it mirrors as a closed form."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from octodsl.costs.table import Link, StageCost
from octodsl.dag import producers
from octodsl.plan import Op, OpKind
from octodsl.sim.bounds import ring_time, single_microbatch_path

SECONDS = st.floats(1e-6, 10.0, allow_nan=False)


@st.composite
def stages(draw):
    """Stage costs (some with a calibrated fused backward), devices, split flags, cut times."""
    S = draw(st.integers(1, 6))
    costs = [
        StageCost(
            f=draw(SECONDS),
            b=draw(SECONDS),
            w=draw(SECONDS),
            act=0.0,
            act_w=0.0,
            static=0.0,
            send_bytes=0.0,
            bw=draw(st.none() | SECONDS),
        )
        for _ in range(S)
    ]
    device = draw(st.lists(st.integers(0, 2), min_size=S, max_size=S))
    split = draw(st.lists(st.booleans(), min_size=S, max_size=S))
    cut = draw(st.lists(SECONDS, min_size=max(S - 1, 0), max_size=max(S - 1, 0)))
    return costs, np.array(device), np.array(split), np.array(cut, float)


def _longest_path(costs, device, split, cut) -> float:
    """Micro-batch 0's ops, each starting when the last op it needs ends (a message between
    stages of different devices takes the cut's time); the latest end."""
    S = len(costs)
    seconds = {
        OpKind.F: lambda c: c.f,
        OpKind.B: lambda c: c.b,
        OpKind.W: lambda c: c.w,
        OpKind.BW: lambda c: c.fused_backward,
    }
    ops = [Op(OpKind.F, s, 0) for s in range(S)]
    for s in reversed(range(S)):
        ops += [Op(OpKind.B, s, 0), Op(OpKind.W, s, 0)] if split[s] else [Op(OpKind.BW, s, 0)]
    end: dict[tuple[OpKind, int], float] = {}
    for op in ops:  # in an order where every op comes after those it needs
        ready = 0.0
        for kinds, s, _ in producers(op, S):
            (kind,) = [k for k in kinds if (k, s) in end]  # one backward form per stage
            lo = min(s, op.stage)
            wait = cut[lo] if s != op.stage and device[lo] != device[lo + 1] else 0.0
            ready = max(ready, end[kind, s] + wait)
        end[op.kind, op.stage] = ready + seconds[op.kind](costs[op.stage])
    return max(end.values())


@given(stages())
def test_the_single_microbatch_path_is_the_dependency_rules_longest_path(case):
    # The same sums in another order: equal up to rounding.
    costs, device, split, cut = case
    program = SimpleNamespace(num_stages=len(costs), stage_device=device, split=split)
    got = single_microbatch_path(program, costs, cut)  # type: ignore[arg-type]
    assert got == pytest.approx(_longest_path(costs, device, split, cut), rel=1e-12)


LINKS = st.builds(
    Link,
    st.just("link"),
    st.sampled_from([0.0, 1e-6, 3.7e-5]),
    st.sampled_from([0.0, 1.0, 2.5e10, 4.5e11]),
)


@given(
    st.lists(st.floats(0.0, 1e12, allow_nan=False), max_size=8),
    st.integers(1, 64),
    st.integers(1, 2),
    st.one_of(LINKS, st.lists(LINKS, min_size=8, max_size=8)),
)
def test_ring_time_is_each_elements_link_ring(nbytes, ranks, passes, link):
    # The same float operations in the same order on each element: equal exactly.
    links = [link] * len(nbytes) if isinstance(link, Link) else link[: len(nbytes)]
    got = ring_time(np.array(nbytes), ranks, link if isinstance(link, Link) else links, passes)
    want = [k.ring(b, ranks, passes) for b, k in zip(np.array(nbytes), links, strict=True)]
    assert got.tolist() == want
