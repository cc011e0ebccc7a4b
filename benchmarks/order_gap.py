"""How far the tuner's order is from the best order of its own layout: writes
benchmarks/order_gap.md.

    .venv/bin/python benchmarks/order_gap.py [--budget 60] [--solver-budget 300] [--workers 2]
        [--cases nemotron-h-8b:8:16 ...] [--memory 80] [-o benchmarks/order_gap.md]

For each case the tuner runs as in benchmarks/tuner.py (H800 costs, NVLink messages, seed 0,
the best classic baseline refined too); then CP-SAT solves for the best order of the tuned plan's
partition and placement (`solve_milp(keep_partition=True)`, warm-started from the tuned order).
Where CP-SAT proves its order optimal, the tuned order's gap to it is all a better schedule
could win on that layout; the rest of the gap to the lower bound is the layout's.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "benchmarks"))
from machine import check_outputs, table_head, write_outputs  # noqa: E402

GIB = 2**30
CASES = ("nemotron-h-8b:4:8", "nemotron-h-8b:8:16", "llama3-8b:8:16", "jamba-v0.1:16:32")
"""The cases under efficiency 0.95 that no bound rules out (and one that meets it)."""


def run_case(
    model: str,
    devices: int,
    microbatches: int,
    memory: float | None,
    budget: float,
    solver_budget: float,
    workers: int,
) -> dict:
    from octodsl.tune.problem import Problem
    from octodsl.tune.reference.compare import tune_and_compare
    from octodsl.tune.reference.cpsat import solve_cpsat as solve_milp

    problem = Problem.create(
        model, devices, microbatches, memory=None if memory is None else int(memory * GIB)
    )
    tuned = tune_and_compare(problem, budget=budget).tuned
    t0 = time.perf_counter()
    r = solve_milp(
        problem, solver_budget, hint=tuned.best.plan, workers=workers, keep_partition=True
    )
    best = r.score.time if r.score is not None and r.score.fits else None
    return {
        "model": model,
        "devices": devices,
        "microbatches": microbatches,
        "lower_bound": problem.lower_bound(),
        "tuned": tuned.best.time,
        "stages": tuned.best.plan.num_stages,
        "solver_status": r.status,
        "solver_plan": best,
        "solver_bound": r.bound,
        "solver_seconds": time.perf_counter() - t0,
    }


def _ms(t):
    return "-" if t is None else f"{t * 1e3:,.1f}"


def table(results: list[dict]) -> list[str]:
    head = [
        "model",
        "P",
        "M",
        "stages",
        "tuned ms",
        "eff.",
        "CP-SAT order ms",
        "status",
        "order bound ms",
        "tuned over bound",
        "eff. at order bound",
        "solver s",
    ]
    lines = table_head(head)
    for r in results:
        lb, bound = r["lower_bound"], r["solver_bound"]
        lines.append(
            "| "
            + " | ".join(
                [
                    r["model"],
                    str(r["devices"]),
                    str(r["microbatches"]),
                    str(r["stages"]),
                    _ms(r["tuned"]),
                    f"{lb / r['tuned']:.3f}",
                    _ms(r["solver_plan"]),
                    r["solver_status"].lower(),
                    _ms(bound),
                    "-" if bound is None else f"{r['tuned'] / bound - 1:+.2%}",
                    "-" if bound is None else f"{lb / bound:.3f}",
                    f"{r['solver_seconds']:.0f}",
                ]
            )
            + " |"
        )
    return lines


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--budget", type=float, default=60.0, help="tuner seconds per case")
    ap.add_argument("--solver-budget", type=float, default=300.0, help="CP-SAT seconds per case")
    ap.add_argument("--workers", type=int, default=2, help="CP-SAT threads")
    ap.add_argument("--cases", nargs="+", default=list(CASES), metavar="MODEL:P:M")
    ap.add_argument("--memory", default="80", help="GiB per device, or none")
    ap.add_argument("-o", "--output", default=str(REPO / "benchmarks" / "order_gap.md"))
    args = ap.parse_args(argv)
    out = Path(args.output)
    if not check_outputs("order_gap.py", [out, out.with_suffix(".json")]):
        return 2
    memory = None if args.memory == "none" else float(args.memory)
    results = []
    for case in args.cases:
        model, p, m = case.split(":")
        print(f"{case} ...", file=sys.stderr, flush=True)
        results.append(
            run_case(model, int(p), int(m), memory, args.budget, args.solver_budget, args.workers)
        )
        print(table(results)[-1], file=sys.stderr, flush=True)
    command = "python benchmarks/order_gap.py " + " ".join(
        argv if argv is not None else sys.argv[1:]
    )
    limit = "no memory limit" if memory is None else f"{args.memory} GiB per device"
    text = [
        "# The tuner's order against the best order of its layout",
        "",
        f"Made by `{command.strip()}` on {platform.machine()} ({os.cpu_count()} "
        f"cores), {time.strftime('%Y-%m-%d')}.",
        "",
        f"H800 costs, NVLink messages, {limit}, seed 0; the tuner gets {args.budget:.0f} s as in "
        f"[tuner_bounds.md](tuner_bounds.md). CP-SAT then gets {args.solver_budget:.0f} s on "
        f"{args.workers} threads to order the tuned plan's ops with its partition and placement "
        "kept (warm-started from the tuned order; micro-batches in order on each stage, messages "
        "without contention). `order bound` is CP-SAT's proven lower bound for that layout "
        "(equal to its plan when `optimal`); `CP-SAT order ms` is its order timed by the "
        "simulator. `eff.` is the issue's lower bound over the time.",
        "",
        *table(results),
        "",
    ]
    files = {out: "\n".join(text), out.with_suffix(".json"): json.dumps(results, indent=1) + "\n"}
    if not write_outputs("order_gap.py", files):
        return 2
    print(f"wrote {args.output}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
