"""The tuner at tensor-parallel degree 4 and 8 on 64 and 128 GPUs: writes benchmarks/tuner_tp.md.

    .venv/bin/python benchmarks/tuner_tp.py [--budget 60] [--jobs 2] [--models ...]
        [-o benchmarks/tuner_tp.md]

The three big hybrids and llama3-70b on H800s of 80 GiB, ZeRO 1, recompute auto, 8 GPUs per
node (octodsl.mesh: Megatron's rank order), tp x P pipeline devices x dp = the world:

    world 64:  tp 4 x P 8 x dp 2,   tp 8 x P 4 x dp 2
    world 128: tp 4 x P 16 x dp 2,  tp 8 x P 8 x dp 2

(dp 2: the fewest copies ZeRO 1 shards over, so the pipeline gets the depth; micro-batches
4 x P.) Each case runs in its own single-threaded process: the classic baselines with the same
tp, ZeRO and recompute choice, then the tuner (refining the best baseline too), all on the
simulator with the tp costs (one GPU's share of each layer, its collectives on NVLink) and the
links by where ranks sit (pipeline messages and dp collectives that leave a node on InfiniBand
NDR). Tokens per GPU per second: a pipeline's tokens per iteration over its tp x P GPUs.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from machine import (  # noqa: E402
    add_jobs,
    check_outputs,
    command_line,
    commit,
    cpu_model,
    one_thread_each,
    table_head,
    write_outputs,
)
from tuner import _recompute, _x, geomean  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
MODELS = ("nemotron-h-56b", "jamba-v0.1", "qwen3-next-80b", "llama3-70b")
MESHES = ((64, 4, 8, 2), (64, 8, 4, 2), (128, 4, 16, 2), (128, 8, 8, 2))
"""(world, tp, pipeline devices, dp)."""
MEMORY_GIB = 80
ZERO = 1
GIB = 2**30


def run_case(
    model: str, world: int, tp: int, devices: int, dp: int, budget: float, seed: int
) -> dict:
    from octodsl.plan import Recompute
    from octodsl.tune.problem import Problem
    from octodsl.tune.reference.baselines import best_baseline
    from octodsl.tune.reference.compare import NoPlanFits, tune_and_compare

    assert tp * devices * dp == world
    M = 4 * devices
    problem = Problem.create(model, devices, M, memory=MEMORY_GIB * GIB, dp=dp, zero=ZERO, tp=tp)
    from octodsl.sim.links import cut_crosses_nodes, dp_spans_nodes

    mesh = problem.mesh
    inter = problem.inter_link.name if problem.inter_link else problem.link.name
    out = {
        "model": model,
        "world": world,
        "tp": tp,
        "devices": devices,
        "dp": dp,
        "microbatches": M,
        "lower_bound": problem.lower_bound(),
        "dp_link": inter if dp_spans_nodes(mesh).any() else problem.link.name,
        "cuts_inter_node": bool(cut_crosses_nodes(mesh, range(devices))[:-1].all()),
    }
    t0 = time.perf_counter()
    try:
        o = tune_and_compare(problem, budget=budget, seed=seed)
    except NoPlanFits as e:
        out.update(error="no plan fits", note=str(e))
        return out

    def figures(score) -> dict:
        r = score.result
        busy = r.link_busy()
        return {
            "time": score.time,
            "tokens": r.throughput,
            "tp_share": float(busy["tp"].busy.max()) / score.time,
            "inter_node": float(busy["pipeline_inter_node"].busy.max()),
        }

    best = best_baseline(o.baselines)
    base = {b.name: b for b in o.baselines}
    one = base.get("1f1b-equal")
    modes = o.tuned.best.plan.recompute()
    out.update(
        tuned=figures(o.tuned.best),
        tuner_seconds=o.tuned.seconds,
        evaluations=o.tuned.evaluations,
        finished=o.tuned.finished,
        tuned_recompute={m.value: modes.count(m) for m in Recompute if modes.count(m)},
        best_baseline=best.name if best else None,
        best_recompute=best.recompute.value if best else None,
        best=figures(best.score) if best and best.score else None,
        one_f_one_b=figures(one.score) if one and one.usable and one.score else None,
        wall=time.perf_counter() - t0,
    )
    return out


def _t(f: dict | None) -> str:
    return "-" if f is None else f"{f['time'] * 1e3:,.0f}"


def _tok(f: dict | None) -> str:
    return "-" if f is None or f["tokens"] is None else f"{f['tokens']:,.0f}"


def table(results: list[dict]) -> list[str]:
    head = [
        "model",
        "world",
        "tp x P x dp",
        "M",
        "dp on",
        "tuned ms",
        "tok/GPU/s",
        "tp comm",
        "eff.",
        "tuned recompute",
        "best baseline",
        "ms",
        "tok/GPU/s",
        "vs best",
        "1f1b-equal ms",
        "tok/GPU/s",
        "vs 1f1b-eq.",
        "tuner s",
        "plans",
    ]
    lines = table_head(head)
    for r in results:
        cells = [
            r["model"],
            str(r["world"]),
            f"{r['tp']} x {r['devices']} x {r['dp']}",
            str(r["microbatches"]),
            r["dp_link"],
        ]
        if "error" in r:
            cells += [f"{r['error']}: {r['note']}"] + [""] * (len(head) - 6)
        else:
            t, b, o = r["tuned"], r["best"], r["one_f_one_b"]
            cells += [
                _t(t),
                _tok(t),
                f"{t['tp_share']:.0%}",
                f"{r['lower_bound'] / t['time']:.3f}",
                _recompute(r["tuned_recompute"]),
                (r["best_baseline"] or "none fits")
                + (
                    f" ({r['best_recompute']})"
                    if r.get("best_recompute") not in (None, "none")
                    else ""
                ),
                _t(b),
                _tok(b),
                _x(b and b["time"], t["time"]),
                _t(o),
                _tok(o),
                _x(o and o["time"], t["time"]),
                f"{r['tuner_seconds']:.1f}" + ("" if r["finished"] else "*"),
                str(r["evaluations"]),
            ]
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def summary(results: list[dict]) -> list[str]:
    ok = [r for r in results if "error" not in r]
    best = [r["best"]["time"] / r["tuned"]["time"] for r in ok if r["best"]]
    one = [r["one_f_one_b"]["time"] / r["tuned"]["time"] for r in ok if r["one_f_one_b"]]
    slower = [r for r in ok if r["best"] and r["tuned"]["time"] > r["best"]["time"] * (1 + 1e-9)]
    crossing = sum(r["cuts_inter_node"] for r in results)
    lines = [
        f"- cases: {len(results)}; a plan fits in {MEMORY_GIB} GiB: {len(ok)}; every cut "
        f"between pipeline devices leaves a node in {crossing} of them"
        + (
            ""
            if len(ok) == len(results)
            else " (not: "
            + ", ".join(
                f"{r['model']} tp {r['tp']} x {r['devices']}" for r in results if "error" in r
            )
            + ")"
        ),
        f"- speed-up over the best classic baseline (same tp, ZeRO, recompute choice): "
        f"geometric mean {geomean(best)}, min "
        + (f"{min(best):.3f}x" if best else "n/a")
        + f" ({len(best)} cases)",
        f"- slower than the best baseline: {len(slower)} of {len(best)}",
        f"- speed-up over 1F1B with equal layer counts: geometric mean {geomean(one)} "
        f"({len(one)} cases where it fits)",
    ]
    for tp in sorted({r["tp"] for r in ok}):
        tok = {(r["model"], r["world"]): r["tuned"]["tokens"] for r in ok if r["tp"] == tp}
        lines.append(
            f"- tp {tp}: tuned tokens per GPU per second "
            + ", ".join(f"{m} {w}: {t:,.0f}" for (m, w), t in tok.items())
        )
    return lines


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--budget", type=float, default=60.0, help="seconds per case (baselines and tuner)"
    )
    ap.add_argument("--seed", type=int, default=0)
    add_jobs(ap, 1)
    ap.add_argument("--models", nargs="+", default=list(MODELS))
    ap.add_argument("-o", "--output", default=str(REPO / "benchmarks" / "tuner_tp.md"))
    args = ap.parse_args()
    out = Path(args.output)
    if not check_outputs("tuner_tp.py", [out, out.with_suffix(".json")]):
        return 2
    one_thread_each()
    todo = [(m, *mesh) for m in args.models for mesh in MESHES]
    t0, load = time.perf_counter(), os.getloadavg()[0]
    with ProcessPoolExecutor(max_workers=args.jobs) as pool:
        futures = [pool.submit(run_case, *c, args.budget, args.seed) for c in todo]
        results = []
        for f in futures:
            results.append(f.result())
            r = results[-1]
            print(
                r["model"],
                r["world"],
                r["tp"],
                r["devices"],
                r["dp"],
                r.get("error") or f"{r['tuned']['time'] * 1e3:,.0f} ms",
                flush=True,
            )
    command = command_line(".venv/bin/python benchmarks/tuner_tp.py")
    text = [
        "# Tuner benchmark at tensor-parallel degree 4 and 8",
        "",
        f"Made by `{command}` on {cpu_model()} ({os.cpu_count()} cores, shared; each case in one "
        f"single-threaded process), commit {commit()}, {time.strftime('%Y-%m-%d')}; "
        f"{time.perf_counter() - t0:.0f} s in all; load average {load:.1f} when it started, "
        f"{os.getloadavg()[0]:.1f} when it ended (budgets are wall time: on a busier machine "
        f"the tuner simulates fewer plans).",
        "",
        f"Analytical H800 costs at each case's tp: one GPU's share of every layer (sequence "
        f"parallel), its tp collectives as ring collectives on NVLink (8 us + 160 GB/s) inside "
        f"the op (`tp comm`: the busiest device's tp collective seconds over the tuned plan's "
        f"iteration), 16 bytes of static memory per parameter. 8 GPUs per node in Megatron's rank "
        f"order (tp fastest, then dp, then pp): every pipeline device's tp x dp GPUs fill a node "
        f"or more, so every pipeline message leaves a node here, on InfiniBand NDR (15 us + "
        f"45 GB/s); the dp reduce-scatter and all-gather stay in a node at tp 4 (a device's 8 "
        f"GPUs are one node) and cross two at tp 8 (`dp on`). "
        f"{MEMORY_GIB} GiB per GPU, ZeRO {ZERO} over the dp copies, recompute auto (each baseline "
        f"counts with the best of none, selective and full on every stage; `tuned recompute` "
        f"counts the tuned plan's stages that recompute selectively (s) and fully (f)); "
        f"micro-batches of 1 x the model's sequence, 4 x P of them. The baselines and the tuner "
        f"get {args.budget:.0f} s per case together (the baselines at most half), seed "
        f"{args.seed}; the tuner also refines the best baseline. Times are simulated iteration "
        f"times in ms; `eff.` is the problem's lower bound over the tuned time; `vs` columns are "
        f"speed-ups of the tuned plan; `-` a plan over the memory limit; `*` a tuner stopped by "
        f"the budget.",
        "",
        *table(results),
        "",
        "## Against the targets",
        "",
        *summary(results),
        "",
    ]
    files = {out: "\n".join(text), out.with_suffix(".json"): json.dumps(results, indent=1)}
    if not write_outputs("tuner_tp.py", files):
        return 2
    print("\n".join(text))
    return 0


if __name__ == "__main__":
    sys.exit(main())
