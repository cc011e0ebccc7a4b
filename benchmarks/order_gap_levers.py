"""The tuner's order against the best order of its own layout, on the memory-lever cases below
0.90 of the tight bound: writes benchmarks/order_gap_levers.md (issue 30).

    .venv/bin/python benchmarks/order_gap_levers.py [--budget 60] [--solver-budget 180]
        [--reduced-budget 60] [--jobs 2] [--levers benchmarks/tuner_levers.json]
        [--cases nemotron-h-56b:4:8 ...] [-o benchmarks/order_gap_levers.md]

The cases are tuner_gap.py's: those of `--levers` (80 GiB, dp 8, ZeRO 1, recompute auto) whose
tuned plan was below 0.90 of the tight bound there. Each runs in its own single-threaded
process: the tuner as tuner.py runs it (`tune_and_compare`, seed 0), then CP-SAT on the tuned
plan's whole layout (partition, placement, recompute, fused backwards: `solve_cpsat(
keep_partition=True)`, timed as the simulator times it), warm-started from the tuned order, on
one thread. Then the same layout at M = P micro-batches: the list scheduler's orders for it
(`rebuild`, with and without the pilot method and W gaps; the best one), and CP-SAT from it.
The table is rewritten after each case, so a run stopped early leaves the cases it finished.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from benchmarks.machine import (  # noqa: E402
    add_jobs,
    command_line,
    commit,
    cpu_model,
    table_head,
    write_outputs,
)
from benchmarks.tuner_gap import BELOW, GIB, add_levers_arguments, levers_cases  # noqa: E402


def _problem(case: dict, microbatches: int, dp: int, zero: int):
    from octodsl.tune.problem import AUTO, Problem

    return Problem.create(
        case["model"],
        case["devices"],
        microbatches,
        memory=int(case["memory"] * GIB),
        dp=dp,
        zero=zero,
        recompute=AUTO,
    )


def _solved(problem, hint, budget: float) -> dict:
    """CP-SAT on `hint`'s layout: its plan (simulated) and status, its proven bound."""
    from octodsl.tune.reference.cpsat import solve_cpsat

    t0 = time.perf_counter()
    r = solve_cpsat(problem, budget, hint=hint, workers=1, keep_partition=True)
    score = r.score
    return {
        "status": r.status.lower(),
        "time": None if score is None else score.time,
        "pipeline": None if score is None else score.result.pipeline_time,
        "over_limit": None if score is None else float(score.peak.max()) - problem.memory,
        "bound": r.bound,
        "seconds": time.perf_counter() - t0,
    }


def run_case(case: dict, args) -> dict:
    from octodsl.tune.bounds import layout_lower_bound
    from octodsl.tune.pipeline.evaluate import Evaluator
    from octodsl.tune.pipeline.layout import StageLayout
    from octodsl.tune.pipeline.moves.schedule import rebuild
    from octodsl.tune.reference.compare import tune_and_compare

    problem = _problem(case, case["microbatches"], args.dp, args.zero)
    tuned = tune_and_compare(problem, budget=args.budget, seed=0).tuned.best
    layout = StageLayout.of(tuned.plan)
    out = {
        "model": case["model"],
        "devices": case["devices"],
        "microbatches": case["microbatches"],
        "stages": layout.num_stages,
        "recompute": sorted({m.value for m in layout.recompute}),
        "tight_bound": problem.tight_lower_bound(),
        "layout_bound": layout_lower_bound(problem, layout),
        "tuned": tuned.time,
        "tuned_pipeline": tuned.result.pipeline_time,
        "full": _solved(problem, tuned.plan, args.solver_budget),
    }
    if args.reduced_budget > 0:
        small = _problem(case, case["devices"], args.dp, args.zero)
        skeleton = small.skeleton(layout)
        scores = [
            Evaluator(small)(rebuild(skeleton, small, w_gap=g, pilot=p))
            for p in (False, True)
            for g in (False, True)
        ]
        best = min((s for s in scores if s.fits), key=lambda s: s.time, default=None)
        out["reduced"] = {
            "microbatches": small.microbatches,
            "list": None if best is None else best.time,
            "list_pipeline": None if best is None else best.result.pipeline_time,
            "layout_bound": layout_lower_bound(small, layout),
            **({} if best is None else _solved(small, best.plan, args.reduced_budget)),
        }
    return out


def _ms(t: float | None) -> str:
    return "-" if t is None else f"{t * 1e3:,.1f}"


def _solved_ms(r: dict, key: str) -> str:
    """A CP-SAT plan's time, marked with how far it is over the memory limit if it is."""
    over = r.get("over_limit")
    mark = f" (over by {over / 2**20:.1f} MiB)" if over is not None and over > 0 else ""
    return _ms(r.get(key)) + mark


def _fitting(r: dict) -> float | None:
    """A CP-SAT plan's time if it fits, else None."""
    return r.get("time") if (r.get("over_limit") or 0.0) <= 0 else None


def _ratio(a: float | None, b: float | None) -> str:
    return "-" if a is None or b is None else f"{a / b:.3f}"


def table(results: list[dict]) -> list[str]:
    head = [
        "model",
        "P",
        "M",
        "stages",
        "recompute",
        "tuned ms",
        "tuned pipeline ms",
        "CP-SAT ms",
        "CP-SAT pipeline ms",
        "status",
        "CP-SAT bound ms",
        "tuned / CP-SAT",
        "tuned pipeline / bound",
        "layout bound ms",
        "tight / tuned",
        "M = P: list pipeline ms",
        "CP-SAT pipeline ms",
        "status",
        "bound ms",
        "list / bound",
    ]
    lines = table_head(head)
    for r in results:
        f = r["full"]
        s = r.get("reduced") or {}
        cells = [
            r["model"],
            str(r["devices"]),
            str(r["microbatches"]),
            str(r["stages"]),
            ", ".join(r["recompute"]),
            _ms(r["tuned"]),
            _ms(r["tuned_pipeline"]),
            _solved_ms(f, "time"),
            _ms(f["pipeline"]),
            f["status"],
            _ms(f["bound"]),
            _ratio(r["tuned"], _fitting(f)),
            _ratio(r["tuned_pipeline"], f["bound"]),
            _ms(r["layout_bound"]),
            _ratio(r["tight_bound"], r["tuned"]),
            _ms(s.get("list_pipeline")),
            _solved_ms(s, "pipeline"),
            s.get("status", "-"),
            _ms(s.get("bound")),
            _ratio(s.get("list_pipeline"), s.get("bound")),
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def _write(out: Path, results: list[dict], todo: int, args, t0: float) -> bool:
    command = command_line("python benchmarks/order_gap_levers.py")
    done = "" if len(results) == todo else f" Stopped early: {len(results)} of {todo} cases."
    text = [
        "# The tuner's order against the best order of its layout, with the memory levers",
        "",
        f"Made by `{command}` on {cpu_model()} ({os.cpu_count()} cores, shared; each case in "
        f"one single-threaded process, {args.jobs} at once), commit {commit()}, "
        f"{time.strftime('%Y-%m-%d')}, in {(time.time() - t0) / 60:.0f} min.{done}",
        "",
        f"The cases: those of `{Path(args.levers).name}` (dp {args.dp}, ZeRO {args.zero}, "
        f"recompute auto, 80 GiB per device, analytical H800 costs) below {BELOW} of the tight "
        f"bound there. `tuned`: the tuner as benchmarks/tuner.py runs it, {args.budget:.0f} s, "
        "seed 0 (this run's, so its times may differ a little from the levers table's). "
        f"`CP-SAT`: {args.solver_budget:.0f} s of CP-SAT on one thread ordering the tuned plan's "
        "ops with its whole layout kept (partition, placement, each stage's recompute, which "
        "backwards run fused), each stage timed and its bytes counted as the simulator counts "
        "them, memory within the limit; warm-started from the tuned order; micro-batches in "
        "order on each stage; messages without contention (octodsl/tune/reference/cpsat.py). "
        "Its plan is timed by the simulator (`CP-SAT ms`; `-`: none found in time; the model "
        "rounds bytes down to 2**-20 of the limit, so its plan may exceed the limit by a few "
        "MiB, marked, and then not counted in `tuned / CP-SAT`). "
        "`CP-SAT bound`: its proven lower bound on the pipeline's end (the last op's end; the "
        "iteration adds the data-parallel end, reduction, step and all-gather), for this layout "
        "and in-order micro-batches, so `tuned pipeline / bound` is at most what any such order "
        "of the tuned layout could still win, `tuned / CP-SAT` what CP-SAT's order did win. "
        "`layout bound`: `bounds.layout_lower_bound` of the tuned layout, for comparison. "
        "`tight / tuned`: the tight bound over the tuned time (the issue's figure).",
        "",
        "`M = P`: the same layout and recompute at as many micro-batches as devices, small "
        "enough for CP-SAT to prove its order optimal in "
        f"{args.reduced_budget:.0f} s where it says `optimal`. `list`: the best of the tuner's "
        "list scheduler's orders for that layout (`rebuild`, with and without the pilot method "
        "and W gaps). What it tells: how far the tuner's own scheduler is from the best order "
        "of this layout when the fill and drain weigh most. What it does not: the gap at the "
        "full M, where the steady state dominates; a layout chosen for M micro-batches need not "
        "be good at P, and an order's gap at P does not scale to M (neither up nor down).",
        "",
        *table(results),
        "",
    ]
    files = {
        out: "\n".join(text),
        out.with_suffix(".json"): json.dumps(results, indent=1) + "\n",
    }
    return write_outputs("order_gap_levers.py", files)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--budget", type=float, default=60.0, help="the tuner's, as tuner.py's")
    ap.add_argument("--solver-budget", type=float, default=180.0, help="CP-SAT's at full M")
    ap.add_argument(
        "--reduced-budget", type=float, default=60.0, help="CP-SAT's at M = P (0: skip)"
    )
    add_jobs(ap, 2)
    ap.add_argument("--cases", nargs="*", metavar="MODEL:P:M", help="only these of the cases")
    add_levers_arguments(ap, "order_gap_levers.md")
    args = ap.parse_args()
    cases = levers_cases("order_gap_levers.py", args)
    if cases is None:
        return 2
    out = Path(args.output)
    todo = [
        c
        for c in cases
        if not args.cases or f"{c['model']}:{c['devices']}:{c['microbatches']}" in args.cases
    ]
    t0 = time.time()
    results: list[dict] = []
    with ProcessPoolExecutor(max_workers=args.jobs) as pool:
        for f in [pool.submit(run_case, c, args) for c in todo]:
            results.append(f.result())
            print(table(results)[-1], flush=True)
            if not _write(out, results, len(todo), args, t0):
                return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
