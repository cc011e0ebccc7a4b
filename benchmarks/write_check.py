"""What writing and checking a tuned plan costs per op: `render_plan` then `lint_source`, as
`tune` and `tune --gpus` do before they write (octodsl/tune/clock.py's CHECK_SECONDS_PER_OP holds
that much of the budget back). Tuned plans compact little, so each case is tuned first.

    .venv/bin/python benchmarks/write_check.py [-o benchmarks/write_check.md]
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from machine import check_outputs, commit, cpu_model, write_outputs  # noqa: E402

CASES = ((8, 512), (16, 256), (8, 128))
"""(devices, micro-batches) of nemotron-h-8b, tuned for 60 plans."""
REPEATS = 3


def measure(devices: int, microbatches: int, folder: Path) -> dict:
    from octodsl.gen import render_plan
    from octodsl.lang import load_plan
    from octodsl.lint import lint_source

    out = folder / f"t{devices}-{microbatches}.octo"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "octodsl",
            "tune",
            "--model",
            "nemotron-h-8b",
            "-p",
            str(devices),
            "-m",
            str(microbatches),
            "--evaluations",
            "60",
            "--budget",
            "10m",
            "-o",
            str(out),
        ],
        check=True,
        capture_output=True,
    )
    plan = load_plan(out)
    ops = sum(len(slot.ops) for slots in plan.schedule for slot in slots)
    best = float("inf")
    for _ in range(REPEATS):
        t = time.perf_counter()
        text = render_plan(plan, title="t")
        lint_source(text, "t.octo")
        best = min(best, time.perf_counter() - t)
    return {
        "devices": devices,
        "microbatches": microbatches,
        "ops": ops,
        "chars": len(text),
        "s": best,
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("-o", "--output", type=Path, default=Path("benchmarks/write_check.md"))
    args = ap.parse_args()
    if not check_outputs("write_check.py", [args.output]):
        return 2
    with tempfile.TemporaryDirectory() as tmp:
        rows = [measure(p, m, Path(tmp)) for p, m in CASES]
    lines = [
        "# Writing and checking a tuned plan",
        "",
        f"Made by `.venv/bin/python benchmarks/write_check.py` at commit {commit()} on "
        f"{cpu_model()} (2 cores, shared); best of {REPEATS} of render_plan + lint_source.",
        "",
        "| nemotron-h-8b, tuned | ops | written | seconds | per op |",
        "|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['devices']} devices x {r['microbatches']} micro-batches | {r['ops']:,} | "
            f"{r['chars'] / 1000:,.0f} KB | {r['s']:.2f} | {r['s'] / r['ops'] * 1e6:.0f} us |"
        )
    text = "\n".join(lines) + "\n"
    if not write_outputs("write_check.py", {args.output: text}):
        return 2
    print(text, end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
