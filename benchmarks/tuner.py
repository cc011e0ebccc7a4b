"""The tuner against every baseline on the benchmark suite: writes benchmarks/tuner.md.

    .venv/bin/python benchmarks/tuner.py [--budget 60] [--jobs 2] [--others random,milp,milp-warm]
        [--models ...] [--devices 4 8 16] [--memory 80 none] [--dp 1] [--zero 0]
        [--recompute auto|none|full|selective] [-o benchmarks/tuner.md]

Each case (model, devices, micro-batches = 2x and 4x devices, H800 costs, NVLink messages, a
memory limit per device in GiB or none) runs in its own single-threaded process: the classic
baselines, the tuner (which also refines the best baseline), then random search and CP-SAT with
the tuner's budget. One table per memory setting (-o), the raw results beside it (.json).
`--dp`, `--zero` and `--recompute` are the memory levers of the tuner and of every baseline
alike (with `auto`, each baseline counts with the best of no, selective and full recompute on
every stage).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "benchmarks"))
from machine import (  # noqa: E402
    add_jobs,
    check_outputs,
    command_line,
    one_thread_each,
    table_head,
    write_outputs,
)

MODELS = ("nemotron-h-8b", "nemotron-h-56b", "jamba-v0.1", "qwen3-next-80b", "llama3-8b")
HYBRIDS = MODELS[:4]
GIB = 2**30


def run_case(
    model: str,
    devices: int,
    microbatches: int,
    memory: float | None,
    budget: float,
    seed: int,
    others: tuple[str, ...],
    dp: int = 1,
    zero: int = 0,
    recompute: str = "auto",
) -> dict:
    from octodsl.plan import Recompute
    from octodsl.tune.problem import AUTO, Problem
    from octodsl.tune.reference.baselines import best_baseline
    from octodsl.tune.reference.compare import NoPlanFits, tune_and_compare
    from octodsl.units import size

    problem = Problem.create(
        model,
        devices,
        microbatches,
        memory=None if memory is None else int(memory * GIB),
        dp=dp,
        zero=zero,
        recompute=recompute if recompute == AUTO else Recompute(recompute),
    )
    out = {
        "model": model,
        "devices": devices,
        "microbatches": microbatches,
        "lower_bound": problem.lower_bound(),
        "tight_bound": _finite(problem.tight_lower_bound()),
    }
    t0 = time.perf_counter()
    try:
        o = tune_and_compare(problem, budget=budget, seed=seed, others=others)
    except NoPlanFits as e:
        static = float(problem.layer_static().sum()) / devices
        out.update(error=f"no plan fits ({size(static, 0)} static per device)", note=str(e))
        return out
    best = best_baseline(o.baselines)
    modes = o.tuned.best.plan.recompute()
    base = {b.name: (b.score.time if b.usable else None) for b in o.baselines}
    out.update(
        tuned=o.tuned.best.time,
        tuner_seconds=o.tuned.seconds,
        evaluations=o.tuned.evaluations,
        finished=o.tuned.finished,
        rounds=len(o.tuned.rounds),
        best_baseline=best.name if best else None,
        best_time=best.score.time if best else None,
        best_recompute=best.recompute.value if best else None,
        tuned_recompute={m.value: modes.count(m) for m in Recompute if modes.count(m)},
        one_f_one_b=base.get("1f1b-equal"),
        others={k: (s.time if s is not None and s.fits else None) for k, s in o.others.items()},
        notes=o.notes,
        wall=time.perf_counter() - t0,
    )
    return out


def _finite(x: float) -> float | None:
    """None for inf (static bytes over the devices' memory: no plan at all), so the JSON is
    strict."""
    return x if math.isfinite(x) else None


def cases(models, device_counts, memory):
    return [(m, p, k * p, memory) for m in models for p in device_counts for k in (2, 4)]


def _ms(t):
    return "-" if t is None else f"{t * 1e3:,.1f}"


def _x(a, b):
    return "-" if a is None or b is None else f"{a / b:.2f}x"


def table(results: list[dict], others: tuple[str, ...]) -> list[str]:
    head = (
        [
            "model",
            "P",
            "M",
            "tuned ms",
            "eff.",
            "tight eff.",
            "tuned recompute",
            "best baseline",
            "ms",
            "vs best",
            "1f1b-equal ms",
            "vs 1f1b-eq.",
        ]
        + [f"{k} ms" for k in others]
        + ["tuner s", "plans"]
    )
    lines = table_head(head)
    for r in results:
        cells = [r["model"], str(r["devices"]), str(r["microbatches"])]
        if "error" in r:
            cells += [r["error"]] + [""] * (len(head) - 4)
        else:
            eff = r["lower_bound"] / r["tuned"]
            cells += [
                _ms(r["tuned"]),
                f"{eff:.3f}",
                f"{r['tight_bound'] / r['tuned']:.3f}",
                _recompute(r.get("tuned_recompute")),
                (r["best_baseline"] or "none fits")
                + (
                    f" ({r['best_recompute']})"
                    if r.get("best_recompute") not in (None, "none")
                    else ""
                ),
                _ms(r["best_time"]),
                _x(r["best_time"], r["tuned"]),
                _ms(r["one_f_one_b"]),
                _x(r["one_f_one_b"], r["tuned"]),
            ]
            cells += [
                _ms(r["others"].get(k)) + (f" ({r['notes'][k]})" if k in r["notes"] else "")
                for k in others
            ]
            cells += [
                f"{r['tuner_seconds']:.1f}" + ("" if r["finished"] else "*"),
                str(r["evaluations"]),
            ]
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def _recompute(counts: dict | None) -> str:
    """'12 s, 4 f' for the tuned plan's stages: how many recompute selectively, fully; 'none'."""
    shown = [f"{counts[m]} {m[0]}" for m in ("selective", "full") if counts and m in counts]
    return ", ".join(shown) or "none"


def geomean(xs) -> str:
    return f"{math.exp(sum(map(math.log, xs)) / len(xs)):.3f}x" if xs else "n/a"


def summary(results: list[dict], others: tuple[str, ...]) -> list[str]:
    ok = [r for r in results if "error" not in r]
    with_base = [r for r in ok if r["best_time"] is not None]
    eff = [r["lower_bound"] / r["tuned"] for r in ok]
    tight = [r["tight_bound"] / r["tuned"] for r in ok]
    cap = [r["lower_bound"] / r["tight_bound"] for r in ok]
    hyb = [r["best_time"] / r["tuned"] for r in with_base if r["model"] in HYBRIDS]
    nem = [
        r["one_f_one_b"] / r["tuned"]
        for r in ok
        if r["model"].startswith("nemotron-h") and r["one_f_one_b"] is not None
    ]
    slower = [r for r in with_base if r["tuned"] > r["best_time"] * (1 + 1e-9)]
    big = [r["tuner_seconds"] for r in ok if r["devices"] == 16 and r["microbatches"] == 64]
    lines = [
        f"- cases: {len(results)}; a plan fits in memory: {len(ok)}; some classic baseline "
        f"fits: {len(with_base)}",
        f"- efficiency >= 0.95: {sum(e >= 0.95 for e in eff)} of {len(eff)} (min {min(eff):.3f}, "
        f"median {sorted(eff)[len(eff) // 2]:.3f})"
        if eff
        else "- efficiency: no case",
        f"- cases where no plan can reach efficiency 0.95 (lower bound / tight bound < 0.95): "
        f"{sum(c < 0.95 for c in cap)} of {len(cap)}"
        if cap
        else "",
        f"- efficiency against the tight bound >= 0.95: {sum(e >= 0.95 for e in tight)} of "
        f"{len(tight)} (min {min(tight):.3f}, median {sorted(tight)[len(tight) // 2]:.3f})"
        if tight
        else "",
        f"- efficiency against the tight bound >= 0.90: {sum(e >= 0.90 for e in tight)} of "
        f"{len(tight)}; below: "
        + (
            ", ".join(
                f"{r['model']} {r['devices']}x{r['microbatches']} {r['tight_bound'] / r['tuned']:.3f}"
                for r in ok
                if r["tight_bound"] / r["tuned"] < 0.90
            )
            or "none"
        )
        if tight
        else "",
        "- nemotron-h-56b on 16 devices, efficiency against the tight bound: "
        + ", ".join(
            f"M {r['microbatches']}: {r['tight_bound'] / r['tuned']:.3f}"
            for r in ok
            if r["model"] == "nemotron-h-56b" and r["devices"] == 16
        ),
        f"- speed-up over the best baseline (same levers): geometric mean "
        f"{geomean([r['best_time'] / r['tuned'] for r in with_base])}, min "
        + (f"{min(r['best_time'] / r['tuned'] for r in with_base):.3f}x" if with_base else "n/a"),
        f"- slower than the best baseline: {len(slower)} of {len(with_base)}",
        f"- hybrids, geometric mean over the best baseline: {geomean(hyb)} ({len(hyb)} cases)",
        f"- nemotron-h, geometric mean over 1F1B with equal layer counts: {geomean(nem)} "
        f"({len(nem)} cases)",
        f"- tuner wall time at 16 devices x 64 micro-batches: max {max(big):.1f} s" if big else "",
    ]
    for k in others:
        beat = [r for r in ok if r["others"].get(k) is not None]
        worse = sum(r["others"][k] >= r["tuned"] * (1 - 1e-9) for r in beat)
        lines.append(
            f"- {k}: found a plan that fits in {len(beat)} of {len(ok)} cases; no better "
            f"than the tuner in {worse} of them"
        )
    return [x for x in lines if x]


def _held(zero: int, dp: int) -> str:
    """The runtime every plan of the page is costed for (the one its header implies) and a
    bf16 model's bytes per parameter there at this ZeRO stage and dp."""
    from octodsl.costs.param_bytes import param_bytes
    from octodsl.plan import RUNTIME_NAMES, Header, plan_runtime

    runtime = plan_runtime(Header(name="page", devices=1, microbatches=1, dp=dp, zero=zero))
    held = param_bytes("bf16", runtime, zero, dp)
    return (
        f"{RUNTIME_NAMES[runtime]}'s, octodsl/costs/param_bytes.py: {held.total:g} bytes per "
        f"bf16 parameter at zero {zero} over dp {dp}: {held.weights:g} weights, "
        f"{held.grads:g} gradients, {held.optimizer:g} optimizer state"
    )


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--budget", type=float, default=60.0)
    ap.add_argument("--seed", type=int, default=0)
    add_jobs(ap, 1)
    ap.add_argument("--others", default="random,milp,milp-warm")
    ap.add_argument("--models", nargs="+", default=list(MODELS))
    ap.add_argument("--devices", nargs="+", type=int, default=[4, 8, 16])
    ap.add_argument(
        "--memory",
        nargs="+",
        default=["80", "none"],
        help="memory limits per device in GiB, or none; one table each",
    )
    ap.add_argument("--dp", type=int, default=1, help="data-parallel copies (every plan's header)")
    ap.add_argument(
        "--zero",
        type=int,
        default=0,
        choices=(0, 1, 2),
        help="ZeRO stage over the dp copies, for the tuner and the baselines",
    )
    ap.add_argument(
        "--recompute",
        default="auto",
        choices=("auto", "none", "full", "selective"),
        help="recompute choice of the tuner and the baselines",
    )
    ap.add_argument("-o", "--output", default=str(REPO / "benchmarks" / "tuner.md"))
    args = ap.parse_args()
    out = Path(args.output)
    if not check_outputs("tuner.py", [out, out.with_suffix(".json")]):
        return 2
    others = tuple(x for x in args.others.split(",") if x)
    one_thread_each()
    limits = [None if m == "none" else float(m) for m in args.memory]
    todo = [c for limit in limits for c in cases(args.models, args.devices, limit)]
    with ProcessPoolExecutor(max_workers=args.jobs) as pool:
        futures = [
            pool.submit(
                run_case, *c, args.budget, args.seed, others, args.dp, args.zero, args.recompute
            )
            for c in todo
        ]
        results = []
        for c, f in zip(todo, futures, strict=True):
            results.append(f.result() | {"memory": c[3]})
            r = results[-1]
            print(
                r["model"],
                r["devices"],
                r["microbatches"],
                r["memory"],
                r.get("error") or f"eff {r['lower_bound'] / r['tuned']:.3f}",
                flush=True,
            )
    command = command_line("python benchmarks/tuner.py")
    text = [
        "# Tuner benchmark",
        "",
        f"Made by `{command}` on {platform.processor() or platform.machine()} "
        f"({os.cpu_count()} cores; each case in one single-threaded process), "
        f"{time.strftime('%Y-%m-%d')}.",
        "",
        f"Analytical H800 costs (static memory as the plans' runtime holds it, "
        f"{_held(args.zero, args.dp)}), NVLink messages "
        f"(8 us + 160 GB/s), seed {args.seed}. "
        f"Memory levers, for the tuner and every baseline alike: dp {args.dp}, ZeRO stage "
        f"{args.zero}, recompute {args.recompute}"
        + (
            " (each baseline counts with the best of none, selective on every stage and full on "
            "every stage; `tuned recompute` counts the tuned plan's stages that recompute "
            "selectively (s) and fully (f))"
            if args.recompute == "auto"
            else ""
        )
        + ". "
        + (f"The tuner and {', '.join(others)} each get " if others else "The tuner gets ")
        + f"{args.budget:.0f} s; the tuner also refines the best classic baseline. Times are "
        "simulated iteration times in ms; `eff.` is the lower bound (largest of total work / "
        "devices, heaviest layer x micro-batches, one micro-batch's path, each W with its "
        "gradient-accumulation pass, then the optimizer step) over the tuned time; "
        "`tight eff.` uses the tighter bound that adds each layer's wait for the first "
        "micro-batch's forward (an LM head on 16 devices cannot start before the other "
        "layers' forward) and the memory limit (the activation byte-seconds every micro-batch "
        "holds, over the memory left beside the static bytes; `Problem.tight_lower_bound`); "
        "`vs` columns are speed-ups of the tuned plan; `-` is a plan over the memory limit (or "
        "none found in time); `*` a tuner stopped by the budget.",
    ]
    for limit in limits:
        part = [r for r in results if r["memory"] == limit]
        title = "no memory limit" if limit is None else f"{limit:g} GiB per device"
        text += [
            "",
            f"## {title}",
            "",
            *table(part, others),
            "",
            f"### Against the targets ({title})",
            "",
            *summary(part, others),
        ]
    files = {out: "\n".join(text) + "\n", out.with_suffix(".json"): json.dumps(results, indent=1)}
    return 0 if write_outputs("tuner.py", files) else 2


if __name__ == "__main__":
    sys.exit(main())
