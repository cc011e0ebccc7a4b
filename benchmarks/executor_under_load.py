"""The executor's multi-process tests, repeated on a loaded machine.

    .venv/bin/python benchmarks/executor_under_load.py [--runs 5] [-o benchmarks/executor_under_load.md]

Starts one busy process per core (a Python loop that never sleeps), runs the DeepSpeed tests
(`pytest -m slow tests/deepspeed_ext`) RUNS times while they spin, stops them, and writes a
markdown table of each run's outcome and wall time. The tests compare losses and weights with
stock DeepSpeed bit for bit and time out stalled ranks, so this shows that neither the
exactness nor the watchdog depends on the machine being quiet.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import platform
import re
import subprocess
import sys
import time
from pathlib import Path

from machine import (  # benchmarks/machine.py: scripts run from their folder
    ROOT,
    check_outputs,
    commit,
    cpu_model,
    write_outputs,
)


def spin() -> None:
    while True:
        pass


def run_tests() -> tuple[str, float, str]:
    start = time.time()
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-m",
            "slow",
            "-p",
            "no:cacheprovider",
            "tests/deepspeed_ext",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    seconds = time.time() - start
    lines = proc.stdout.strip().splitlines()
    summary = lines[-1] if lines else proc.stderr.strip()[-200:]
    failed = re.findall(r"^(?:FAILED|ERROR) (\S+)", proc.stdout, re.M)
    return summary, seconds, ", ".join(failed)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("-o", "--output", default=str(ROOT / "benchmarks" / "executor_under_load.md"))
    args = ap.parse_args()
    if not check_outputs("executor_under_load.py", [args.output]):
        return 2
    cores = os.cpu_count() or 1
    busy = [multiprocessing.Process(target=spin, daemon=True) for _ in range(cores)]
    for p in busy:
        p.start()
    rows = []
    try:
        for i in range(args.runs):
            summary, seconds, failed = run_tests()
            load = os.getloadavg()[0]
            rows.append(f"| {i + 1} | {summary} | {seconds:.0f} s | {load:.1f} | {failed or '-'} |")
            print(rows[-1], flush=True)
    finally:
        for p in busy:
            p.terminate()
    text = "\n".join(
        [
            "# Executor tests under load",
            "",
            f"Made by `.venv/bin/python benchmarks/executor_under_load.py --runs {args.runs}` at "
            f"commit {commit()} on "
            f"{cpu_model()} ({cores} cores), Python {platform.python_version()}, with {cores} busy "
            "processes (one per core) spinning for the whole run, started and stopped by the script.",
            "Each run is `pytest -q -m slow tests/deepspeed_ext`: every plan against stock DeepSpeed "
            "(losses and weights bit for bit where the operations are the same), checkpoint resume, "
            "data parallelism, the watchdog and the launch checks.",
            "",
            "| run | pytest summary | wall time | load average (1 min) at the end | failed |",
            "|---:|---|---:|---:|---|",
            *rows,
            "",
        ]
    )
    return 0 if write_outputs("executor_under_load.py", {Path(args.output): text}) else 2


if __name__ == "__main__":
    sys.exit(main())
