"""Shared test helpers."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
UPDATE_GOLDEN = os.environ.get("OCTODSL_UPDATE_GOLDEN") == "1"
"""Set OCTODSL_UPDATE_GOLDEN=1 to rewrite golden files from the current output."""


def versionless(text: str) -> str:
    """`text` with the octodsl version that wrote it (a plan's "(octodsl X.Y.Z)", a JSON
    "octodsl_version") replaced by VERSION: what goldens store, so a release rewrites none."""
    from octodsl.version import FIELD, version

    v = re.escape(version())
    text = re.sub(rf"\(octodsl {v}\)", "(octodsl VERSION)", text)
    return re.sub(rf'("{FIELD}":\s*"){v}"', r'\1VERSION"', text)


def check_golden(path: Path, actual: str) -> None:
    """Compare with a golden file (or rewrite it when OCTODSL_UPDATE_GOLDEN=1), the version that
    wrote `actual` replaced by VERSION (`versionless`)."""
    actual = versionless(actual)
    if UPDATE_GOLDEN or not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(actual)
        if not UPDATE_GOLDEN:
            raise AssertionError(f"golden file {path} did not exist; written now, check it in")
    assert actual == path.read_text(), f"output differs from {path} (OCTODSL_UPDATE_GOLDEN=1 to accept)"


@pytest.fixture
def here(tmp_path, monkeypatch):
    """Run in a fresh folder, so that the files' names in messages are short."""
    monkeypatch.chdir(tmp_path)
    return tmp_path
