"""What a benchmark's table says about where it ran (the CPU model and the commit), and the
one way a benchmark writes its tables: `check_outputs` before any work (a benchmark runs for up
to half an hour; a typo in -o must not cost that), `write_outputs` at the end (atomically)."""

from __future__ import annotations

import argparse
import os
import platform
import shlex
import subprocess
import sys
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

MAX_JOBS = 64
"""The most cases `--jobs` runs at once (each its own process)."""


def add_jobs(ap: argparse.ArgumentParser, default: int) -> None:
    """`--jobs N`: cases run at once, each in its own process on one core (1 to MAX_JOBS)."""
    from octodsl.cli.common import integer

    ap.add_argument(
        "--jobs",
        type=integer(1, MAX_JOBS),
        default=default,
        help="cases run at once, one core each",
    )


def one_thread_each() -> None:
    """Before any case's process starts: the numerical libraries and numba run one thread
    each, so that `--jobs` cases share the cores one each and a case's wall-time budget buys
    it the same work whatever the machine's core count."""
    for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS", "NUMBA_NUM_THREADS"):
        os.environ[var] = "1"


def command_line(runner: str) -> str:
    """The command that made a table: `runner` (the interpreter and script) and this run's
    arguments, quoted as a shell reads them back (an empty argument as '')."""
    return " ".join([runner, *map(shlex.quote, sys.argv[1:])])


def cpu_model() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor() or "unknown"


def commit() -> str:
    return (
        subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True
        ).stdout.strip()
        or "unknown"
    )


def table_head(columns: Sequence[str]) -> list[str]:
    """A markdown table's head: the column names, then the rule under them."""
    return ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]


def check_outputs(
    script: str,
    files: Iterable[str | Path],
    folders: Iterable[str | Path] = (),
    inputs: Iterable[str | Path] = (),
) -> bool:
    """Before any work: whether each of `files` can be written (octodsl.fileio.unwritable: its
    folder exists and is writable, the path is no folder and no read-only file) without
    replacing one of the run's `inputs`, and each of `folders` made and written into; if not,
    say why in one line, as `script` (its name), and return False (the benchmark then exits
    with status 2)."""
    from octodsl.fileio import unwritable, unwritable_folder

    files = list(files)
    read = {os.path.realpath(p) for p in inputs}
    clashes = [
        f"cannot write {f}: it is an input of this run"
        for f in files
        if os.path.realpath(f) in read
    ]
    for why in [*clashes, *map(unwritable, files), *map(unwritable_folder, folders)]:
        if why:
            print(f"{script}: {why}", file=sys.stderr)
            return False
    return True


def write_outputs(script: str, files: Mapping[Path, str | bytes]) -> bool:
    """Write each file atomically; on failure say which in one line, as `script` (its name),
    and return False."""
    from octodsl.fileio import write_atomic

    for path, text in files.items():
        try:
            write_atomic(path, text)
        except OSError as e:
            print(f"{script}: cannot write {path}: {e.strerror or e}", file=sys.stderr)
            return False
    return True
