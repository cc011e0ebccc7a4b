"""docs/language.md lists every bound of octodsl.limits, with its value, under "Limits" (the
heading the refusals' messages point to)."""

from __future__ import annotations

import re

from octodsl import limits

from .conftest import REPO


def documented() -> dict[str, int]:
    text = (REPO / "docs" / "language.md").read_text()
    section = text.split("\n## Limits\n", 1)[1].split("\n## ", 1)[0]
    rows = re.findall(r"^\| `([A-Z_]+)` \| ([0-9,]+) \|", section, re.M)
    return {name: int(value.replace(",", "")) for name, value in rows}


def test_the_doc_lists_every_limit_with_its_value():
    constants = {
        name: value
        for name, value in vars(limits).items()
        if name.isupper() and isinstance(value, int)
    }
    assert documented() == constants


def test_refusals_point_to_the_section():
    path, anchor = limits.LIMITS_DOC.split("#")
    assert (REPO / path).read_text().count(f"\n## {anchor.capitalize()}\n") == 1
    assert (
        limits.at_most(limits.MAX_DEVICES, "devices")
        == "at most 4096 devices (docs/language.md#limits)"
    )
    assert (
        limits.at_most(limits.MAX_OPS, "ops") == "at most 1,000,000 ops (docs/language.md#limits)"
    )
