"""Overlap groups that overlap (issue 29): an op's expert all-to-all runs under the other ops of
its group, never under its own compute (SimProgram.per_slot, DualPipe's rule), so a group takes
the longest of its compute, its communication and its longest op, never more than the sum."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from octodsl.costs import Link, StageCost
from octodsl.costs.resolve import cost_table, header_costing
from octodsl.gen import generate
from octodsl.lang import parse_plan
from octodsl.sim import SimCosts, compile, simulate

FREE = Link("none", 0.0, 0.0)


def _group_plan():
    """Two devices, the second runs F1:1 and B1:0 as one overlap group."""
    return parse_plan(
        """
        plan "group" {
          devices 2
          microbatches 2
        }
        stages 2
        placement loop
        schedule {
          device 0 { F0:0 F0:1 BW0:0 BW0:1 }
          device 1 { F1:0 (F1:1 & BW1:0) BW1:1 }
        }
        """
    )


def _stage(f, b, ep_f=0.0, ep_b=0.0):
    return StageCost(
        f=f, b=b, w=0.0, act=0.0, act_w=0.0, static=0.0, send_bytes=0.0, ep_f=ep_f, ep_b=ep_b
    )


@pytest.mark.parametrize(
    "f,ep_f,b,ep_b,want",
    [
        # compute 2 + 4 = 6 covers the all-to-alls (1 + 2), each op's own chain (3 and 6) too
        (3.0, 1.0, 6.0, 2.0, 6.0),
        # the all-to-alls (4 + 4) outlast the compute (1 + 1): the communication stream sets it
        (5.0, 4.0, 5.0, 4.0, 8.0),
        # one op's own chain (its compute, then its all-to-all) is the longest
        (1.0, 0.0, 9.0, 8.0, 9.0),
        # nothing to hide: the sum, as for any group without all-to-alls
        (3.0, 0.0, 6.0, 0.0, 9.0),
    ],
)
def test_a_group_takes_the_longest_of_compute_communication_and_its_longest_op(
    f, ep_f, b, ep_b, want
):
    p = compile(_group_plan())
    costs = [_stage(1.0, 1.0), _stage(f, b, ep_f, ep_b)]
    r = simulate(p, costs, FREE)
    group = next(n for n in range(p.num_nodes) if p.op_ptr[n + 1] - p.op_ptr[n] == 2)
    assert r.end[group] - r.start[group] == pytest.approx(want)
    # what the group saved on its ops' sum is all-to-all hidden, and no more than there was
    hidden = r.all_to_all_hidden[1]
    assert hidden == pytest.approx(f + b - want)
    assert r.exposed()["all_to_all"][1] == pytest.approx(2 * ep_f + 2 * ep_b - hidden)
    # the ops of the group split its slot in turn, the second ending with it
    spans = [(s.start, s.end) for s in r.ops() if s.device == 1]
    assert spans[1][0] == pytest.approx(r.start[group]) and spans[2][1] == pytest.approx(
        r.end[group]
    )


@given(
    st.lists(
        st.tuples(
            st.floats(0, 10, allow_nan=False),
            st.floats(0, 1, allow_nan=False),
        ),
        min_size=2,
        max_size=4,
    )
)
def test_a_group_is_never_longer_than_its_ops_in_turn_nor_shorter_than_any(ops):
    p = compile(_group_plan())
    seconds = np.array([s for s, _ in ops])
    comm = np.array([s * share for s, share in ops])
    # a program whose one node groups these ops: its per_slot over them
    starts = np.array([0, len(ops)])
    q = dataclasses.replace(p, op_ptr=starts, grouped=True)
    (took,) = q.per_slot(seconds, comm)
    assert seconds.max() <= took <= seconds.sum() * (1 + 1e-12)
    assert took >= (seconds - comm).sum() * (1 - 1e-12) and took >= comm.sum() * (1 - 1e-12)


def test_without_all_to_alls_a_group_is_its_ops_sum_exactly():
    # compute summed is the sum and no single op exceeds it: per_slot returns the same floats
    # as per_node, by construction (the same reduceat over the same values)
    p = compile(generate("dualpipev", 4, 8))
    seconds = np.random.default_rng(0).uniform(0.1, 3.0, len(p.op_kind))
    assert np.array_equal(p.per_slot(seconds, np.zeros_like(seconds)), p.per_node(seconds))


def test_overlapped_dualpipev_hides_all_to_all_and_is_no_slower_than_in_line():
    plan = generate("dualpipev", 4, 16, model="jamba-v0.1", mesh={"dp": 8, "ep": 8})
    table = cost_table(model="jamba-v0.1", device="H800", **header_costing(plan.header))
    costs = SimCosts.from_table(table, plan)
    inline = dataclasses.replace(
        costs, stages=tuple(dataclasses.replace(c, ep_f=0.0, ep_b=0.0) for c in costs.stages)
    )
    over, line = (simulate(plan, c, FREE) for c in (costs, inline))
    assert over.all_to_all_hidden.sum() > 0
    assert line.all_to_all_hidden.sum() == 0
    assert over.iteration_time < line.iteration_time
    assert over.lower_bound <= over.iteration_time
