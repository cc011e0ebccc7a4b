"""The evaluator: a placement seen before compiles from its program, with the same result."""

from __future__ import annotations

from octodsl.tune.pipeline.construct import build_schedule
from octodsl.tune.pipeline.evaluate import Evaluator
from octodsl.tune.pipeline.layout import StageLayout, looped, v_shape

from .helpers import problem


def test_a_placement_seen_before_reuses_its_program():
    pr = problem([1.0, 2.0, 0.5, 3.0, 1.0, 1.0, 2.0, 0.2], 2, 4)

    def plan(cuts, devices, w_gap):
        skel = pr.skeleton(StageLayout(cuts, devices))
        return build_schedule(skel, pr.stage_costs(skel), pr.link, w_gap=w_gap)

    v1 = plan((0, 2, 4, 6, 8), v_shape(2), False)
    loop = plan((0, 4, 8), looped(2, 1), False)
    v2 = plan((0, 1, 3, 6, 8), v_shape(2), True)  # the V again: other cuts, another order
    assert v2.schedule != v1.schedule
    cached = Evaluator(pr)
    first = cached(v1)
    cached(loop)
    again = cached(v2)
    # The V's graph was kept through the looped plan's and reused (same arrays)...
    assert again.result.program.out_dst is first.result.program.out_dst
    # ...and the times match a fresh compile of each plan.
    for p, s in ((v1, first), (v2, again)):
        fresh = Evaluator(pr)(p)
        assert s.time == fresh.time
        assert _starts(s) == _starts(fresh)


def _starts(score):
    """Start time by op (node numbers differ between a reused and a fresh program)."""
    r = score.result
    return {r.program.node_label(n): float(r.start[n]) for n in range(r.program.num_nodes)}
