"""The simulator against closed forms: uniform costs, zero or fixed communication."""

from __future__ import annotations

import pytest

from octodsl.costs import Link, uniform_stage_costs
from octodsl.gen import generate
from octodsl.sim import simulate

from .plans import make_plan

FREE = Link("none", 0.0, 0.0)
COSTS = [(1.0, 1.0, 1.0), (1.0, 1.0, 0.5), (1.0, 2.0, 1.0), (0.7, 1.3, 0.4)]
SHAPES = [(2, 2), (4, 8), (4, 4), (8, 16), (3, 7)]


def run(plan, f, b, w, link=FREE, **kw):
    return simulate(plan, uniform_stage_costs(plan.num_stages, f, b, w, **kw), link)


@pytest.mark.parametrize("name", ["gpipe", "1f1b"])
@pytest.mark.parametrize("p,m", SHAPES)
@pytest.mark.parametrize("f,b,w", COSTS)
def test_gpipe_and_1f1b_makespan(name, p, m, f, b, w):
    r = run(generate(name, p, m), f, b, w)
    assert r.iteration_time == pytest.approx((m + p - 1) * (f + b + w))
    assert r.idle == pytest.approx([(p - 1) * (f + b + w)] * p)
    assert r.bubble_ratio == pytest.approx((p - 1) / (m + p - 1))


@pytest.mark.parametrize("p,m", SHAPES)
@pytest.mark.parametrize("f,b,w", [c for c in COSTS if c[2] <= c[0]])
def test_zb_h1_bubble(p, m, f, b, w):
    # ZB-H1's bound holds while W fits in the gaps it fills (W <= F).
    r = run(generate("zb-h1", p, m), f, b, w)
    assert r.idle == pytest.approx([(p - 1) * (f + b - w)] * p)
    assert r.iteration_time == pytest.approx(m * (f + b + w) + (p - 1) * (f + b - w))


@pytest.mark.parametrize("p,m", [(4, 8), (4, 16), (8, 16)])
def test_interleaved_bubble_shrinks_with_chunks(p, m):
    # The same model cut into v chunks per device: each chunk costs 1/v of a device's share.
    bubbles = []
    for v in (1, 2, 4):
        plan = generate("1f1b", p, m) if v == 1 else generate("interleaved", p, m, v)
        r = run(plan, 1 / v, 1 / v, 1 / v)
        bubbles.append(r.idle[0])
        assert r.idle == pytest.approx([(p - 1) * 3 / v] * p)
    assert bubbles[0] > bubbles[1] > bubbles[2]


def test_free_link_is_compute_alone():
    plan = generate("zb-v", 4, 8)
    zero = run(plan, 1, 1, 1, link=Link("zero", 0.0, 1e9), send_bytes=0.0)
    none = run(plan, 1, 1, 1, send_bytes=1e9)
    assert zero.iteration_time == none.iteration_time
    assert none.comm.sum() == 0 and none.overlap_rate == 1.0


@pytest.mark.parametrize("p", [2, 3, 5])
def test_latency_added_once_per_crossing_1f1b(p):
    # One micro-batch: forwards down, backwards up; 2 (p - 1) messages on the path.
    c = 0.25
    plain = run(generate("1f1b", p, 1), 1, 1, 1)
    slow = run(generate("1f1b", p, 1), 1, 1, 1, link=Link("fixed", c, 0.0))
    assert plain.iteration_time == pytest.approx(p * 3)
    assert slow.iteration_time == pytest.approx(p * 3 + 2 * (p - 1) * c)
    assert slow.lower_bound == pytest.approx(slow.iteration_time)


def test_latency_not_added_between_stages_on_one_device():
    # V placement on 2 devices: stages 0,3 on device 0 and 1,2 on device 1; the turn 1 -> 2
    # stays on device 1, so the path crosses devices 2 times forward and 2 times back.
    c, order = (
        0.5,
        [
            ["F0:0", "F3:0", "B3:0", "W3:0", "B0:0", "W0:0"],
            ["F1:0", "F2:0", "B2:0", "B1:0", "W2:0", "W1:0"],
        ],
    )
    plan = make_plan(2, 1, order, num_stages=4, placement=[(0, 3), (1, 2)])
    plain = run(plan, 1, 1, 1)
    slow = run(plan, 1, 1, 1, link=Link("fixed", c, 0.0))
    assert plain.iteration_time == pytest.approx(4 + 4 + 1)
    assert slow.iteration_time == pytest.approx(plain.iteration_time + 4 * c)


def test_messages_from_one_device_share_its_stream():
    # Two activations leave device 0 one time unit apart but each takes 3: the second waits.
    c = 3.0
    plan = make_plan(2, 2, [["F0:0", "F0:1", "BW0:0", "BW0:1"], ["F1:0", "F1:1", "BW1:0", "BW1:1"]])
    r = run(plan, 1, 1, 0, link=Link("fixed", c, 0.0))
    starts = {op.label: op.start for op in r.ops()}
    assert starts["F1:0"] == pytest.approx(1 + c)
    assert starts["F1:1"] == pytest.approx(1 + 2 * c)


def test_messages_the_other_way_do_not_wait():
    # Full-duplex links: the gradient device 1 sends back at 6 starts at once, while device 0's
    # second activation (sent 4..7) is still arriving there; one stream per device would hold
    # the gradient until 7.
    c = 3.0
    plan = make_plan(2, 2, [["F0:0", "F0:1", "BW0:0", "BW0:1"], ["F1:0", "BW1:0", "F1:1", "BW1:1"]])
    r = run(plan, 1, 1, 0, link=Link("fixed", c, 0.0))
    starts = {op.label: op.start for op in r.ops()}
    assert starts["F1:1"] == pytest.approx(4 + c)
    assert starts["BW0:0"] == pytest.approx(6 + c)


def test_bandwidth_term_uses_the_cut_size():
    plan = generate("1f1b", 2, 1)
    link = Link("bw", 0.0, 100.0)
    r = run(plan, 1, 1, 1, link=link, send_bytes=50.0)
    assert r.iteration_time == pytest.approx(6 + 2 * 0.5)


@pytest.mark.parametrize("p,m", [(4, 8), (4, 16), (8, 32)])
def test_memory_1f1b_holds_p_microbatches_gpipe_m(p, m):
    one = run(generate("1f1b", p, m), 1, 1, 1)
    gp = run(generate("gpipe", p, m), 1, 1, 1)
    # uniform costs: one unit of activation per micro-batch and stage, no static memory
    assert one.peak_memory[0] == p
    assert list(one.peak_memory) == [p - d for d in range(p)]
    assert list(gp.peak_memory) == [m] * p
    assert one.peak_ops()[0] == f"F0:{p - 1}"


def test_split_backward_keeps_act_w_until_w():
    # F allocates 1; B releases down to act_w = 0.5; W releases the rest.
    plan = make_plan(1, 2, [["F0:0", "F0:1", "B0:0", "B0:1", "W0:0", "W0:1"]])
    r = run(plan, 1, 1, 1)
    assert r.peak_memory[0] == 2
    levels = [level for _, level in r.memory_events(0)]
    assert levels == [0, 1, 1, 2, 2, 2, 1.5, 1.5, 1.0, 1.0, 0.5, 0.5, 0.0]
