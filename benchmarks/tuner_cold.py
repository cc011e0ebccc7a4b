"""A machine's first `tune`: numba compiles the tuner's kernels on a fresh cache. Each case is
tuned on an empty numba cache (the first run) and again on the cache it filled, with this
checkout and, with `--before REV`, with an older commit checked out beside it (its own empty
cache) to show what the first run did before the compile was left out of the budget.

    .venv/bin/python benchmarks/tuner_cold.py [--before af4f1b4] [-o benchmarks/tuner_cold.md]
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from machine import ROOT, check_outputs, command_line, commit, cpu_model, write_outputs  # noqa: E402

CASES = (("nemotron-h-56b", 8, 16, "60s"), ("nemotron-h-56b", 8, 16, "5s"))
"""(model, devices, micro-batches, --budget), each at 80 GiB per device, dp 8, ZeRO 1, seed 0
(a tuner_levers.md case)."""


def tune(source: Path, cache: Path, case: tuple[str, int, int, str], out: Path) -> dict:
    """One `octodsl tune --json` of `case` with the octodsl of `source` and numba's cache in
    `cache`: its figures and the command's wall time."""
    model, devices, microbatches, budget = case
    env = {**os.environ, "NUMBA_CACHE_DIR": str(cache), "PYTHONPATH": str(source)}
    args = [sys.executable, "-m", "octodsl", "tune", "--model", model, "-p", str(devices)]
    args += ["-m", str(microbatches), "--memory", "80GiB", "--dp", "8", "--zero", "1"]
    args += ["--budget", budget, "--seed", "0", "--json", "-o", str(out)]
    t = time.perf_counter()
    # run in the output's folder: `python -m` puts its folder first on sys.path, before
    # PYTHONPATH, and the octodsl of a checkout it was started in would shadow `source`
    run = subprocess.run(args, env=env, cwd=out.parent, capture_output=True, text=True, check=True)
    wall = time.perf_counter() - t
    figures = json.loads(run.stdout)
    tuner = figures["tuner"]
    return {
        "wall": wall,
        "compile": tuner.get("compile_seconds"),  # None: a commit that does not report it
        "search": tuner["seconds"],
        "plans": tuner["evaluations"],
        "ms": figures["iteration_time"] * 1e3,
    }


def measure(source: Path, label: str, tmp: Path) -> list[dict]:
    rows = []
    for case in CASES:
        cache = Path(tempfile.mkdtemp(dir=tmp))
        for run in ("first run (empty cache)", "second run (cache filled)"):
            print(f"{label}: {case} {run}", file=sys.stderr, flush=True)
            rows.append(
                {"source": label, "case": case, "run": run}
                | tune(source, cache, case, tmp / "t.octo")
            )
    return rows


def _same_packages(rev: str) -> bool:
    """Whether `rev` is a commit whose grammar/ and deepspeed_ext/ are this checkout's: the
    installed octodsl maps octodsl.grammar and octodsl.deepspeed_ext to this checkout's folders
    (setup.cfg's package_dir), which the older octodsl package on PYTHONPATH would import."""

    def git(*args: str) -> int:
        return subprocess.run(["git", *args], cwd=ROOT, capture_output=True).returncode

    if git("rev-parse", "--verify", "--quiet", f"{rev}^{{commit}}") != 0:
        why = "not a commit of this repository"
    elif git("diff", "--quiet", rev, "--", "grammar", "deepspeed_ext") != 0:
        why = "its grammar/ or deepspeed_ext/ differ from this checkout's, which it would import"
    else:
        return True
    print(f"tuner_cold.py: --before {shlex.quote(rev)}: {why}", file=sys.stderr)
    return False


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--before", help="also run this older commit (checked out beside it)")
    ap.add_argument("-o", "--output", type=Path, default=Path("benchmarks/tuner_cold.md"))
    args = ap.parse_args()
    if not check_outputs("tuner_cold.py", [args.output, args.output.with_suffix(".json")]):
        return 2
    if args.before is not None and not _same_packages(args.before):
        return 2
    began = time.perf_counter()
    with tempfile.TemporaryDirectory() as folder:
        tmp = Path(folder)
        rows = []
        if args.before is not None:
            old = tmp / "before"
            subprocess.run(
                ["git", "worktree", "add", "--detach", str(old), args.before],
                cwd=ROOT,
                check=True,
                capture_output=True,
            )
            try:
                rows += measure(old, f"before ({args.before})", tmp)
            finally:
                subprocess.run(
                    ["git", "worktree", "remove", "--force", str(old)], cwd=ROOT, check=True
                )
        rows += measure(ROOT, f"this commit ({commit()})", tmp)
    minutes = (time.perf_counter() - began) / 60
    lines = [
        "# A machine's first `tune`",
        "",
        f"Made by `{command_line('.venv/bin/python benchmarks/tuner_cold.py')}` at commit "
        f"{commit()} on {cpu_model()} ({os.cpu_count()} cores, shared), in {minutes:.0f} min.",
        "",
        "Each case: `octodsl tune --model M -p P -m M --memory 80GiB --dp 8 --zero 1 --seed 0 "
        "--budget B --json`, first with numba's cache in an empty folder (`NUMBA_CACHE_DIR`), "
        "then again with the cache that run filled. `compile s`: what the command reports "
        "compiling before its search (not counted in `--budget`; a blank: the commit does not "
        "report it, and compiles inside the budget); `search s`: the baselines and the tuner; "
        "`wall s`: the whole command.",
        "",
        "| octodsl | case | run | compile s | search s | wall s | plans | tuned ms |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        model, p, m, budget = r["case"]
        compiled = "" if r["compile"] is None else f"{r['compile']:.1f}"
        lines.append(
            f"| {r['source']} | {model} {p}x{m}, --budget {budget} | {r['run']} | {compiled} | "
            f"{r['search']:.1f} | {r['wall']:.1f} | {r['plans']:,} | {r['ms']:,.1f} |"
        )
    text = "\n".join(lines) + "\n"
    files = {args.output: text, args.output.with_suffix(".json"): json.dumps(rows, indent=1)}
    if not write_outputs("tuner_cold.py", files):
        return 2
    print(text, end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
