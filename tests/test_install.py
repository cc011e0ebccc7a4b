"""Installs: a non-editable `pip install .` ships the grammar and templates (lint and gen work
from it); the core alone (no extras) lints, simulates and converts, and a command that needs an
extra names it in one line."""

from __future__ import annotations

import configparser
import shutil
import site
import subprocess
import sys
import venv
from pathlib import Path

import pytest
from packaging.requirements import Requirement

from octodsl.extras import EXTRAS, MissingExtra, require

from .conftest import REPO

OPTIONAL = ("numba", "ortools", "torch", "deepspeed", "matplotlib", "transformers")


def _extras() -> dict[str, list[Requirement]]:
    cfg = configparser.ConfigParser()
    cfg.read(REPO / "setup.cfg")
    section = cfg["options.extras_require"]
    return {
        name: [Requirement(line) for line in section[name].splitlines() if line.strip()]
        for name in section
    }


def _core() -> list[str]:
    cfg = configparser.ConfigParser()
    cfg.read(REPO / "setup.cfg")
    return [line for line in cfg["options"]["install_requires"].splitlines() if line.strip()]


def test_setup_cfg_extras_are_the_ones_the_commands_name():
    extras = _extras()
    for name, modules in EXTRAS.items():
        # the import name is the package name for every optional dependency
        assert sorted(r.name for r in extras[name]) == sorted(modules), name
    (everything,) = extras["all"]
    assert everything.name == "octodsl" and everything.extras == set(EXTRAS)
    core = {Requirement(line).name.lower() for line in _core()}
    assert core == {"lark", "pydantic", "jinja2", "rich", "numpy", "scipy", "pyyaml"}
    assert not core & set(OPTIONAL)


def test_require_names_the_missing_modules_and_their_extras(monkeypatch):
    require("tune", "numba", "ortools")  # the test environment has every extra: nothing to say
    monkeypatch.setattr(
        "octodsl.extras.installed", lambda m: m not in ("numba", "deepspeed", "matplotlib")
    )
    require("profile", "torch")
    with pytest.raises(
        MissingExtra, match=r"^calibrate needs deepspeed: pip install 'octodsl\[run\]'$"
    ):
        require("calibrate", "torch", "deepspeed")
    with pytest.raises(
        MissingExtra, match=r"^x needs numba and matplotlib: pip install 'octodsl\[tune,plot\]'$"
    ):
        require("x", "numba", "ortools", "matplotlib")


def _wheel(tmp_path: Path) -> Path:
    """octodsl's wheel, built from a copy of the working tree with this environment's setuptools
    (no download)."""
    src = tmp_path / "src"
    shutil.copytree(
        REPO,
        src,
        ignore=shutil.ignore_patterns(
            ".venv", ".git", "build", "*.egg-info", "__pycache__", ".hypothesis", "out"
        ),
    )
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "-q",
            "--no-deps",
            "--no-build-isolation",
            "-w",
            str(tmp_path / "dist"),
            str(src),
        ],
        check=True,
        cwd=tmp_path,
    )
    (wheel,) = (tmp_path / "dist").glob("octodsl-*.whl")
    return wheel


def _fresh_venv(tmp_path: Path) -> tuple[Path, Path]:
    """A new virtual environment: its directory and its python."""
    env_dir = tmp_path / "venv"
    venv.create(env_dir, with_pip=True)
    return env_dir, env_dir / "bin" / "python"


@pytest.mark.slow
def test_non_editable_install_can_lint_and_gen(tmp_path):
    env_dir, py = _fresh_venv(tmp_path)
    # Dependencies come from the test's own environment (appended after the fresh venv's
    # site-packages, so the installed octodsl, not the working tree, is what gets imported).
    purelib = subprocess.check_output(
        [py, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], text=True
    ).strip()
    deps = [p for p in site.getsitepackages() if "site-packages" in p]
    (Path(purelib) / "deps.pth").write_text("\n".join(deps) + "\n")
    wheel = _wheel(tmp_path)
    subprocess.run(
        [py, "-m", "pip", "install", "-q", "--no-deps", str(wheel)], check=True, cwd=tmp_path
    )
    octodsl = env_dir / "bin" / "octodsl"
    where = subprocess.check_output(
        [py, "-c", "import octodsl; print(octodsl.__file__)"], text=True, cwd=tmp_path
    )
    assert str(env_dir) in where
    plan = tmp_path / "zbv.octo"
    subprocess.run(
        [octodsl, "gen", "zb-v", "--devices", "4", "--microbatches", "8", "-o", str(plan)],
        check=True,
        cwd=tmp_path,
    )
    out = subprocess.run([octodsl, "lint", str(plan)], capture_output=True, text=True, cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().endswith("ok")


@pytest.mark.slow
def test_the_core_alone_lints_simulates_and_converts(tmp_path):
    """`pip install octodsl` with no extras: pip resolves the wheel's own requirements (from the
    configured package index), and none of the optional dependencies comes with them."""
    env_dir, py = _fresh_venv(tmp_path)
    wheel = _wheel(tmp_path)
    subprocess.run([py, "-m", "pip", "install", "-q", str(wheel)], check=True, cwd=tmp_path)
    for module in OPTIONAL:
        gone = subprocess.run(
            [py, "-c", f"import {module}"], capture_output=True, text=True, cwd=tmp_path
        )
        assert gone.returncode != 0, f"{module} came with the core install"

    def octodsl(*argv: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            [env_dir / "bin" / "octodsl", *argv],
            capture_output=True,
            text=True,
            cwd=tmp_path,
            timeout=300,
        )

    for argv in (
        ["gen", "zb-h1", "--model", "nemotron-h-8b", "-p", "4", "-m", "8", "-o", "p.octo"],
        ["lint", "p.octo"],
        ["fmt", "--check", "p.octo"],
        ["simulate", "p.octo", "--trace", "p.trace.json"],
        ["convert", "p.octo", "--to", "torch", "-o", "p.csv"],
        ["convert", "p.octo", "--to", "deepspeed", "-o", "p_ds.py"],
        ["convert", "p.csv", "-o", "back.octo"],
        ["models", "nemotron-h-8b"],
        ["devices"],
        ["completion", "bash"],
        # the simulated trace stands in for a measured one; no picture without matplotlib
        ["compare", "p.octo", "--trace", "p.trace.json"],
    ):
        done = octodsl(*argv)
        assert done.returncode == 0, (argv, done.stderr)
    assert (tmp_path / "p.trace.json").stat().st_size > 0
    assert (tmp_path / "p.csv").read_text().strip()
    assert (tmp_path / "p.trace.compare.json").exists() and not (
        tmp_path / "p.trace.compare.png"
    ).exists()
    for argv, line in (
        (
            ["tune", "--model", "nemotron-h-8b", "-p", "4", "-m", "8", "-o", "t.octo"],
            "tune needs numba and ortools: pip install 'octodsl[tune]'",
        ),
        (
            ["simulate", "p.octo", "--png", "p.png"],
            "simulate --png needs matplotlib: pip install 'octodsl[plot]'",
        ),
        (
            ["compare", "p.octo", "--trace", "p.trace.json", "--png", "c.png"],
            "compare --png needs matplotlib: pip install 'octodsl[plot]'",
        ),
        (
            ["profile", "--model", "nemotron-h-8b"],
            "profile needs torch: pip install 'octodsl[run]'",
        ),
    ):
        done = octodsl(*argv)
        assert (done.returncode, done.stderr) == (2, f"octodsl: error: {line}\n"), argv
    assert not any((tmp_path / name).exists() for name in ("t.octo", "p.png", "c.png"))
