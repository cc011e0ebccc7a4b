"""The tuner's compiled kernels restate rules that live once elsewhere (numba compiles only what
it can see): the recompute and memory rules of octodsl.costs.levers, the stage sums of
`CostTable.stage_costs`, the dependency rule of `dag.producers`. Each mirror is held equal to
its rule here, on random inputs, plans and models."""

from __future__ import annotations

import functools
from dataclasses import replace

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from octodsl.costs.levers import Zero, held_change, op_bytes, recomputed
from octodsl.costs.table import Link
from octodsl.dag import producers
from octodsl.plan import Op, OpKind, Recompute
from octodsl.sim.program import KIND_OF_CODE
from octodsl.tune.pipeline import construct, estimate
from octodsl.tune.pipeline.estimate import FillModel, recomputed_code
from octodsl.tune.pipeline.evaluate import Evaluator
from octodsl.tune.pipeline.layout import StageLayout, looped, v_shape
from octodsl.tune.pipeline.moves.schedule import rebuild
from octodsl.tune.problem import Problem
from octodsl.tune.reference import cpsat

from .helpers import fuse_backwards, problem

MODES = list(Recompute)
BYTES = st.floats(0.0, 1e9)
SECONDS = st.floats(0.0, 10.0)


@settings(max_examples=200, deadline=None)
@given(st.sampled_from(MODES), SECONDS, BYTES, SECONDS, BYTES, BYTES)
def test_the_estimates_recompute_rule_is_the_levers(mode, f, act, sel_f, sel_act, input_bytes):
    # The same operations on the same floats: equal exactly.
    code = {Recompute.NONE: 0, Recompute.SELECTIVE: 1, Recompute.FULL: 2}[mode]
    assert recomputed_code(code, f, act, sel_f, sel_act, input_bytes) == recomputed(
        mode, f, act, sel_f, sel_act, input_bytes
    )


@settings(max_examples=200, deadline=None)
@given(st.integers(0, 3), BYTES, BYTES, BYTES)
def test_the_schedulers_memory_rule_is_the_levers(kind, act, act_w, act_b):
    # The list scheduler's copy equals the rule exactly (the same operations); the rule is the
    # simulator's allocation less its release up to rounding (act_b added and taken away).
    assert construct.held_change(kind, act, act_w) == held_change(kind, act, act_w)
    alloc, release = op_bytes(np.array([act]), np.array([act_w]), np.array([act_b]))
    assert alloc[0, kind] - release[0, kind] == pytest.approx(
        held_change(kind, act, act_w), rel=1e-12, abs=1e-3
    )


def test_zero_stages_shard_and_reduce_as_the_simulator_does():
    for stage in Zero:
        run = problem(
            [3.0] * 4, 2, 4, dp=2, zero=int(stage), static=16.0, link=Link("slow", 1e-3, 1e3)
        )
        skeleton = run.skeleton(StageLayout((0, 2, 4), (0, 1)))
        plan = construct.build_schedule(skeleton, run.stage_costs(skeleton), run.link)
        dpc = Evaluator(run)(plan).result.dp_comm
        assert dpc.reduction_kind == stage.reduction()
        assert (dpc.all_gather.sum() > 0) == stage.gathers_parameters
        assert (dpc.allreduce.sum() > 0) == (stage is Zero.NONE)
        # the tuner's static bytes per layer are the simulator's per device
        held = run.layer_static()
        assert Evaluator(run)(plan).result.memory.static.tolist() == pytest.approx(
            [held[:2].sum(), held[2:].sum()], rel=1e-12
        )


@functools.cache
def _model(name: str, zero: int) -> Problem:
    return Problem.create(name, 4, 8, memory=None, dp=2 if zero else 1, zero=zero)


@st.composite
def layouts(draw):
    """A built-in model's problem, and a layout of it: cuts, a placement, recompute modes."""
    pr = _model(
        draw(st.sampled_from(["nemotron-h-tiny", "jamba-tiny"])), draw(st.sampled_from([0, 1, 2]))
    )
    devices = draw(st.sampled_from([tuple(range(4)), v_shape(4), looped(4, 2)]))
    inner = sorted(
        draw(
            st.sets(
                st.integers(1, pr.num_layers - 1),
                min_size=len(devices) - 1,
                max_size=len(devices) - 1,
            )
        )
    )
    modes = tuple(
        draw(st.lists(st.sampled_from(MODES), min_size=len(devices), max_size=len(devices)))
    )
    return pr, StageLayout((0, *inner, pr.num_layers), devices, modes)


@settings(max_examples=40, deadline=None)
@given(layouts(), st.booleans())
def test_the_estimates_stage_sums_are_the_cost_tables(case, fused):
    # Prefix-sum differences against sums layer by layer: equal up to rounding. W with the
    # gradient-accumulation pass or without it, as the header's grad_accumulation_fusion says.
    pr, layout = case
    pr.header = pr.header.model_copy(update={"grad_accumulation_fusion": fused})
    sums = FillModel(pr, layout.devices, layout.recompute).stage_sums(layout.cuts)
    costs = pr.stage_costs(pr.skeleton(layout))
    assert fused or any(l.grad_acc > 0 for l in pr.table.layers)  # the pass is there to count
    close = functools.partial(pytest.approx, rel=1e-9, abs=1e-12)
    assert list(sums.f) == close([c.f for c in costs])
    assert list(sums.b) == close([c.b for c in costs])
    assert list(sums.act) == close([c.act for c in costs])
    assert list(sums.brought) == close([c.act_b for c in costs])
    assert list(sums.static) == close([c.static for c in costs])
    assert list(sums.load) == close([c.f + c.b + c.w for c in costs])


@settings(max_examples=40, deadline=None)
@given(layouts(), st.booleans(), st.sampled_from(["walk", "pilot"]))
def test_the_list_schedulers_order_respects_dag_producers(case, w_gap, how):
    # The scheduler's run order, and the pilot method's: every op runs after one op of each
    # kind its producers list.
    pr, layout = case
    plan = pr.skeleton(layout)
    x = construct._arrays(plan, pr.stage_costs(plan), pr.link, None, w_gap)
    order, _ = construct._walk(x) if how == "walk" else construct._pilot(x)
    done = set()
    for kind, stage, mb in zip(
        order.kind.tolist(), order.stage.tolist(), order.mb.tolist(), strict=True
    ):
        op = Op(KIND_OF_CODE[kind], stage, mb)
        for kinds, s, m in producers(op, layout.num_stages):
            assert any((k, s, m) in done for k in kinds), (op, kinds, s, m)
        done.add((op.kind, stage, mb))
    assert len(done) == 3 * layout.num_stages * pr.microbatches


@settings(max_examples=40, deadline=None)
@given(layouts())
def test_the_estimates_first_trip_follows_dag_producers(case):
    # Micro-batch 0 with a device per op: each op starts when the last of its producers ends
    # (a message between stages of different devices takes the cut's time). The estimate's
    # arrivals are its forwards' starts, its backs its input gradients' starts.
    pr, layout = case
    model = FillModel(pr, layout.devices, layout.recompute)
    cuts = np.asarray(layout.cuts, np.int64)
    sums = model.stage_sums(cuts)
    scratch = model.scratch._replace(st=sums)
    estimate._first_trip(cuts, model.inputs, scratch)
    arrive, back = scratch.arrive, scratch.back
    S, devices = layout.num_stages, layout.devices

    def hop(a: int, b: int) -> float:  # between stages a and b = a + 1
        return 0.0 if devices[a] == devices[b] else float(model.inputs.hop[a, cuts[b] - 1])

    seconds = {OpKind.F: sums.f, OpKind.B: sums.b}
    start: dict[tuple[OpKind, int], float] = {}
    for op in [Op(OpKind.F, s, 0) for s in range(S)] + [
        Op(OpKind.B, s, 0) for s in reversed(range(S))
    ]:
        ready = 0.0
        for kinds, s, _ in producers(op, S):
            (kind,) = [k for k in kinds if k in seconds]  # every backward is split here
            wait = hop(min(s, op.stage), max(s, op.stage)) if s != op.stage else 0.0
            ready = max(ready, start[kind, s] + seconds[kind][s] + wait)
        start[op.kind, op.stage] = ready
    assert list(arrive) == pytest.approx([start[OpKind.F, s] for s in range(S)], rel=1e-12)
    assert list(back) == pytest.approx([start[OpKind.B, s] for s in range(S)], rel=1e-12)


class _Term:
    """A CP-SAT variable stand-in that records `start >= end + hop` as (start, end, hop)."""

    def __init__(self, key: tuple):
        self.key = key

    def __add__(self, hop: int) -> tuple[tuple, int]:
        return self.key, hop

    def __ge__(self, other: _Term | tuple[tuple, int]) -> tuple[tuple, tuple, int]:  # type: ignore[override]
        key, hop = other if isinstance(other, tuple) else (other.key, 0)
        return self.key, key, hop


class _Recorder:
    def __init__(self) -> None:
        self.constraints: list[tuple[tuple, tuple, int]] = []

    def add(self, constraint: tuple[tuple, tuple, int]) -> None:
        self.constraints.append(constraint)


@settings(max_examples=100, deadline=None)
@given(
    st.lists(st.integers(0, 2), min_size=1, max_size=6),
    st.integers(1, 3),
    st.lists(st.integers(1, 50), min_size=6, max_size=6),
)
def test_the_cpsat_precedences_are_dag_producers(devs, M, hops):
    # Every op waits for the end of each op it needs (one of the kinds producers lists; CP-SAT
    # splits every backward), plus the cut's hop between stages of different devices, and for
    # nothing else but the start of its stage's previous micro-batch of its kind.
    S = len(devs)
    keys = [(k, s, i) for k in "FBW" for s in range(S) for i in range(M)]
    start = {key: _Term(("start", *key)) for key in keys}
    end = {key: _Term(("end", *key)) for key in keys}
    model = _Recorder()
    cpsat._precedences(model, devs, M, start, end, hops)
    waits = {(a, b, h) for a, b, h in model.constraints if b[0] == "end"}
    expected = set()
    for k, s, i in keys:
        for kinds, ps, pm in producers(Op(OpKind(k), s, i), S):
            (kind,) = [x for x in kinds if x.value in ("F", "B", "W")]
            lo = min(s, ps)
            hop = hops[lo] if ps != s and devs[lo] != devs[lo + 1] else 0
            expected.add((("start", k, s, i), ("end", kind.value, ps, pm), hop))
    assert waits == expected
    in_order = {(a, b) for a, b, h in model.constraints if b[0] == "start"}
    assert in_order == {(("start", k, s, i), ("start", k, s, i - 1)) for k, s, i in keys if i > 0}


@settings(max_examples=30, deadline=None)
@given(layouts(), st.integers(1, 3))
def test_the_cpsat_order_model_times_and_holds_as_the_simulator(case, every):
    # CP-SAT's model of a kept layout (recompute, fused backwards) against the simulation of a
    # plan of it: each op lasts its model seconds, each message its cut's hop (whole
    # microseconds, rounded down), and at each op's start the spans the model holds on its
    # device add up to the simulator's level there less the static bytes (unit: one byte).
    pr, layout = case
    plan = fuse_backwards(rebuild(pr.skeleton(layout), pr, w_gap=True), every)
    result = Evaluator(pr)(plan).result
    bytes_unit = replace(pr, header=pr.header.model_copy(update={"memory": cpsat._MEMORY_STEPS}))
    st = cpsat._plan_stages(bytes_unit, plan)
    seconds = {"F": st.f, "B": st.b, "W": st.w, "BW": st.bw}
    ops = list(result.ops())  # one per node: no overlap groups here
    at: dict[tuple, float] = {}
    for op in ops:
        assert abs(cpsat._us(op.end - op.start) - seconds[op.kind][op.stage]) <= 1, op
        kind = "B" if op.kind == "BW" else op.kind
        at["start", kind, op.stage, op.mb], at["end", kind, op.stage, op.mb] = op.start, op.end
        if op.kind == "BW":  # the model's W of a fused backward: the instant it ends
            at["start", "W", op.stage, op.mb] = at["end", "W", op.stage, op.mb] = op.end
    assert cpsat._fused(plan) == {(op.stage, op.mb) for op in ops if op.kind == "BW"}
    for msg in result.messages():
        cut = msg.stage if msg.kind == "F" else msg.stage - 1
        assert abs(cpsat._us(msg.end - msg.start) - st.hops[cut]) <= 1, msg
    mem = result.memory
    held = cpsat._held(layout.devices, pr.microbatches, st)
    assert len(ops) == len(mem.at_start)
    for node, op in enumerate(ops):
        spans = held[op.device]
        level = sum(units for a, e, units in spans if at[a] <= op.start < at[e])
        assert level == pytest.approx(mem.at_start[node] - mem.static[op.device], abs=len(spans))
