"""Lint speed on large plans: writes benchmarks/lint.md.

    .venv/bin/python benchmarks/lint.py [-o benchmarks/lint.md]

In-process times are the best of several runs (timeit's convention on a shared machine); the
command's wall time includes Python start-up and imports, best of three.
"""

from __future__ import annotations

import argparse
import functools
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from machine import check_outputs, write_outputs  # benchmarks/machine.py: run from its folder

from octodsl.gen import generate_text
from octodsl.lint import lint_source

CASES = [
    ("zb-v", 16, 128, None),
    ("interleaved", 16, 128, 2),
    ("1f1b", 16, 128, None),
    ("zb-v", 64, 512, None),
]


def best(fn, runs: int) -> float:
    times = []
    for _ in range(runs):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return min(times)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("-o", "--output", default=str(Path(__file__).with_suffix(".md")))
    args = ap.parse_args()
    if not check_outputs("lint.py", [args.output]):
        return 2
    octodsl = Path(sys.executable).with_name("octodsl")
    rows = []
    for name, p, m, v in CASES:
        text = generate_text(name, devices=p, microbatches=m, chunks=v)
        _, diags = lint_source(text)
        assert not diags, diags
        plan, _ = lint_source(text)
        ops = sum(1 for _ in plan.ops())
        inproc = best(functools.partial(lint_source, text), 5)
        with tempfile.NamedTemporaryFile("w", suffix=".octo", delete=False) as f:
            f.write(text)
        wall = best(lambda: subprocess.run([octodsl, "lint", "-q", f.name], check=True), 3)
        os.unlink(f.name)
        label = (
            f"{name} {p} x {m}"
            + (f", {v} chunks" if v else "")
            + f" ({plan.num_stages // p} stage{'s' * (plan.num_stages > p)} per device)"
        )
        rows.append(f"| {label} | {ops:,} | {inproc * 1e3:,.0f} ms | {wall * 1e3:,.0f} ms |")
        print(rows[-1], flush=True)
    load = os.getloadavg()[0]
    out = [
        "# Lint benchmark",
        "",
        f"Made by `.venv/bin/python benchmarks/lint.py` on {platform.machine()}, Python "
        f"{platform.python_version()}, a 2-core machine (load average {load:.1f} when it ran).",
        "In-process: `lint_source(text)` (parse, lower, every rule incl. the deadlock search), best of 5. "
        "Command: `octodsl lint -q FILE` wall time with start-up and imports, best of 3.",
        "",
        "| plan | ops | in-process | command |",
        "|---|---:|---:|---:|",
        *rows,
        "",
    ]
    return 0 if write_outputs("lint.py", {Path(args.output): "\n".join(out)}) else 2


if __name__ == "__main__":
    sys.exit(main())
