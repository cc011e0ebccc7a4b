"""The walk's outputs on a few plans, compared exactly with values recorded from the code.

Exactness holds on any machine: the walk, the memory levels and the sharing model are scalar
IEEE additions, subtractions, multiplications, divisions and comparisons of the same inputs in
the same order (numba compiles them without fast-math, so without reassociation or fused
multiply-adds), and the only numpy operations on the recorded values are elementwise or
sequential (bincount). Nothing recorded comes from a library reduction (sum, dot), whose order
may depend on the CPU. A change to these numbers is a change to the model: regenerate with
OCTODSL_UPDATE_GOLDEN=1 only when that is intended.
"""

from __future__ import annotations

import json
from pathlib import Path

from octodsl.costs import Link, StageCost
from octodsl.gen import generate
from octodsl.sim import SimCosts, simulate
from octodsl.sim.sharing import Sharing

from ..conftest import check_golden

GOLDEN = Path(__file__).parent / "data" / "golden_walk.json"
LINK = Link("odd", 0.003, 7e3)


def _costs(num_stages: int) -> list[StageCost]:
    # Uneven, non-dyadic costs, so that every sum rounds and a change of order would show.
    return [
        StageCost(
            f=0.1 * (s + 1) + 0.013,
            b=0.17 + 0.03 * s,
            w=0.05 + 0.011 * s,
            act=10.0 + s / 3,
            act_w=4.0 + s / 7,
            static=100.0 + s,
            send_bytes=11.0 + s,
            update=0.021 * (s + 1),
        )
        for s in range(num_stages)
    ]


def _cases():
    zb_v = generate("zb-v", 3, 6)
    yield "zb-v 3x6", zb_v, SimCosts(tuple(_costs(6))), {}
    dual = generate("dualpipev", 3, 6)  # overlap groups
    yield "dualpipev 3x6", dual, SimCosts(tuple(_costs(6))), {}
    inter = generate("interleaved", 3, 6, chunks=2)
    yield "interleaved 3x6", inter, SimCosts(tuple(_costs(6))), {}
    one = generate("1f1b", 3, 6)
    shared = SimCosts(
        tuple(_costs(3)),
        grad_bytes=(1e4, 2e4, 3e4),
        step_overhead=0.0101,
        sharing=Sharing(2.0, 0.07, 0.3, 0.1),
    )
    yield "1f1b 3x6 sharing dp 4", one, shared, {"dp": 4}


def _record(result) -> dict:
    return {
        "iteration_time": result.iteration_time,
        "pipeline_time": result.pipeline_time,
        **{
            k: getattr(result, k).tolist()
            for k in (
                "start",
                "end",
                "pred",
                "msg_start",
                "msg_end",
                "msg_pred",
                "stream_log",
                "allreduce",
                "busy",
                "comm",
                "comm_exposed",
                "op_dur",
            )
        },
        "peak": result.memory.peak.tolist(),
        "peak_node": result.memory.peak_node.tolist(),
        "at_start": result.memory.at_start.tolist(),
        "at_end": result.memory.at_end.tolist(),
    }


def test_walk_outputs_are_the_recorded_ones():
    out = {name: _record(simulate(plan, costs, LINK, **kw)) for name, plan, costs, kw in _cases()}
    check_golden(GOLDEN, json.dumps(out, indent=0, sort_keys=True) + "\n")
