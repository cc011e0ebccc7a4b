"""`tune --jobs`: the tuner's searches side by side in worker processes against one after
another. Each case is one `octodsl tune --json` as a user runs it, with `--jobs 1` and then with
`--jobs N` (default: this machine's cores), one command at a time so that each has the machine.

    .venv/bin/python benchmarks/tuner_jobs.py [--jobs-each N] [-o benchmarks/tuner_jobs.md]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from machine import (  # noqa: E402
    check_outputs,
    command_line,
    commit,
    cpu_model,
    one_thread_each,
    table_head,
    write_outputs,
)

CASES = (
    ("nemotron-h-56b", 16, 32),
    ("nemotron-h-56b", 16, 64),
    ("qwen3-next-80b", 16, 32),
    ("jamba-v0.1", 4, 16),
    ("llama3-8b", 8, 16),
)
"""(model, devices, micro-batches) of benchmarks/tuner_levers.md, each at 80 GiB per device,
dp 8, ZeRO 1, 60 s, seed 0: the issue's 16-device target case and three more the budget stops
there, and one whose six searches end within it (llama3-8b: 18.6 s)."""


def tune(case: tuple[str, int, int], jobs: int, out: Path) -> dict:
    """One `octodsl tune --json` of `case` with `--jobs jobs`: its figures and wall time."""
    model, devices, microbatches = case
    args = [sys.executable, "-m", "octodsl", "tune", "--model", model, "-p", str(devices)]
    args += ["-m", str(microbatches), "--memory", "80GiB", "--dp", "8", "--zero", "1"]
    args += ["--budget", "60s", "--seed", "0", "--jobs", str(jobs), "--json", "-o", str(out)]
    t = time.perf_counter()
    run = subprocess.run(args, capture_output=True, text=True, check=True)
    wall = time.perf_counter() - t
    figures = json.loads(run.stdout)
    tuner = figures["tuner"]
    return {
        "case": case,
        "jobs": jobs,
        "ms": figures["iteration_time"] * 1e3,
        "tight": figures["tight_efficiency"],
        "plans": tuner["evaluations"],
        "searches": sum(t is not None for t in tuner["searches"]),
        "finished": tuner["finished"],
        "search_s": tuner["seconds"],
        "wall_s": wall,
    }


def main() -> int:
    from octodsl.cli.common import integer

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "--jobs-each",
        type=integer(2, 256),
        default=os.cpu_count() or 2,
        help="the --jobs of the second run of each case (default: this machine's cores)",
    )
    ap.add_argument("-o", "--output", type=Path, default=Path("benchmarks/tuner_jobs.md"))
    args = ap.parse_args()
    if not check_outputs("tuner_jobs.py", [args.output, args.output.with_suffix(".json")]):
        return 2
    one_thread_each()  # each process one core: --jobs N uses N of them
    began = time.perf_counter()
    rows = []
    with tempfile.TemporaryDirectory() as folder:
        for case in CASES:
            for jobs in (1, args.jobs_each):
                print(f"tuner_jobs.py: {case} --jobs {jobs}", file=sys.stderr, flush=True)
                rows.append(tune(case, jobs, Path(folder) / "t.octo"))
    minutes = (time.perf_counter() - began) / 60
    lines = [
        "# `tune --jobs`: the searches side by side",
        "",
        f"Made by `{command_line('.venv/bin/python benchmarks/tuner_jobs.py')}` at commit "
        f"{commit()} on {cpu_model()} ({os.cpu_count()} cores), in {minutes:.0f} min.",
        "",
        "Each case: `octodsl tune --model M -p P -m M --memory 80GiB --dp 8 --zero 1 --budget "
        "60s --seed 0 --json` with `--jobs 1` (the searches one after another, the default) and "
        f"`--jobs {args.jobs_each}` (that many at once, each in a process of its own), one "
        "command at a time. `searches`: how many of the tuner's six searches ended with a plan; "
        "`done`: all six ended by themselves (the plan is then the same with any --jobs); "
        "`tuner s`: the baselines and the searches; `wall s`: the whole command.",
        "",
        *table_head(
            ["model", "P", "M", "jobs", "tuned ms", "tight eff.", "plans", "searches", "done"]
            + ["tuner s", "wall s"]
        ),
    ]
    for r in rows:
        model, p, m = r["case"]
        lines.append(
            f"| {model} | {p} | {m} | {r['jobs']} | {r['ms']:,.1f} | {r['tight']:.3f} | "
            f"{r['plans']:,} | {r['searches']} | {'yes' if r['finished'] else 'no'} | "
            f"{r['search_s']:.1f} | {r['wall_s']:.1f} |"
        )
    text = "\n".join(lines) + "\n"
    files = {args.output: text, args.output.with_suffix(".json"): json.dumps(rows, indent=1)}
    if not write_outputs("tuner_jobs.py", files):
        return 2
    print(text, end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
