"""Where the tuner's gap to the bound is, on the memory-bound cases: writes
benchmarks/tuner_gap.md.

    .venv/bin/python benchmarks/tuner_gap.py [--budget 60] [--long-budget 150]
        [--long-searches 6] [--jobs 2] [--levers benchmarks/tuner_levers.json]
        [-o benchmarks/tuner_gap.md]

The cases are those of `--levers` (benchmarks/tuner.py's results at 80 GiB, dp 8, ZeRO 1,
recompute auto) whose tuned plan was below 0.90 of the tight bound there. Each runs in its own
single-threaded process: the tuner as tuner.py runs it (`tune_and_compare`, seed 0, the best
classic baseline refined too) with `--budget`, then a second, independent tuner run of
`--long-searches` searches within `--long-budget` seconds, refining the same baseline but not
the first tuned plan, from seeds the first run does not use (each search is its seed's alone:
seeds in common would repeat its local optima). The best-known plan is the faster of the two.
Beside them: the tight bound as bounds.py computed it at OLD_BOUNDS (old) and as it does now
(new: each W with its accumulation pass, the step), and `bounds.layout_lower_bound` of the
tuned and of the best-known plan's layout (what any schedule of that partition, placement and
recompute needs, memory kept apart per device).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
import types
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from benchmarks.machine import (  # noqa: E402
    add_jobs,
    check_outputs,
    command_line,
    commit,
    cpu_model,
    one_thread_each,
    table_head,
    write_outputs,
)
from octodsl import limits  # noqa: E402
from octodsl.cli.common import integer  # noqa: E402
from octodsl.errors import OctoError  # noqa: E402
from octodsl.inputs import read_data  # noqa: E402

GIB = 2**30
BELOW = 0.90
"""Cases under this fraction of the tight bound are the ones looked at."""
EXPLAINED = 1.02
"""A case is explained when the tuned plan is within 2% of the best-known one."""


OLD_BOUNDS = "2a0d38c"
"""The commit whose bounds.py is the old tight bound: the last before the bounds counted each
W's gradient-accumulation pass and the optimizer step (4985d82)."""


def old_tight_lower_bound(problem) -> float:
    """`tight_lower_bound` as bounds.py computed it at OLD_BOUNDS, on today's costs: its source
    from git, run as a module of the same package (the table's gradient sums under today's
    names)."""
    source = subprocess.run(
        ["git", "show", f"{OLD_BOUNDS}:octodsl/tune/bounds.py"],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    # today's table counts the gradients in parameters, the runtime's bytes apart
    # (StaticBytes.reduce_bytes): the same bytes under the names it has now
    source = source.replace(
        "problem.table.grad_bytes()", "(problem.table.grad_params() * problem.held.reduce_bytes)"
    ).replace("problem.table.grad_reduce_bytes", "problem.held.reduce_bytes")
    module = types.ModuleType("octodsl.tune._old_bounds")
    module.__package__ = "octodsl.tune"
    exec(compile(source, f"{OLD_BOUNDS}:octodsl/tune/bounds.py", "exec"), module.__dict__)
    return module.tight_lower_bound(problem)


def add_levers_arguments(ap: argparse.ArgumentParser, output: str) -> None:
    """`--levers FILE` (tuner.py's results the cases are picked from), the `--dp` and `--zero`
    they were made with, and `-o` (default benchmarks/`output`, a .json beside it), which every
    script that reads them takes alike (`levers_cases`)."""
    ap.add_argument("--levers", default=str(REPO / "benchmarks" / "tuner_levers.json"))
    ap.add_argument("--dp", type=integer(1, limits.MAX_DP), default=8, help="as --levers was made")
    ap.add_argument("--zero", type=int, default=1, choices=(0, 1, 2), help="as --levers was made")
    ap.add_argument("-o", "--output", default=str(REPO / "benchmarks" / output))


def levers_cases(script: str, args: argparse.Namespace) -> list[dict] | None:
    """Before any work, for a script of `add_levers_arguments`: whether it can write its table
    and the .json beside it, then one thread per case, then the cases (`below_tight`); None,
    after one line as `script` saying why, when it cannot write or read them."""
    out = Path(args.output)
    if not check_outputs(script, [out, out.with_suffix(".json")], inputs=[args.levers]):
        return None
    one_thread_each()
    try:
        return below_tight(args.levers, args.dp, args.zero)
    except OctoError as e:
        print(f"{script}: cannot read {args.levers}: {e.message}", file=sys.stderr)
        return None


def below_tight(levers: str | Path, dp: int, zero: int) -> list[dict]:
    """The cases of a tuner.py results file whose tuned plan was below BELOW of the tight
    bound, each a problem the tuner takes at `dp` and `zero`; OctoError saying why when the
    file cannot be read as one (octodsl.inputs: a missing, irregular, non-UTF-8 or malformed
    file), holds no list of results, none of them below, or a case the tuner refuses."""
    from octodsl.tune.problem import Problem

    results = read_data(levers, "tuner.py results file", json_file=True)
    try:
        cases = [
            r
            for r in results
            if r.get("tuned") and r.get("tight_bound") and r["tight_bound"] / r["tuned"] < BELOW
        ]  # a case with no plan that fits has neither
    except (TypeError, AttributeError):  # not a list of mappings with numbers there
        raise OctoError("not a list of tuner.py's results") from None
    if not cases:
        raise OctoError(f"no case below {BELOW} of the tight bound: nothing to look at")
    for c in cases:
        try:
            Problem.create(c["model"], c["devices"], c["microbatches"], dp=dp, zero=zero)
        except KeyError as e:
            raise OctoError(f"a case without its {e.args[0]}") from None
        except OctoError as e:
            raise OctoError(
                f"its case {c['model']} {c['devices']}x{c['microbatches']}: {e}"
            ) from None
    return cases


def run_case(
    case: dict, budget: float, long_budget: float, long_searches: int, dp: int, zero: int
) -> dict:
    from octodsl.tune.bounds import layout_lower_bound
    from octodsl.tune.pipeline.layout import StageLayout
    from octodsl.tune.pipeline.loop import RESTARTS, tune
    from octodsl.tune.problem import Problem
    from octodsl.tune.reference.baselines import best_baseline
    from octodsl.tune.reference.compare import tune_and_compare

    problem = Problem.create(
        case["model"],
        case["devices"],
        case["microbatches"],
        memory=int(case["memory"] * GIB),
        dp=dp,
        zero=zero,
    )
    o = tune_and_compare(problem, budget=budget, seed=0)
    base = best_baseline(o.baselines)
    starts = [base.score.plan] if base is not None and base.score is not None else []
    # seeds 0 .. RESTARTS - 1 are the first run's (tune_and_compare's default searches)
    run = tune(problem, budget=long_budget, seed=RESTARTS, starts=starts, restarts=long_searches)
    long, tuned = run.best, o.tuned.best
    best = long if long.fits and long.time < tuned.time else tuned
    return {
        "model": case["model"],
        "devices": case["devices"],
        "microbatches": case["microbatches"],
        "old_tight": old_tight_lower_bound(problem),
        "levers_tight": case["tight_bound"],
        "levers_tuned": case["tuned"],
        "new_tight": problem.tight_lower_bound(),
        "tuned": tuned.time,
        "tuned_evaluations": o.tuned.evaluations,
        "long": long.time if long.fits else None,
        "tuned_searches": _fitting(o.tuned),
        "long_searches": _fitting(run),
        "best_known": best.time,
        "best_from": "long" if best is long else "tuned",
        "tuned_layout_bound": layout_lower_bound(problem, StageLayout.of(tuned.plan)),
        "best_layout_bound": layout_lower_bound(problem, StageLayout.of(best.plan)),
    }


def _fitting(run) -> list[float]:
    """Each search's best iteration time where it fits, in the order they ran."""
    from octodsl.tune.reference.report import search_times

    return [t for t in search_times(run) if t is not None]


def _ms(t: float | None) -> str:
    return "-" if t is None else f"{t * 1e3:,.1f}"


def _searches(times: list[float]) -> str:
    """'n: lo to hi' of a run's searches' best times (ms)."""
    if not times:
        return "-"
    return f"{len(times)}: {_ms(min(times))} to {_ms(max(times))}"


def _span(xs) -> str:
    xs = sorted(xs)
    return f"{xs[0]:.3f} to {xs[-1]:.3f} (median {xs[len(xs) // 2]:.3f})"


def table(results: list[dict]) -> list[str]:
    head = [
        "model",
        "P",
        "M",
        "old tight ms",
        "new tight ms",
        "tuned ms",
        "its searches ms",
        "long ms",
        "its searches ms",
        "best-known ms",
        "tuned / best",
        "explained",
        "layout bound (tuned) ms",
        "layout bound (best) ms",
        "new tight / best",
        "new tight / layout (best)",
        "layout (best) / best",
    ]
    lines = table_head(head)
    for r in results:
        ratio = r["tuned"] / r["best_known"]
        cells = [
            r["model"],
            str(r["devices"]),
            str(r["microbatches"]),
            _ms(r["old_tight"]),
            _ms(r["new_tight"]),
            _ms(r["tuned"]),
            _searches(r.get("tuned_searches", [])),
            _ms(r["long"]),
            _searches(r.get("long_searches", [])),
            _ms(r["best_known"]),
            f"{ratio:.3f}",
            "yes" if ratio <= EXPLAINED else "no",
            _ms(r["tuned_layout_bound"]),
            _ms(r["best_layout_bound"]),
            f"{r['new_tight'] / r['best_known']:.3f}",
            f"{r['new_tight'] / r['best_layout_bound']:.3f}",
            f"{r['best_layout_bound'] / r['best_known']:.3f}",
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--budget", type=float, default=60.0, help="the tuner's, as tuner.py's")
    ap.add_argument("--long-budget", type=float, default=150.0, help="the second run's")
    ap.add_argument(
        "--long-searches",
        type=integer(1, limits.MAX_SEARCHES),
        default=6,
        help="the second run's searches at most",
    )
    add_jobs(ap, 2)
    add_levers_arguments(ap, "tuner_gap.md")
    args = ap.parse_args()
    todo = levers_cases("tuner_gap.py", args)
    if todo is None:
        return 2
    out = Path(args.output)
    load_before = os.getloadavg()
    t0 = time.time()
    with ProcessPoolExecutor(max_workers=args.jobs) as pool:
        futures = [
            pool.submit(
                run_case, c, args.budget, args.long_budget, args.long_searches, args.dp, args.zero
            )
            for c in todo
        ]
        results = []
        for f in futures:
            results.append(f.result())
            r = results[-1]
            print(r["model"], r["devices"], r["microbatches"], r["tuned"], r["best_known"])
    from octodsl.tune.pipeline.loop import RESTARTS

    load_after = os.getloadavg()
    explained = [r for r in results if r["tuned"] / r["best_known"] <= EXPLAINED]
    command = command_line("python benchmarks/tuner_gap.py")
    text = [
        "# Where the tuner's gap to the bound is",
        "",
        f"Made by `{command}` on {cpu_model()} ({os.cpu_count()} cores; each case in one "
        f"single-threaded process, {args.jobs} at once), commit {commit()}, "
        f"{time.strftime('%Y-%m-%d')}, in {(time.time() - t0) / 60:.0f} min. The machine was "
        f"shared: load average {load_before[0]:.1f} before, {load_after[0]:.1f} after (1 min), "
        f"so each search had at most about {args.jobs / max(load_before[0], load_after[0], 1):.0%}"
        " of a core; budgets are wall time, so its figures are worse than an idle machine's.",
        "",
        f"The cases: those of `{Path(args.levers).name}` (dp {args.dp}, ZeRO {args.zero}, "
        f"recompute auto, 80 GiB per device, analytical H800 costs) below {BELOW} of the tight "
        f"bound there. `tuned`: the tuner as benchmarks/tuner.py runs it, {args.budget:.0f} s, "
        f"seed 0, its {RESTARTS} searches (seeds 0 to {RESTARTS - 1}). `long`: an independent "
        f"run of up to {args.long_searches} searches from seed {RESTARTS} on (none of the "
        f"first run's: a seed's search is the same in any run), {args.long_budget:.0f} s, "
        "refining the same best classic baseline but not the tuned plan. `its searches`: how "
        "many of the run's searches ended with a plan that fits, and the fastest and slowest "
        "of their best plans (before the polish). `best-known`: the faster of the two; "
        "it is only a long tuner run, the weakest kind of reference, so `explained` (the tuned "
        f"plan within {EXPLAINED - 1:.0%} of it) says the tuner's own longer search found no "
        "better plan, not that none exists. `old tight`: `Problem.tight_lower_bound` as bounds.py "
        f"computed it at commit {OLD_BOUNDS}, `new tight`: as now (each W with its "
        "gradient-accumulation pass, then the optimizer step: work every plan runs), both on "
        f"today's costs (`{Path(args.levers).name}`'s tight bound over its tuned time picked "
        "the cases). `layout bound`: "
        "`bounds.layout_lower_bound`, what any schedule of that plan's partition, placement "
        "and recompute needs (per device its waits and compute, recompute included, and its "
        "activation byte-seconds within its own memory beside its own static bytes). The gap "
        "from the new tight bound to the best-known time splits in two factors: `new tight / "
        "layout (best)`, what the best-known layout needs beyond what every plan needs (a "
        "better layout, or the global bound's slack: neither bound can tell which), and "
        "`layout (best) / best`, at most what a better order of that layout could still win "
        "(or that bound's slack).",
        "",
        *table(results),
        "",
        f"- explained (tuned within {EXPLAINED - 1:.0%} of best-known): {len(explained)} of "
        f"{len(results)}",
        "- the gap from the new tight bound to the best-known time, in its two factors: new "
        f"tight / layout (best) {_span(r['new_tight'] / r['best_layout_bound'] for r in results)}"
        ", layout (best) / best "
        f"{_span(r['best_layout_bound'] / r['best_known'] for r in results)}",
        "- new tight bound over old: "
        + ", ".join(
            f"{r['model']} {r['devices']}x{r['microbatches']} {r['new_tight'] / r['old_tight']:.3f}"
            for r in results
        ),
    ]
    files = {
        out: "\n".join(text) + "\n",
        out.with_suffix(".json"): json.dumps(results, indent=1) + "\n",
    }
    return 0 if write_outputs("tuner_gap.py", files) else 2


if __name__ == "__main__":
    sys.exit(main())
