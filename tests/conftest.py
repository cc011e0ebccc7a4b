"""Shared test helpers."""

from __future__ import annotations

import os
import random
import re
import socket
import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings

REPO = Path(__file__).resolve().parent.parent
UPDATE_GOLDEN = os.environ.get("OCTODSL_UPDATE_GOLDEN") == "1"
"""Set OCTODSL_UPDATE_GOLDEN=1 to rewrite golden files from the current output."""

settings.register_profile(
    "octodsl",
    # what the fuzzers of plan text and options always ran; a test whose examples cost much more
    # than a few milliseconds keeps fewer, with the reason beside its @settings
    max_examples=300,
    # each test draws the same examples on every run and machine (seeded from its own source), so
    # what fails in CI fails on a developer's machine too; this also leaves the example database
    # unused. `pytest --hypothesis-profile=default` draws new examples for a search by hand.
    derandomize=True,
    # an example's time says how loaded the machine is (make test's workers and the DeepSpeed
    # launches share its cores), not whether the code is right
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.load_profile("octodsl")


def free_port() -> int:
    """A TCP port free on this machine now, for a launch's --master_port: each launch takes its
    own, so launches on parallel workers (or two test runs) do not meet on DeepSpeed's 29500.

    Drawn at random below the kernel's ephemeral range: a port of that range (what binding port
    0 gives) may be handed to another process's outgoing connection, and gloo's processes on
    the other workers open many, between the draw and the launch binding it (CI once failed so,
    EADDRINUSE)."""
    low = _ephemeral_low()
    draw = random.Random(f"{os.getpid()} {time.perf_counter_ns()}")
    for _ in range(100) if low > _FIRST_PORT + 1000 else ():
        port = draw.randrange(_FIRST_PORT, low)
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
        return port
    with socket.socket() as s:  # no room below the ephemeral range: the kernel's choice
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


_FIRST_PORT = 10_000
"""The lowest port `free_port` draws: above the well-known and most services' registered ones."""


def _ephemeral_low() -> int:
    """The first port of the kernel's ephemeral range (Linux's default 32768)."""
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def versionless(text: str) -> str:
    """`text` with the octodsl version that wrote it (a plan's "(octodsl X.Y.Z)", a JSON
    "octodsl_version") replaced by VERSION: what goldens store, so a release rewrites none. Any
    version, not only this one: a file in examples/ written by an earlier release stays true."""
    from octodsl.version import FIELD

    v = r"\d+\.\d+[^\s)\"]*"
    text = re.sub(rf"\(octodsl {v}\)", "(octodsl VERSION)", text)
    return re.sub(rf'("{FIELD}":\s*"){v}"', r'\1VERSION"', text)


def spec_file(path: Path, model: str, **changes) -> str:
    """Write built-in `model`'s spec (`octodsl models NAME --yaml`) with `changes` to `path`."""
    import subprocess

    import yaml

    text = subprocess.run(
        [str(REPO / ".venv/bin/octodsl"), "models", model, "--yaml"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    path.write_text(yaml.safe_dump({**yaml.safe_load(text), **changes}))
    return str(path)


def check_golden(path: Path, actual: str) -> None:
    """Compare with a golden file (or rewrite it when OCTODSL_UPDATE_GOLDEN=1), the version that
    wrote `actual` replaced by VERSION (`versionless`)."""
    actual = versionless(actual)
    if UPDATE_GOLDEN or not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(actual)
        if not UPDATE_GOLDEN:
            raise AssertionError(f"golden file {path} did not exist; written now, check it in")
    assert actual == path.read_text(), (
        f"output differs from {path} (OCTODSL_UPDATE_GOLDEN=1 to accept)"
    )


@pytest.fixture
def here(tmp_path, monkeypatch):
    """Run in a fresh folder, so that the files' names in messages are short."""
    monkeypatch.chdir(tmp_path)
    return tmp_path


@pytest.hookimpl(tryfirst=True)  # before xdist's own hook reads the groups into the node ids
def pytest_collection_modifyitems(items):
    """A module's tests that share a module-scoped fixture (a DeepSpeed launch, a tuner run, a
    profile) run on one pytest-xdist worker under make test's `--dist loadgroup`, so that the
    fixture is built once rather than once on each worker that draws one of its tests."""
    for item in items:
        fixtures = item._fixtureinfo.name2fixturedefs.values()  # pytest's own record, no API
        if any(defs[-1].scope == "module" for defs in fixtures):
            item.add_marker(pytest.mark.xdist_group(item.module.__name__))


STALE_BUILD_LOCK = 30 * 60
"""Seconds after which a torch extension build's lock file is a leftover: DeepSpeed's CPU
communication op builds in about 90 s. A run killed mid-build leaves the lock behind, and every
later launch then waits on it forever (torch's FileBaton) with no message."""


def pytest_sessionstart(session):
    """Remove torch extension build locks a killed run left behind, saying so, so that the
    DeepSpeed launches build instead of waiting forever."""
    root = Path(
        os.environ.get("TORCH_EXTENSIONS_DIR") or Path.home() / ".cache" / "torch_extensions"
    )
    for lock in root.glob("*/*/lock"):
        try:
            age = time.time() - lock.stat().st_mtime
            if age > STALE_BUILD_LOCK:
                lock.unlink()
                print(f"removed {lock}: a build lock {age / 60:.0f} min old, left by a killed run")
        except OSError:  # another worker removed it first, or it is not ours to remove
            continue
