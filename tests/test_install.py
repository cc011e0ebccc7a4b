"""A non-editable `pip install .` ships the grammar and templates: lint and gen work from it."""

from __future__ import annotations

import shutil
import site
import subprocess
import sys
import venv

import pytest

from .conftest import REPO


@pytest.mark.slow
def test_non_editable_install_can_lint_and_gen(tmp_path):
    src = tmp_path / "src"
    shutil.copytree(REPO, src, ignore=shutil.ignore_patterns(".venv", ".git", "build", "*.egg-info",
                                                             "__pycache__", ".hypothesis", "out"))
    env_dir = tmp_path / "venv"
    venv.create(env_dir, with_pip=True)
    py = env_dir / "bin" / "python"
    # Dependencies come from the test's own environment (appended after the fresh venv's
    # site-packages, so the installed octodsl, not the working tree, is what gets imported).
    purelib = subprocess.check_output([py, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                                      text=True).strip()
    deps = [p for p in site.getsitepackages() if "site-packages" in p]
    (tmp_path / "venv" / purelib.split(str(env_dir) + "/", 1)[1] / "deps.pth").write_text("\n".join(deps) + "\n")
    # Build the wheel with this environment's setuptools (no download), install it alone.
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
                    "-w", str(tmp_path / "dist"), str(src)], check=True, cwd=tmp_path)
    (wheel,) = (tmp_path / "dist").glob("octodsl-*.whl")
    subprocess.run([py, "-m", "pip", "install", "-q", "--no-deps", str(wheel)], check=True, cwd=tmp_path)
    octodsl = env_dir / "bin" / "octodsl"
    where = subprocess.check_output([py, "-c", "import octodsl; print(octodsl.__file__)"], text=True, cwd=tmp_path)
    assert str(env_dir) in where
    plan = tmp_path / "zbv.octo"
    subprocess.run([octodsl, "gen", "zb-v", "--devices", "4", "--microbatches", "8", "-o", str(plan)],
                   check=True, cwd=tmp_path)
    out = subprocess.run([octodsl, "lint", str(plan)], capture_output=True, text=True, cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().endswith("ok")
