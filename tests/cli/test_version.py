"""`octodsl --version`, and `python -m octodsl` behaving exactly as the `octodsl` command."""

from __future__ import annotations

import importlib.metadata
import os
import subprocess
import sys
from pathlib import Path

import pytest

import octodsl
from octodsl import version as version_module
from octodsl.version import version

OCTODSL = Path(sys.executable).with_name("octodsl")
"""The console script pip installed beside this interpreter."""


def _run(argv: list[str], how: str) -> subprocess.CompletedProcess:
    command = [str(OCTODSL)] if how == "script" else [sys.executable, "-m", "octodsl"]
    return subprocess.run(
        command + argv,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "COLUMNS": "100"},
    )


def test_installed_version_is_the_source_version():
    # setup.cfg reads its version from octodsl.__version__: an install made from this tree
    # reports the same string (reinstall, `make venv`, after changing it)
    assert importlib.metadata.version("octodsl") == octodsl.__version__ == version()


def test_version_falls_back_to_the_source_when_not_installed(monkeypatch):
    def missing(name):
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(importlib.metadata, "version", missing)
    version.cache_clear()
    try:
        assert version_module.version() == octodsl.__version__
    finally:
        version.cache_clear()


@pytest.mark.parametrize("how", ["script", "module"])
def test_version_option(how):
    if how == "script" and not OCTODSL.exists():
        pytest.skip("octodsl is not installed beside this interpreter")
    done = _run(["--version"], how)
    assert (done.returncode, done.stdout, done.stderr) == (0, f"octodsl {version()}\n", "")


@pytest.mark.parametrize(
    "argv, code, message",
    [
        (["lint"], 2, "octodsl: error: the following arguments are required: FILE"),
        (["lint", "/no/such/plan.octo"], 2, "octodsl: error: /no/such/plan.octo: no such file"),
        (["completion", "fish"], 2, "octodsl: error: SHELL: invalid choice: 'fish'"),
    ],
)
def test_python_m_is_the_command(argv, code, message):
    """Same exit status, standard output and standard error both ways: usage errors and an error
    the command finds (--version: test_version_option)."""
    if not OCTODSL.exists():
        pytest.skip("octodsl is not installed beside this interpreter")
    script, module = _run(argv, "script"), _run(argv, "module")
    assert (module.returncode, module.stdout, module.stderr) == (
        script.returncode,
        script.stdout,
        script.stderr,
    )
    assert script.returncode == code, script.stderr
    assert "Traceback" not in script.stderr
    assert script.stderr.startswith(message), script.stderr


def test_version_imports_no_command():
    """--version answers before any command module (some load numba or torch) is imported."""
    code = (
        "import sys\n"
        "from octodsl.cli import main\n"
        "try:\n    main(['--version'])\nexcept SystemExit as e:\n    assert e.code == 0\n"
        "heavy = sorted(m for m in sys.modules if m.startswith(('octodsl.lint', 'octodsl.sim',"
        " 'octodsl.cli.simulate', 'torch', 'numba')))\n"
        "print(heavy)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [f"octodsl {version()}", "[]"]
