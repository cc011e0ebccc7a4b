"""Every diagnostic code octodsl can report is listed in docs/diagnostics.md, every listed code
is one octodsl reports, and each is named by some test."""

from __future__ import annotations

import re

from ..conftest import REPO

CODE = re.compile(r'"([EW][0-9]{3})"')


def documented() -> set[str]:
    text = (REPO / "docs" / "diagnostics.md").read_text()
    return set(re.findall(r"^\| ([EW][0-9]{3}) \|", text, re.M))


def reported() -> set[str]:
    return {c for p in (REPO / "octodsl").rglob("*.py") for c in CODE.findall(p.read_text())}


def test_every_code_is_documented_and_every_documented_code_exists():
    assert reported() - documented() == set(), "codes missing from docs/diagnostics.md"
    assert documented() - reported() == set(), "docs/diagnostics.md lists codes nothing reports"


def test_every_code_has_a_test():
    tests = "\n".join(p.read_text() for p in (REPO / "tests").rglob("*.py")
                      if p.name != "test_codes.py")
    assert {c for c in documented() if c not in tests} == set()
