"""What a benchmark's table says about where it ran (the CPU model and the commit), and the
one way a benchmark writes its tables."""

from __future__ import annotations

import platform
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


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


def write_outputs(script: str, files: dict[Path, str]) -> bool:
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
