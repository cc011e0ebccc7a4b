"""The exact baseline: partition and schedule as one constraint program (OR-Tools CP-SAT), for a
fixed placement, solved for the same budget as the tuner, warm-started from a plan or not.

Model (times in whole microseconds, rounded down so that a simulated plan is a valid warm
start; memory in 2**-20ths of the limit, rounded down too, so that a plan within the limit
is within the model's: the model is a relaxation, its bound a bound):
- layer l is in exactly one stage; stage indices never decrease along the layers and grow by at
  most one, so stages are consecutive, non-empty layer ranges;
- each stage's F, B and W take the sums of its layers' times; each (kind, stage, micro-batch)
  is an interval on the stage's device; a device runs one interval at a time;
- F(s,m) after F(s-1,m), B(s,m) after F(s,m) and B(s+1,m), W(s,m) after B(s,m), plus the
  link's time for an activation or gradient between devices (the largest layer output, on the
  cut's link: the inter-node one where its ranks sit in different nodes);
- memory: F holds its stage's activations until B ends, the part kept for W until W ends; with
  the static bytes of the device's layers (ZeRO-sharded as the header says), within the limit;
- micro-batches run in order on each stage (the classic schedules all do; it removes symmetric
  solutions);
- minimise the end of the last op.
Message contention is not modelled, nor recompute: the model keeps every activation and
counts no recompute time; the solution's plan gets the problem's fixed recompute mode, if any
(`Problem.skeleton`), and is timed by the simulator like every other plan.

With `keep_partition` the hint's whole layout is kept, and the model is the simulator's on it:
each stage's times and bytes are the simulator's costs of the hint (`Problem.sim_costs`), so
its recompute counts (B's extra time, and the bytes it brings back while B runs,
`StageCost.act_b`); a backward the hint runs fused is one interval of `fused_backward` seconds
that releases all its stage's activations at its end (octodsl/sim/memory.py); a message takes
its cut's `send_bytes` on the cut's link plus `message_overhead`, as `simulate` times it. The
solution keeps the hint's recompute modes. What remains a relaxation: message contention, and
whatever the simulator adds beyond each op's own seconds (shared processors, collectives' SMs).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ...plan import Op, OpKind, Plan, Slot
from ...sim.links import cut_crosses_nodes, cut_times
from ..pipeline.evaluate import Evaluator, Score
from ..pipeline.layout import StageLayout, looped, v_shape
from ..problem import Problem

_US = 1e6
_MEMORY_STEPS = 2**20
"""The memory limit in the model's units."""
_SPLIT_KINDS = (OpKind.F, OpKind.B, OpKind.W)


@dataclass(frozen=True)
class CpsatResult:
    score: Score | None
    """The solver's best plan, simulated; None when it found none within the budget."""
    status: str
    """CP-SAT's status: OPTIMAL, FEASIBLE, INFEASIBLE, UNKNOWN (no solution in time)."""
    bound: float | None
    """The solver's lower bound on its own (contention-free) objective, seconds: the end of the
    last op (the simulator's `pipeline_time`, not the iteration's data-parallel end)."""
    warm: bool


@dataclass(frozen=True)
class _Stages:
    """Per stage, what the model needs: F, B, W and fused-backward seconds, activation units
    held from F's start until B ends (`act`), from B's end until W ends (`act_w`) and while B
    runs (`brought`), static units; constants, or (partition solved for) CP-SAT variables over the layers in the stage.
    `hops`: per cut, a message's seconds; `work`: an upper bound on one micro-batch's seconds
    on all stages together (for the horizon)."""

    f: list
    b: list
    w: list
    bw: list
    act: list
    act_w: list
    brought: list[int]
    static: list
    hops: list[int]
    work: int


def solve_cpsat(
    problem: Problem,
    budget: float,
    hint: Plan | None = None,
    workers: int = 1,
    keep_partition: bool = False,
) -> CpsatResult:
    """Solve for `budget` seconds. The placement is the hint's when given (its partition and
    op start times are the warm start), else the V shape (looped for fewer layers than V
    stages). `keep_partition` (with a hint): the hint's whole layout too (partition, placement,
    recompute, which backwards are fused), timed as the simulator times it, so only the order
    is solved for, which measures how far the hint's order is from the best one of its
    layout."""
    if keep_partition and hint is None:
        raise ValueError("keep_partition needs a hint plan")
    from ortools.sat.python import cp_model

    P, M, L = problem.devices, problem.microbatches, problem.num_layers
    hint_score = Evaluator(problem)(hint) if hint is not None else None
    if hint is not None:
        devs = StageLayout.of(hint).devices
    else:
        devs = v_shape(P) if 2 * P <= L else looped(P, 1)
    S = len(devs)
    fused = _fused(hint) if keep_partition and hint is not None else frozenset()
    m = cp_model.CpModel()
    # The model is built in one fixed order (CP-SAT's search depends on it): the partition,
    # the intervals, their precedences, the devices, memory, the objective.
    kept = StageLayout.of(hint).cuts if keep_partition and hint is not None else None
    x, stage_of = _partition(m, L, S, kept)
    if keep_partition and hint is not None:
        st = _plan_stages(problem, hint)
    else:
        st = _layer_stages(m, problem, x, devs)
    horizon = (
        _us(hint_score.time * 1.5)
        if hint_score and hint_score.result
        else M * (st.work + 2 * sum(st.hops))
    )
    start, end, by_dev = _intervals(m, devs, P, M, st, fused, horizon)
    _precedences(m, devs, M, start, end, st.hops)
    for d in range(P):
        m.add_no_overlap(by_dev[d])
    if problem.memory is not None:
        _memory(m, devs, M, st, start, end, horizon)
    makespan = m.new_int_var(0, horizon, "T")
    for s in range(S):
        for i in range(M):
            m.add(makespan >= end["W", s, i])
    m.minimize(makespan)
    if hint is not None and hint_score is not None and hint_score.result is not None:
        _hint(m, problem, hint, hint_score, x, start, fused)
        m.add_hint(makespan, _us(hint_score.result.pipeline_time))

    solver = cp_model.CpSolver()
    solver.parameters.max_time_in_seconds = max(budget, 0.1)
    solver.parameters.num_workers = workers
    status = solver.solve(m)
    name = solver.status_name(status)
    if status not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        return CpsatResult(None, name, None, hint is not None)
    plan = _solved_plan(
        problem, solver, devs, stage_of, start, fused, hint if keep_partition else None
    )
    return CpsatResult(
        Evaluator(problem)(plan), name, solver.best_objective_bound / _US, hint is not None
    )


def _fused(plan: Plan) -> frozenset[tuple[int, int]]:
    """The (stage, micro-batch)s whose backward the plan runs fused (one BW op)."""
    return frozenset(
        (op.stage, op.mb)
        for row in plan.schedule
        for slot in row
        for op in slot.ops
        if op.kind == OpKind.BW
    )


def _hops(problem: Problem, devs, send_bytes, overhead: float) -> list[int]:
    """Per cut, a message's seconds in the model's units: `send_bytes[s]` on the cut's link
    (`sim.links.cut_times`, as `simulate` times it) plus `overhead`."""
    inter = problem.inter_link or problem.link
    crosses = cut_crosses_nodes(problem.mesh, devs)
    seconds = cut_times(np.asarray(send_bytes, float), crosses, problem.link, inter) + overhead
    return [_us(t) for t in seconds.tolist()]


def _plan_stages(problem: Problem, plan: Plan) -> _Stages:
    """The plan's stages as the simulator costs them (its recompute included)."""
    costs = problem.sim_costs(plan)
    c = costs.stages
    return _Stages(
        f=[_us(x.f) for x in c],
        b=[_us(x.b) for x in c],
        w=[_us(x.w) for x in c],
        bw=[_us(x.fused_backward) for x in c],
        act=[_units(problem, x.act) for x in c],
        act_w=[_units(problem, x.act_w) for x in c],
        brought=[_units(problem, x.act_b) for x in c],
        static=[_units(problem, x.static) for x in c],
        hops=_hops(
            problem, StageLayout.of(plan).devices, [x.send_bytes for x in c], costs.message_overhead
        ),
        work=sum(_us(x.f) + max(_us(x.b + x.w), _us(x.fused_backward)) for x in c),
    )


def _layer_stages(m, problem: Problem, x, devs) -> _Stages:
    """Each stage as the sums of its layers (no recompute, every backward split), as
    variables over the partition; messages of the largest layer output."""
    layers = problem.table.layers
    L, S = len(x), len(devs)

    def stage_sums(values, name):
        out = []
        for s in range(S):
            v = m.new_int_var(0, sum(values), f"{name}{s}")
            m.add(v == sum(values[l] * x[l][s] for l in range(L)))
            out.append(v)
        return out

    f = [_us(l.f) for l in layers]
    b = [_us(l.b) for l in layers]
    w = [_us(l.w) for l in layers]
    sf, sb, sw = stage_sums(f, "F"), stage_sums(b, "B"), stage_sums(w, "W")
    largest = max(l.message_bytes for l in layers)
    return _Stages(
        f=sf,
        b=sb,
        w=sw,
        bw=sb,  # never used: no backward is fused here
        act=stage_sums([_units(problem, l.act) for l in layers], "act"),
        act_w=stage_sums([_units(problem, l.act_w) for l in layers], "act_w"),
        brought=[0] * S,
        static=stage_sums([_units(problem, v) for v in problem.layer_static()], "static"),
        hops=_hops(problem, devs, [largest] * S, 0.0),
        work=sum(f) + sum(b) + sum(w),
    )


def _partition(m, L: int, S: int, cuts: tuple[int, ...] | None):
    """x[l][s]: layer l is in stage s; stage_of[l]: its stage's index. Stages are consecutive,
    non-empty layer ranges; `cuts` (keep_partition) fixes them."""
    x = [[m.new_bool_var(f"x{l}_{s}") for s in range(S)] for l in range(L)]
    stage_of = []
    for l in range(L):
        m.add_exactly_one(x[l])
        stage_of.append(sum(s * x[l][s] for s in range(S)))
    m.add(stage_of[0] == 0)
    m.add(stage_of[-1] == S - 1)
    if cuts is not None:
        for l in range(L):
            for s in range(S):
                m.add(x[l][s] == int(cuts[s] <= l < cuts[s + 1]))
    for l in range(L - 1):
        m.add(stage_of[l + 1] >= stage_of[l])
        m.add(stage_of[l + 1] <= stage_of[l] + 1)
    return x, stage_of


def _intervals(m, devs, P: int, M: int, st: _Stages, fused, horizon: int):
    """The start, end and interval of every (kind, stage, micro-batch), and the intervals by
    device. A fused backward is the B interval with the BW seconds; its W is the instant B
    ends (no interval), so everything that waits for W waits for the fused op."""
    start: dict = {}
    end: dict = {}
    by_dev: list[list] = [[] for _ in range(P)]
    for s in range(len(devs)):
        for i in range(M):
            one = (s, i) in fused
            for k, dur in (("F", st.f[s]), ("B", st.bw[s] if one else st.b[s]), ("W", st.w[s])):
                if k == "W" and one:
                    start[k, s, i] = end[k, s, i] = end["B", s, i]
                    continue
                a = m.new_int_var(0, horizon, "")
                e = m.new_int_var(0, horizon, "")
                by_dev[devs[s]].append(m.new_interval_var(a, dur, e, ""))
                start[k, s, i], end[k, s, i] = a, e
    return start, end, by_dev


def _precedences(m, devs, M: int, start: dict, end: dict, hops: list[int]) -> None:
    """F down the stages, B back up, W after B (plus `hops[s]` across the cut s|s+1 between
    devices); micro-batches in order on each stage."""
    S = len(devs)
    for s in range(S):
        h_next = hops[s] if s + 1 < S and devs[s] != devs[s + 1] else 0
        h_prev = hops[s - 1] if s > 0 and devs[s] != devs[s - 1] else 0
        # The dependency rule, as constraints: it mirrors octodsl.dag.producers
        # (tests/tune/test_mirrors.py checks it equal; a solved plan simulates to its
        # objective, tests/tune/test_cpsat.py).
        for i in range(M):
            if s > 0:
                m.add(start["F", s, i] >= end["F", s - 1, i] + h_prev)
            m.add(start["B", s, i] >= end["F", s, i])
            if s + 1 < S:
                m.add(start["B", s, i] >= end["B", s + 1, i] + h_next)
            m.add(start["W", s, i] >= end["B", s, i])
            if i > 0:
                for k in "FBW":
                    m.add(start[k, s, i] >= start[k, s, i - 1])


def _solved_plan(problem: Problem, solver, devs, stage_of, start, fused, kept: Plan | None):
    """The solution as a plan: its cuts (`kept`'s stages and recompute, when given), and each
    device's ops in the order of their starts (a fused backward as one BW op)."""
    P, M, L, S = problem.devices, problem.microbatches, problem.num_layers, len(devs)
    ops = sorted(
        (
            (solver.value(start[k.value, s, i]), devs[s], Op(k, s, i))
            for s in range(S)
            for i in range(M)
            for k in _SPLIT_KINDS
            if not ((s, i) in fused and k == OpKind.W)
        ),
        key=lambda t: (t[0], _SPLIT_KINDS.index(t[2].kind), t[2].stage),
    )
    schedule: list[list[Slot]] = [[] for _ in range(P)]
    for _, d, op in ops:
        one = op.kind == OpKind.B and (op.stage, op.mb) in fused
        schedule[d].append(Slot((Op(OpKind.BW, op.stage, op.mb) if one else op,)))
    if kept is not None:
        return problem.with_schedule(kept, schedule)
    cuts = (
        [0]
        + [l for l in range(1, L) if solver.value(stage_of[l]) != solver.value(stage_of[l - 1])]
        + [L]
    )
    return problem.with_schedule(problem.skeleton(StageLayout(tuple(cuts), devs)), schedule)


def _held(devs, M: int, st: _Stages) -> dict[int, list[tuple[tuple, tuple, object]]]:
    """Per device, the simulator's levels (octodsl/sim/memory.py) as spans of held units, each
    (from, until, units) with from and until an op's ("start" or "end", kind, stage,
    micro-batch): what F keeps from its start until B ends, what recompute brings back while B
    runs, what W needs from B's end until W ends (after a fused backward, W's end is B's: no
    span). The static units are apart (`_Stages.static`)."""
    held: dict[int, list[tuple[tuple, tuple, object]]] = {d: [] for d in sorted(set(devs))}
    for s, d in enumerate(devs):
        for i in range(M):
            held[d].append((("start", "F", s, i), ("end", "B", s, i), st.act[s]))
            if st.brought[s] > 0:
                held[d].append((("start", "B", s, i), ("end", "B", s, i), st.brought[s]))
            held[d].append((("end", "B", s, i), ("end", "W", s, i), st.act_w[s]))
    return held


def _memory(m, devs, M: int, st: _Stages, start, end, horizon) -> None:
    """The held spans (`_held`) within the memory left beside each device's static units."""
    at = {"start": start, "end": end}
    for d, spans in _held(devs, M, st).items():
        intervals, demands = [], []
        for (a, *op_a), (e, *op_e), units in spans:
            size = m.new_int_var(0, horizon, "")
            intervals.append(m.new_interval_var(at[a][tuple(op_a)], size, at[e][tuple(op_e)], ""))
            demands.append(units)
        static = m.new_int_var(0, _MEMORY_STEPS, f"static{d}")
        m.add(static == sum(st.static[s] for s in range(len(devs)) if devs[s] == d))
        m.add_cumulative(intervals, demands, _MEMORY_STEPS - static)


def _units(problem: Problem, nbytes: float) -> int:
    """Bytes in the model's memory units, rounded down (as `_us`: floor(a) + floor(b) <=
    floor(a + b), so a level within the limit stays within it)."""
    return math.floor(nbytes * _MEMORY_STEPS / (problem.memory or 1))


def _us(seconds: float) -> int:
    """Whole microseconds, rounded down: floor(a + b) >= floor(a) + floor(b), so times that
    satisfy the plan's constraints in seconds satisfy the model's."""
    return math.floor(seconds * _US)


def _hint(m, problem: Problem, plan: Plan, score: Score, x, start, fused) -> None:
    """The plan's partition and simulated start times (a BW the model splits: B at its start,
    W after B)."""
    layout = StageLayout.of(plan)
    for s in range(layout.num_stages):
        for l in range(len(x)):
            m.add_hint(x[l][s], layout.cuts[s] <= l < layout.cuts[s + 1])
    b = [c.b for c in problem.stage_costs(plan)]
    assert score.result is not None, "solve_cpsat hints only from a plan that simulated"
    for op in score.result.ops():
        if op.kind == "BW":
            m.add_hint(start["B", op.stage, op.mb], _us(op.start))
            if (op.stage, op.mb) not in fused:
                m.add_hint(start["W", op.stage, op.mb], _us(op.start + b[op.stage]))
        else:
            m.add_hint(start[op.kind, op.stage, op.mb], _us(op.start))
