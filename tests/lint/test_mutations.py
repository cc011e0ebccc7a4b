"""Mutations of generated plans (drop, duplicate, misplace, reorder) are caught by lint; a
deadlock verdict is checked against an independent oracle written here from the rules alone."""

from __future__ import annotations

import random

import pytest

from octodsl.gen import generate
from octodsl.lint import lint_plan
from octodsl.plan import OpKind, Plan, Slot

CASES = [
    ("1f1b", 4, 8, None),
    ("gpipe", 3, 6, None),
    ("interleaved", 2, 4, 2),
    ("zb-h1", 4, 8, None),
    ("zb-h2", 4, 8, None),
    ("zb-v", 3, 6, None),
    ("dualpipev", 4, 8, None),
]


def _plan(name, p, m, v) -> Plan:
    return generate(name, devices=p, microbatches=m, chunks=v)


def _with_schedule(plan: Plan, schedule: list[list[Slot]]) -> Plan:
    return Plan(
        plan.header,
        plan.stages,
        plan.placement,
        schedule,
        plan.partition_span,
        plan.placement_span,
        plan.schedule_spans,
    )


def _codes(plan: Plan) -> set[str]:
    return {d.code for d in lint_plan(plan) if d.is_error}


def _runs(plan: Plan) -> bool:
    """Independent oracle: run heads of device queues whose inputs are done, until stuck."""
    S = plan.num_stages
    done: set[tuple] = set()

    def ready(op) -> bool:
        k, s, m = op.kind, op.stage, op.mb
        if k is OpKind.F:
            return s == 0 or ("F", s - 1, m) in done
        if k is OpKind.W:
            return ("B", s, m) in done
        grad = s == S - 1 or ("B", s + 1, m) in done or ("BW", s + 1, m) in done
        return ("F", s, m) in done and grad

    queues = [list(slots) for slots in plan.schedule]
    progress = True
    while progress:
        progress = False
        for q in queues:
            while q and all(ready(op) for op in q[0].ops):
                done.update((op.kind.value, op.stage, op.mb) for op in q.pop(0).ops)
                progress = True
    return not any(queues)


@pytest.mark.parametrize("name,p,m,v", CASES)
def test_generated_plan_is_clean(name, p, m, v):
    plan = _plan(name, p, m, v)
    assert _codes(plan) == set()
    assert _runs(plan)


@pytest.mark.parametrize("name,p,m,v", CASES)
def test_drop_duplicate_misplace(name, p, m, v):
    plan = _plan(name, p, m, v)
    rng = random.Random(name)
    for _ in range(10):
        d = rng.randrange(p)
        sched = [list(s) for s in plan.schedule]
        i = rng.randrange(len(sched[d]))
        dropped = [list(s) for s in sched]
        del dropped[d][i]
        assert "E301" in _codes(_with_schedule(plan, dropped))
        dup = [list(s) for s in sched]
        dup[d].insert(rng.randrange(len(dup[d]) + 1), sched[d][i])
        assert "E302" in _codes(_with_schedule(plan, dup))
        moved = [list(s) for s in sched]
        slot = moved[d].pop(i)
        other = (d + 1) % p
        moved[other].insert(rng.randrange(len(moved[other]) + 1), slot)
        assert "E305" in _codes(_with_schedule(plan, moved))


@pytest.mark.parametrize("name,p,m,v", CASES)
def test_reordering_deadlock_verdict_matches_oracle(name, p, m, v):
    plan = _plan(name, p, m, v)
    rng = random.Random(name)
    deadlocks = 0
    for _ in range(40):
        sched = [list(s) for s in plan.schedule]
        d = rng.randrange(p)
        i, j = sorted(rng.sample(range(len(sched[d])), 2))
        sched[d].insert(i, sched[d].pop(j))  # move a later op earlier
        mutated = _with_schedule(plan, sched)
        runs = _runs(mutated)
        assert ("E310" not in _codes(mutated)) == runs
        deadlocks += not runs
    assert deadlocks > 0, "the mutations never produced a deadlock; the test would prove nothing"
