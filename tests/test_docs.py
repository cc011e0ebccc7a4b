"""The examples the docs show are real: they lint clean."""

from __future__ import annotations

import re

from octodsl.lint import lint_source

from .conftest import REPO


def test_readme_plan_lints_clean():
    blocks = re.findall(r"```octo\n(.*?)```", (REPO / "README.md").read_text(), re.S)
    assert blocks
    for block in blocks:
        _, diags = lint_source(block, "README.md")
        assert diags == [], "\n".join(d.render("README.md", block) for d in diags)
