"""What the generators' makespans are held to (test-only), under uniform op times F, B, W per
stage and free messages.

lower_bound: each device alone, allowed to interrupt its ops, given the earliest each op can
start (the path of its inputs from the first forward) and the least time that must follow it
(the path to the end). The best such one-device schedule (Jackson's: always run the released op
with the longest tail) bounds every real schedule.

best_known: the lower bound, or where a schedule's memory cap costs more, ZeroBubble's figure
for its 1F1B-memory schedules, work + (P-1)(F+B-W) (the paper's ZB-H1 bubble; its ZB-V greedy
scheduler reaches the same for the V): proven optimal for small P in test_optimal.py (exact.py),
not in general. DualPipeV is DeepSpeed's order, held to its own figure.
"""

from __future__ import annotations

import heapq
import math

from octodsl.plan import Plan

Times = tuple[float, float, float]


def lower_bound(plan: Plan, times: Times) -> float:
    f, b, w = times
    S = plan.num_stages
    split = plan.split_stages()
    back = [b if sp else b + w for sp in split]  # a B, or a fused BW
    last_w = w if split[0] else 0.0
    jobs: list[list[tuple[float, float, float]]] = [[] for _ in range(plan.devices)]
    for s, d in enumerate(plan.stage_device()):
        # (earliest start, time, least time after it), alike for every micro-batch
        head_b = S * f + sum(back[s + 1 :])
        ops = [
            (s * f, f, (S - 1 - s) * f + sum(back) + last_w),
            (head_b, back[s], sum(back[:s]) + (last_w if s else 0.0)),
        ]
        if split[s]:
            ops.append((head_b + b, w, 0.0))
        jobs[d] += ops * plan.microbatches
    return max(_one_device(j) for j in jobs)


def _one_device(jobs: list[tuple[float, float, float]]) -> float:
    jobs = sorted(jobs)
    t, i, bound = 0.0, 0, 0.0
    ready: list[tuple[float, float]] = []  # (-tail, time left)
    while i < len(jobs) or ready:
        if not ready:
            t = max(t, jobs[i][0])
        while i < len(jobs) and jobs[i][0] <= t:
            _, took, tail = jobs[i]
            heapq.heappush(ready, (-tail, took))
            i += 1
        neg_tail, left = heapq.heappop(ready)
        ran = min(left, (jobs[i][0] if i < len(jobs) else math.inf) - t)
        t += ran
        if ran < left:  # a newly released op may have a longer tail
            heapq.heappush(ready, (neg_tail, left - ran))
        else:
            bound = max(bound, t - neg_tail)
    return bound


def best_known(name: str, plan: Plan, times: Times) -> float:
    f, b, w = times
    P, M = plan.devices, plan.microbatches
    work = plan.num_stages // P * M * (f + b + w)
    if name == "dualpipev":
        return work + (P - 2) * f + 2 * (P - 1) * (b + w)
    bound = lower_bound(plan, times)
    if name in ("zb-h1", "zb-v"):
        return max(bound, work + (P - 1) * (f + b - w))
    return bound
