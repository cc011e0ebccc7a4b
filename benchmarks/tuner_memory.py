"""What the memory limit costs the tuner on the memory-bound cases: writes
benchmarks/tuner_memory.md.

    .venv/bin/python benchmarks/tuner_memory.py [--budget 60] [--limits 80GiB,96GiB,120GiB,none]
        [--jobs 2] [--levers benchmarks/tuner_levers.json] [-o benchmarks/tuner_memory.md]

The cases are tuner_gap.py's: those of `--levers` (benchmarks/tuner.py's results at 80 GiB,
dp 8, ZeRO 1, recompute auto) whose tuned plan was below 0.90 of the tight bound there. Each
case is tuned again, as tuner.py tunes it (`tune_and_compare`, seed 0, `--budget` seconds, the
best classic baseline refined too), under each memory limit of `--limits` per device, every
run in its own single-threaded process, all in one run of this script so that every column
saw the same machine. Beside each tuned time: the tight bound under that limit
(`Problem.tight_lower_bound`) and its binding term (`bounds.tight_terms`).

What it tells: how much of a case's gap to its tight bound comes with the memory limit. The
bound's memory terms pool the devices' memory and charge each layer's activations for the
shortest time a micro-batch can hold them, so where the tuned plan is far from the bound under
the limit but near it without one, the gap is the memory limit's: either plans within the
limit cannot do better, or the pooled bound cannot see what they pay for it. What it does not:
which of the two (neither bound nor search can tell, tuner_gap.md).
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
from octodsl.cli.common import duration, memory_size  # noqa: E402

CASES_LIMIT = 80 * GIB
"""The limit the cases were picked at (tuner_levers.md's); `--limits` must hold it."""


def limits_arg(text: str) -> tuple[int | None, ...]:
    """`--limits`: bytes per device, comma-separated sizes as `tune --memory` reads them
    (80GiB), 'none' for no limit; 80GiB must be one of them (every other is read against it)."""
    out: list[int | None] = []
    for item in text.split(","):
        out.append(None if item.strip().lower() == "none" else memory_size(item))
    if CASES_LIMIT not in out:
        raise argparse.ArgumentTypeError("80GiB must be one of the limits (the cases' own)")
    if len(set(out)) != len(out):
        raise argparse.ArgumentTypeError(f"a limit is given twice: {text}")
    return tuple(out)


def run_one(case: dict, limit: int | None, budget: float, dp: int, zero: int) -> dict:
    from octodsl.tune.bounds import tight_terms
    from octodsl.tune.problem import Problem
    from octodsl.tune.reference.compare import tune_and_compare

    problem = Problem.create(
        case["model"],
        case["devices"],
        case["microbatches"],
        memory=limit,
        dp=dp,
        zero=zero,
    )
    terms = tight_terms(problem)
    t0 = time.time()
    best = tune_and_compare(problem, budget=budget, seed=0).tuned.best
    return {
        "model": case["model"],
        "devices": case["devices"],
        "microbatches": case["microbatches"],
        "limit": limit,
        "tight": max(terms.values()),
        "binding": max(terms, key=terms.__getitem__),
        "tuned": best.time if best.fits else None,
        "peak_gib": float(best.result.peak_memory.max()) / GIB,
        "seconds": time.time() - t0,
    }


def _ms(t: float | None) -> str:
    return "-" if t is None else f"{t * 1e3:,.1f}"


def _limit(limit: int | None) -> str:
    return "none" if limit is None else f"{limit / GIB:g} GiB"


def table(results: list[dict], limits: tuple[int | None, ...]) -> list[str]:
    head = ["model", "P", "M"]
    for limit in limits:
        head += [f"{_limit(limit)}: tight ms", "tuned ms", "tight eff."]
    head += ["80 GiB over none", "binding term at 80 GiB"]
    lines = table_head(head)
    for key, rows in _by_case(results).items():
        cells = [key[0], str(key[1]), str(key[2])]
        for limit in limits:
            r = rows[limit]
            eff = "-" if r["tuned"] is None else f"{r['tight'] / r['tuned']:.3f}"
            cells += [_ms(r["tight"]), _ms(r["tuned"]), eff]
        at80, free = rows[CASES_LIMIT]["tuned"], rows.get(None, {}).get("tuned")
        cells.append("-" if at80 is None or free is None else f"{at80 / free:.3f}")
        cells.append(rows[CASES_LIMIT]["binding"])
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def _by_case(results: list[dict]) -> dict[tuple, dict]:
    out: dict[tuple, dict] = {}
    for r in results:
        out.setdefault((r["model"], r["devices"], r["microbatches"]), {})[r["limit"]] = r
    return out


def summary(results: list[dict]) -> list[str]:
    lines = []
    for key, rows in _by_case(results).items():
        at80, free = rows[CASES_LIMIT], rows.get(None)
        if at80["tuned"] is None or free is None or free["tuned"] is None:
            continue
        lines.append(
            f"- {key[0]} {key[1]}x{key[2]}: tight eff. {at80['tight'] / at80['tuned']:.3f} at "
            f"80 GiB, {free['tight'] / free['tuned']:.3f} without a limit (its bound "
            f"{free['tight'] / at80['tight']:.3f} of the limited one); the limit costs the tuned "
            f"plan {at80['tuned'] / free['tuned'] - 1:.1%}"
        )
    return lines


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--budget", type=duration, default=60.0, help="the tuner's, as tuner.py's")
    ap.add_argument(
        "--limits",
        type=limits_arg,
        default=limits_arg("80GiB,96GiB,120GiB,none"),
        help="memory per device, comma-separated, 'none' for no limit; 80GiB among them",
    )
    add_jobs(ap, 2)
    add_levers_arguments(ap, "tuner_memory.md")
    args = ap.parse_args()
    cases = levers_cases("tuner_memory.py", args)
    if cases is None:
        return 2
    out = Path(args.output)
    todo = [(c, limit) for c in cases for limit in args.limits]
    load_before = os.getloadavg()
    t0 = time.time()
    with ProcessPoolExecutor(max_workers=args.jobs) as pool:
        futures = [
            pool.submit(run_one, c, limit, args.budget, args.dp, args.zero) for c, limit in todo
        ]
        results = []
        for f in futures:
            results.append(f.result())
            r = results[-1]
            print(r["model"], r["devices"], r["microbatches"], _limit(r["limit"]), r["tuned"])
    load_after = os.getloadavg()
    command = command_line("python benchmarks/tuner_memory.py")
    text = [
        "# What the memory limit costs the tuner",
        "",
        f"Made by `{command}` on {cpu_model()} ({os.cpu_count()} cores; each run in one "
        f"single-threaded process, {args.jobs} at once), commit {commit()}, "
        f"{time.strftime('%Y-%m-%d')}, in {(time.time() - t0) / 60:.0f} min; load average "
        f"{load_before[0]:.1f} before, {load_after[0]:.1f} after (1 min).",
        "",
        f"The cases: those of `{Path(args.levers).name}` (dp {args.dp}, ZeRO {args.zero}, "
        f"recompute auto, 80 GiB per device, analytical H800 costs) below {BELOW} of the tight "
        "bound there (tuner_gap.md's). Each is tuned again as benchmarks/tuner.py tunes it "
        f"({args.budget:.0f} s, seed 0) under each memory limit per device, all in this run; "
        "the static bytes are the same under every limit (the same dp and ZeRO), only the room "
        "for activations changes. `tight ms`: `Problem.tight_lower_bound` under that limit; "
        "`tight eff.`: it over the tuned time; `80 GiB over none`: the tuned time at 80 GiB over "
        "the tuned time without a limit; `binding term`: the term of `bounds.tight_terms` that "
        "is the bound at 80 GiB. Where a case's efficiency rises to about the unlimited cases' "
        "(tuner_levers.md: 0.90 to 0.99 where memory does not bind) once the limit goes, its "
        "gap at 80 GiB comes with the memory limit: plans within it cannot do better, or the "
        "pooled memory terms cannot see what they pay (which of the two, this cannot tell).",
        "",
        *table(results, args.limits),
        "",
        *summary(results),
    ]
    files = {
        out: "\n".join(text) + "\n",
        out.with_suffix(".json"): json.dumps(results, indent=1) + "\n",
    }
    return 0 if write_outputs("tuner_memory.py", files) else 2


if __name__ == "__main__":
    sys.exit(main())
