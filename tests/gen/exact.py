"""The least makespan of any schedule with a plan's stages and placement (test-only), by CP-SAT:
uniform integer op times, free messages, at most `cap` micro-batch-stages held per device (from
a forward's start to its weight gradient's end), each stage's micro-batches in order (as every
generator runs them). Small P and M only: seconds up to about 4 devices x 5 micro-batches."""

from __future__ import annotations

from ortools.sat.python import cp_model

from octodsl.plan import Plan


def optimum(plan: Plan, times: tuple[int, int, int], cap: int, work: float = 200) -> int:
    """The least makespan, proven within `work` units of CP-SAT's deterministic time (a count
    of its work, about seconds on a quiet core): one worker and no wall-clock limit, so the
    answer and whether it is proven do not depend on how loaded the machine is."""
    assert all(plan.split_stages()), "split backwards only"
    S, M = plan.num_stages, plan.microbatches
    horizon = plan.num_stages * M * sum(times)
    m = cp_model.CpModel()
    start, end, box = {}, {}, {}
    for s in range(S):
        for mb in range(M):
            for kind, took in zip("FBW", times, strict=True):
                key = (kind, s, mb)
                start[key] = m.new_int_var(0, horizon, "")
                end[key] = start[key] + took
                box[key] = m.new_fixed_size_interval_var(start[key], took, "")
    for (kind, s, mb), t in start.items():
        after = {
            "F": [("F", s - 1, mb)] if s else [],
            "B": [("F", s, mb)] + ([("B", s + 1, mb)] if s < S - 1 else []),
            "W": [("B", s, mb)],
        }[kind]
        if mb:
            after.append((kind, s, mb - 1))
        for a in after:
            m.add(t >= end[a])
    home = plan.stage_device()
    for d in range(plan.devices):
        mine = [k for k in box if home[k[1]] == d]
        m.add_no_overlap([box[k] for k in mine])
        held = [
            m.new_interval_var(start[k], m.new_int_var(0, horizon, ""), end[("W",) + k[1:]], "")
            for k in mine
            if k[0] == "F"
        ]
        m.add_cumulative(held, [1] * len(held), cap)
    makespan = m.new_int_var(0, horizon, "")
    m.add_max_equality(makespan, [end[k] for k in start])
    m.minimize(makespan)
    solver = cp_model.CpSolver()
    solver.parameters.max_deterministic_time = work
    solver.parameters.num_workers = 1
    assert solver.solve(m) == cp_model.OPTIMAL, "no proof within the work limit"
    return int(solver.value(makespan))
