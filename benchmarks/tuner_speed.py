"""The tuner's speed, old code against new, in one run: writes benchmarks/tuner_speed.md.

    .venv/bin/python benchmarks/tuner_speed.py [--base d40dbce] [--evaluations 300]
        [--repeats 2] [--cases nemotron-h-56b:16:32 ...] [-o benchmarks/tuner_speed.md]
    .venv/bin/python benchmarks/tuner_speed.py --same-as COMMIT [--cases ...]

The old code is the commit `--base`, unpacked with `git archive` into a temporary folder. Each
case (tuner_levers.md's levers: H800 costs, 80 GiB, dp 8, ZeRO 1, recompute auto, seed 0) runs
the tuner for a fixed number of simulated plans, once with each code, each in its own
single-threaded process that first compiles its kernels (numba) and warms up, so that only
the search is timed; old and new alternate (old, new, new, old, ...), so a machine that others
load slows both alike, and each side counts with its fastest run. The search stops at the same
evaluation count on both sides, so the tuned plans should be the same (the table says whether
they are, for every run). `--same-as COMMIT` instead checks that a change kept the plans:
each case once with each code, the tuned plan and time compared.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

from machine import ROOT, check_outputs, command_line, commit, cpu_model, write_outputs

GIB = 2**30
CASES = tuple(
    f"{m}:{p}:{k * p}"
    for p in (16, 8)
    for m in ("nemotron-h-8b", "nemotron-h-56b", "jamba-v0.1", "qwen3-next-80b")
    for k in ((2, 4) if p == 16 else (2,))
)
"""The 16-device cases of tuner_levers.md (M 32 and 64), and each model at 8 x 16."""


def worker(case: str, evaluations: int) -> dict:
    """Tune one case with whichever octodsl is on the path; the search alone is timed."""
    from octodsl.sim.simulate import warm_up
    from octodsl.tune.pipeline.loop import tune
    from octodsl.tune.problem import Problem

    model, devices, microbatches = case.split(":")

    def problem() -> Problem:
        return Problem.create(model, int(devices), int(microbatches), memory=80 * GIB, dp=8, zero=1)

    warm_up()
    tune(problem(), budget=600, seed=0, max_evaluations=2)  # compiles the tuner's kernels
    # and ZeroBubble's greedy, compiled since 6460d08, which a two-plan search does not reach
    with contextlib.suppress(ImportError):
        from octodsl.tune.pipeline.zb_auto import ZbCosts, zb_auto

        zb_auto(ZbCosts(*([1.0, 1.0],) * 3, 0.0, [1.0, 1.0], *([-0.5, -0.5],) * 2, [4.0, 4.0]), 2)
    # a fresh problem for the timed search: nothing remembered from the warm-up
    search = problem()
    t0, cpu0 = time.perf_counter(), time.process_time()
    r = tune(search, budget=3600, seed=0, max_evaluations=evaluations)
    seconds, cpu = time.perf_counter() - t0, time.process_time() - cpu0
    best = r.best.plan
    shape = repr((best.stages, best.placement, best.schedule))
    return {
        "evaluations": r.evaluations,
        "seconds": seconds,
        "cpu": cpu,
        "tuned": r.best.time,
        "plan": hashlib.sha1(shape.encode()).hexdigest(),
    }


def run(code: Path, case: str, evaluations: int) -> dict:
    env = dict(os.environ, PYTHONPATH=str(code), NUMBA_NUM_THREADS="1", OMP_NUM_THREADS="1")
    out = subprocess.run(
        [sys.executable, __file__, "--worker", case, "--evaluations", str(evaluations)],
        env=env,
        capture_output=True,
        text=True,
    )
    if out.returncode != 0:
        last = (out.stderr.strip().splitlines() or ["no message"])[-1]
        raise SystemExit(f"tuner_speed.py: case {case} failed with the code at {code}: {last}")
    got = json.loads(out.stdout.strip().splitlines()[-1])
    got["load"] = os.getloadavg()[0]
    return got


def table(rows: list[dict]) -> list[str]:
    out = [
        "| case (model P x M) | evaluations | old plans/s | new plans/s | speed-up | old s | new s "
        "| old tuned ms | new tuned ms | same plan | CPU speed-up |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        o, n = r["old"], r["new"]
        rate_o, rate_n = o["evaluations"] / o["seconds"], n["evaluations"] / n["seconds"]
        model, p, m = r["case"].split(":")
        same = len({x["plan"] for side in r["runs"].values() for x in side}) == 1
        out.append(
            f"| {model} {p} x {m} | {n['evaluations']} | {rate_o:.1f} | {rate_n:.1f} "
            f"| {rate_n / rate_o:.1f}x | {o['seconds']:.1f} | {n['seconds']:.1f} "
            f"| {o['tuned'] * 1e3:,.1f} | {n['tuned'] * 1e3:,.1f} "
            f"| {'yes' if same else 'no'} | {_cpu_speedup(r)} |"
        )
    return out


def _cpu_speedup(row: dict) -> str:
    """The speed-up in the searches' CPU seconds (each side's least), which the machine's other
    jobs change far less than its wall time; '-' for runs that did not record it."""
    cpu = [min((x.get("cpu") for x in row["runs"][side]), default=None) for side in ("old", "new")]
    if None in cpu or not cpu[1]:
        return "-"
    return f"{cpu[0] / cpu[1]:.1f}x"


@contextlib.contextmanager
def unpacked(commit_: str) -> Iterator[Path]:
    """The code of `commit_`, unpacked with `git archive` into a temporary folder."""
    with tempfile.TemporaryDirectory() as folder:
        archive = subprocess.run(
            ["git", "archive", commit_], cwd=ROOT, capture_output=True, check=True
        ).stdout
        subprocess.run(["tar", "-x", "-C", folder], input=archive, check=True)
        yield Path(folder)


def same_as(base: str, cases: list[str], evaluations: int) -> int:
    """Print, per case, whether this code's tuned plan (the hash of its partition, placement,
    recompute and orders) and simulated time are `base`'s; 1 when some case differs."""
    differ = 0
    with unpacked(base) as old:
        for case in cases:
            a, b = run(old, case, evaluations), run(ROOT, case, evaluations)
            same = (a["plan"], a["tuned"]) == (b["plan"], b["tuned"])
            differ += not same
            print(
                f"{case}: {'same' if same else 'DIFFERENT'} plan {b['plan'][:12]} "
                f"time {b['tuned']!r} (base: {a['plan'][:12]} {a['tuned']!r}); "
                f"CPU s {a['cpu']:.2f} -> {b['cpu']:.2f}",
                flush=True,
            )
    print(f"{len(cases) - differ} of {len(cases)} cases the same as {base}")
    return 1 if differ else 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--base", default="d40dbce", help="the old code's commit")
    ap.add_argument("--evaluations", type=int, default=300)
    ap.add_argument("--repeats", type=int, default=2, help="runs of each side per case")
    ap.add_argument("--cases", nargs="+", default=list(CASES), help="model:devices:microbatches")
    ap.add_argument("-o", "--output", type=Path, default=None)
    ap.add_argument(
        "--same-as",
        metavar="COMMIT",
        help="instead of timing: whether each case ends with the plan and time of COMMIT's "
        "code (one run each; exit status 1 when some differ)",
    )
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        print(json.dumps(worker(args.worker, args.evaluations)))
        return 0
    _check(ap, args)
    written = [] if args.output is None else [args.output, args.output.with_suffix(".json")]
    if args.same_as is None and not check_outputs("tuner_speed.py", written):
        return 2
    if args.same_as is not None:
        return same_as(args.same_as, args.cases, args.evaluations)

    t0 = time.perf_counter()
    loads = [os.getloadavg()[0]]
    rows = []
    with unpacked(args.base) as old:
        for i, case in enumerate(args.cases):
            sides = [("old", Path(old)), ("new", ROOT)]
            runs: dict[str, list[dict]] = {"old": [], "new": []}
            for k in range(args.repeats):  # old new new old ..., new first every other case
                for name, code in sides if (i + k) % 2 == 0 else sides[::-1]:
                    runs[name].append(run(code, case, args.evaluations))
            loads += [x["load"] for side in runs.values() for x in side]
            row: dict = {"case": case, "runs": runs}
            row.update((name, min(r, key=lambda x: x["seconds"])) for name, r in runs.items())
            rows.append(row)
            print("\n".join(table([row])[2:]), flush=True)
    lines = table(rows)
    if args.output is not None:
        command = command_line("python benchmarks/tuner_speed.py")
        speedups = [
            (r["new"]["evaluations"] / r["new"]["seconds"])
            / (r["old"]["evaluations"] / r["old"]["seconds"])
            for r in rows
            if r["case"].split(":")[1] == "16"
        ]
        head = [
            "# Tuner speed: the old code against the new",
            "",
            f"Made by `{command}` on {cpu_model()} ({os.cpu_count()} cores, shared with other "
            f"work), commit {commit()} against {args.base}, in {time.perf_counter() - t0:.0f} s; "
            f"the machine's 1-minute load average was {min(loads):.1f} to {max(loads):.1f} "
            f"(at the start and after each run: other jobs' processes on its "
            f"{os.cpu_count()} cores, which slow both sides alike but make wall times noisy; "
            "`CPU speed-up` compares the searches' CPU seconds instead).",
            "",
            "Each case: tuner_levers.md's levers (H800 costs, 80 GiB per device, dp 8, ZeRO 1, "
            "recompute auto), seed 0, the search stopped after the same number of simulated "
            "plans on both sides; each side in its own single-threaded process, kernels "
            "compiled and warmed up before the timed search, old and new alternating, "
            f"{args.repeats} runs of each side per case, each side counted with its fastest. "
            "`plans/s` is simulated plans per second of the search's wall time (`old s`, "
            "`new s`); `tuned ms` the best plan's simulated iteration time; `same plan` whether "
            "every run of both sides ended with the identical plan (partition, placement, "
            "recompute and every device's order); the costs and the simulator changed between "
            f"{args.base} and this commit's code (CHANGELOG.md, [Unreleased]), so two sides "
            "that value plans differently may end with different plans.",
            "",
            *lines,
            "",
            f"Speed-up on the 16-device cases: min {min(speedups, default=0):.1f}x, max "
            f"{max(speedups, default=0):.1f}x (in CPU seconds: "
            + ", ".join(_cpu_speedup(r) for r in rows if r["case"].split(":")[1] == "16")
            + ").",
        ]
        files = {
            args.output: "\n".join(head) + "\n",
            args.output.with_suffix(".json"): json.dumps(rows, indent=1) + "\n",
        }
        if not write_outputs("tuner_speed.py", files):
            return 2
    return 0


def _check(ap: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Refuse, in one line and before any run, what would fail minutes later."""
    if not 1 <= args.evaluations <= 10**6:
        ap.error("--evaluations takes 1 to 1,000,000")
    if not 1 <= args.repeats <= 100:
        ap.error("--repeats takes 1 to 100")
    for case in args.cases:
        parts = case.split(":")
        if len(parts) != 3 or not all(x.isdigit() and 0 < int(x) <= 4096 for x in parts[1:]):
            ap.error(f"--cases: {case!r} is not model:devices:microbatches (whole numbers)")
    for option, rev in (("--base", args.base), ("--same-as", args.same_as)):
        if rev is None:
            continue
        found = subprocess.run(
            ["git", "rev-parse", "--verify", "--quiet", f"{rev}^{{commit}}"],
            cwd=ROOT,
            capture_output=True,
        )
        if not rev or rev.startswith("-") or found.returncode != 0:
            ap.error(f"{option}: {rev!r} is not a commit of this repository")


if __name__ == "__main__":
    sys.exit(main())
