"""`octodsl lint` on the largest plans a user can write: writes benchmarks/lint_speed.md.

    .venv/bin/python benchmarks/lint_speed.py [-o benchmarks/lint_speed.md]

Two plans of MAX_OPS ops: a complete one (10 stages x 50,000 micro-batches, every rule and the
deadlock search run) and one whose ops are all the same op but one (10^6 - 1 duplicates of
F0:0 in a loop body: lint reports them in one line). Wall time of the command, start-up
included, best of three; the lines it printed show that the output stays short.
"""

from __future__ import annotations

import argparse
import os
import platform
import subprocess
import sys
import tempfile
from pathlib import Path

from lint import best  # benchmarks/lint.py: the same best-of-n timing
from machine import check_outputs, write_outputs  # benchmarks/machine.py

from octodsl.limits import MAX_OPS

STAGES = 10


def complete_plan() -> str:
    m = MAX_OPS // (2 * STAGES)
    blocks = "".join(
        f"  device {d} {{ F{d}:0..{m - 1} BW{d}:0..{m - 1} }}\n" for d in range(STAGES)
    )
    return (
        f'plan "limit" {{\n  devices {STAGES}\n  microbatches {m}\n}}\nstages {STAGES}\n'
        f"placement loop\nschedule {{\n{blocks}}}\n"
    )


def duplicates_plan() -> str:
    return (
        'plan "dups" {\n  devices 1\n  microbatches 1\n}\nstages 1\nplacement loop\n'
        f"schedule {{\n  device 0 {{ for i in 0..{MAX_OPS - 2} {{ F0:0 }} BW0:0 }}\n}}\n"
    )


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("-o", "--output", default=str(Path(__file__).with_suffix(".md")))
    args = ap.parse_args()
    if not check_outputs("lint_speed.py", [args.output]):
        return 2
    octodsl = Path(sys.executable).with_name("octodsl")
    rows = []
    for label, text in (
        ("complete, 10 stages x 50,000 micro-batches", complete_plan()),
        ("999,999 duplicates of F0:0 in a loop body", duplicates_plan()),
    ):
        with tempfile.NamedTemporaryFile("w", suffix=".octo", delete=False) as f:
            f.write(text)
        done: list = []
        command = [octodsl, "lint", f.name]
        seconds = best(
            lambda c=command, d=done: d.append(subprocess.run(c, capture_output=True, text=True)),
            3,
        )
        lines = len((done[-1].stdout + done[-1].stderr).splitlines())
        os.unlink(f.name)
        rows.append(f"| {label} | {MAX_OPS:,} | {seconds:.1f} s | {lines} |")
        print(rows[-1], flush=True)
    out = [
        "# Lint speed at the op limit",
        "",
        f"Made by `.venv/bin/python benchmarks/lint_speed.py` on {platform.machine()}, Python "
        f"{platform.python_version()}, {os.cpu_count()} cores (load average "
        f"{os.getloadavg()[0]:.1f} when it ran). `octodsl lint FILE` wall time, start-up "
        "included, best of 3; lines: what it printed.",
        "",
        "| plan | ops | wall time | lines |",
        "|---|---:|---:|---:|",
        *rows,
        "",
    ]
    return 0 if write_outputs("lint_speed.py", {Path(args.output): "\n".join(out)}) else 2


if __name__ == "__main__":
    sys.exit(main())
