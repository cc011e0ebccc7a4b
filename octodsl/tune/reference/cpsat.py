"""The exact baseline: partition and schedule as one constraint program (OR-Tools CP-SAT), for a
fixed placement, solved for the same budget as the tuner, warm-started from a plan or not.

Model (times in whole microseconds, rounded down so that a simulated plan is a valid warm
start; memory in 1/65536ths of the limit, rounded to the nearest):
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
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ...plan import Op, OpKind, Plan, Slot
from ...sim.links import cut_crosses_nodes
from ..pipeline.evaluate import Evaluator, Score
from ..pipeline.layout import StageLayout, looped, v_shape
from ..problem import Problem

_US = 1e6
_MEMORY_STEPS = 2**16
"""The memory limit in the model's units."""
_SPLIT_KINDS = (OpKind.F, OpKind.B, OpKind.W)


@dataclass(frozen=True)
class CpsatResult:
    score: Score | None
    """The solver's best plan, simulated; None when it found none within the budget."""
    status: str
    """CP-SAT's status: OPTIMAL, FEASIBLE, INFEASIBLE, UNKNOWN (no solution in time)."""
    bound: float | None
    """The solver's lower bound on its own (contention-free) objective, seconds."""
    warm: bool


def solve_cpsat(
    problem: Problem,
    budget: float,
    hint: Plan | None = None,
    workers: int = 1,
    keep_partition: bool = False,
) -> CpsatResult:
    """Solve for `budget` seconds. The placement is the hint's when given (its partition and
    op start times are the warm start), else the V shape (looped for fewer layers than V
    stages). `keep_partition` (with a hint): the hint's partition too, so only the order is
    solved for, which measures how far the hint's order is from the best one of its layout."""
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
    layers = problem.table.layers
    f = [_us(l.f) for l in layers]
    b = [_us(l.b) for l in layers]
    w = [_us(l.w) for l in layers]
    unit = (problem.memory or 1) / _MEMORY_STEPS
    held = [round((l.act - l.act_w) / unit) for l in layers]
    held_w = [round(l.act_w / unit) for l in layers]
    static = [round(x / unit) for x in problem.layer_static()]
    largest = max(l.message_bytes for l in layers)
    inter = problem.inter_link or problem.link
    hops = [
        _us((inter if x else problem.link).time(largest))
        for x in cut_crosses_nodes(problem.mesh, devs).tolist()
    ]
    horizon = (
        _us(hint_score.time * 1.5)
        if hint_score and hint_score.result
        else M * (sum(f) + sum(b) + sum(w)) + 2 * M * sum(hops)
    )

    m = cp_model.CpModel()
    # The model is built in one fixed order (CP-SAT's search depends on it): the partition,
    # the intervals, their precedences, the devices, memory, the objective.
    kept = StageLayout.of(hint).cuts if keep_partition and hint is not None else None
    x, stage_of = _partition(m, L, S, kept)
    start, end, by_dev = _intervals(m, devs, P, M, (f, b, w), x, horizon)
    _precedences(m, devs, M, start, end, hops)
    for d in range(P):
        m.add_no_overlap(by_dev[d])
    if problem.memory is not None:
        _memory(m, problem, devs, x, start, end, held, held_w, static, horizon)
    makespan = m.new_int_var(0, horizon, "T")
    for s in range(S):
        for i in range(M):
            m.add(makespan >= end["W", s, i])
    m.minimize(makespan)
    if hint is not None and hint_score is not None and hint_score.result is not None:
        _hint(m, problem, hint, hint_score, x, start)
        m.add_hint(makespan, _us(hint_score.result.pipeline_time))

    solver = cp_model.CpSolver()
    solver.parameters.max_time_in_seconds = max(budget, 0.1)
    solver.parameters.num_workers = workers
    status = solver.solve(m)
    name = solver.status_name(status)
    if status not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        return CpsatResult(None, name, None, hint is not None)
    plan = _solved_plan(problem, solver, devs, stage_of, start)
    return CpsatResult(
        Evaluator(problem)(plan), name, solver.best_objective_bound / _US, hint is not None
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


def _intervals(
    m, devs, P: int, M: int, times: tuple[list[int], list[int], list[int]], x, horizon: int
):
    """Each stage's F, B, W durations (its layers' sums), and the start, end and interval of
    every (kind, stage, micro-batch); the intervals by device."""
    L = len(x)

    def stage_sum(values, s, name):
        v = m.new_int_var(0, sum(values), name)
        m.add(v == sum(values[l] * x[l][s] for l in range(L)))
        return v

    f, b, w = times
    S = len(devs)
    dur = {
        (k, s): stage_sum(vals, s, f"{k}{s}")
        for s in range(S)
        for k, vals in (("F", f), ("B", b), ("W", w))
    }
    start: dict = {}
    end: dict = {}
    by_dev: list[list] = [[] for _ in range(P)]
    for s in range(S):
        for i in range(M):
            for k in "FBW":
                a = m.new_int_var(0, horizon, "")
                e = m.new_int_var(0, horizon, "")
                by_dev[devs[s]].append(m.new_interval_var(a, dur[k, s], e, ""))
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


def _solved_plan(problem: Problem, solver, devs, stage_of, start: dict) -> Plan:
    """The solution as a plan: its cuts, and each device's ops in the order of their starts."""
    P, M, L, S = problem.devices, problem.microbatches, problem.num_layers, len(devs)
    cuts = (
        [0]
        + [l for l in range(1, L) if solver.value(stage_of[l]) != solver.value(stage_of[l - 1])]
        + [L]
    )
    layout = StageLayout(tuple(cuts), devs)
    ops = sorted(
        (
            (solver.value(start[k.value, s, i]), devs[s], Op(k, s, i))
            for s in range(S)
            for i in range(M)
            for k in _SPLIT_KINDS
        ),
        key=lambda t: (t[0], _SPLIT_KINDS.index(t[2].kind), t[2].stage),
    )
    schedule: list[list[Slot]] = [[] for _ in range(P)]
    for _, d, op in ops:
        schedule[d].append(Slot((op,)))
    return problem.with_schedule(problem.skeleton(layout), schedule)


def _memory(m, problem, devs, x, start, end, held, held_w, static, horizon) -> None:
    L, S = len(x), len(devs)
    for d in range(problem.devices):
        mine = [s for s in range(S) if devs[s] == d]
        dev_static = m.new_int_var(0, sum(static), f"static{d}")
        m.add(dev_static == sum(static[l] * x[l][s] for l in range(L) for s in mine))
        intervals, demands = [], []
        for s in mine:
            need = m.new_int_var(0, sum(held), "")
            m.add(need == sum(held[l] * x[l][s] for l in range(L)))
            need_w = m.new_int_var(0, sum(held_w), "")
            m.add(need_w == sum(held_w[l] * x[l][s] for l in range(L)))
            for i in range(problem.microbatches):
                for until, demand in (("B", need), ("W", need_w)):
                    size = m.new_int_var(0, horizon, "")
                    intervals.append(
                        m.new_interval_var(start["F", s, i], size, end[until, s, i], "")
                    )
                    demands.append(demand)
        m.add_cumulative(intervals, demands, _MEMORY_STEPS - dev_static)


def _us(seconds: float) -> int:
    """Whole microseconds, rounded down: floor(a + b) >= floor(a) + floor(b), so times that
    satisfy the plan's constraints in seconds satisfy the model's."""
    return math.floor(seconds * _US)


def _hint(m, problem: Problem, plan: Plan, score: Score, x, start) -> None:
    """The plan's partition and simulated start times (a fused BW: B at its start, W after B)."""
    layout = StageLayout.of(plan)
    for s in range(layout.num_stages):
        for l in range(len(x)):
            m.add_hint(x[l][s], layout.cuts[s] <= l < layout.cuts[s + 1])
    b = [c.b for c in problem.stage_costs(plan)]
    assert score.result is not None, "solve_cpsat hints only from a plan that simulated"
    for op in score.result.ops():
        if op.kind == "BW":
            m.add_hint(start["B", op.stage, op.mb], _us(op.start))
            m.add_hint(start["W", op.stage, op.mb], _us(op.start + b[op.stage]))
        else:
            m.add_hint(start[op.kind, op.stage, op.mb], _us(op.start))
