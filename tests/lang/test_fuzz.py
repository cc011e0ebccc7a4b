"""Random and mutated input never escapes as an exception: always diagnostics with a position."""

from __future__ import annotations

from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from octodsl.lint import lint_source

SEED = (Path(__file__).parent / "golden" / "messy.octo").read_text()
TOKENS = ["plan", "{", "}", "device", "stages", "stage", "layers", "..", ":", "F0:1", "B", "W1:",
          "BW", "(", ")", "&", "for", "in", "i", "+", "*", "-", "#", "\n", '"', "80GiB", "12", ","]


def _check(src: str) -> None:
    _, diags = lint_source(src, "fuzz.octo")
    for d in diags:
        text = d.render("fuzz.octo", src)
        assert text.startswith("fuzz.octo")
        if d.code.startswith("E1"):  # syntax errors always point somewhere
            assert d.span is not None and d.span.line >= 1 and d.span.col >= 1


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=200))
def test_random_text(src):
    _check(src)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.sampled_from(TOKENS), max_size=60).map(" ".join))
def test_random_tokens(src):
    _check(src)


@settings(max_examples=300, deadline=None)
@given(st.data())
def test_mutated_plan(data):
    src = SEED
    for _ in range(data.draw(st.integers(1, 4))):
        i = data.draw(st.integers(0, len(src)))
        j = data.draw(st.integers(i, min(len(src), i + 8)))
        insert = data.draw(st.sampled_from(TOKENS + [""]))
        src = src[:i] + insert + src[j:]
    _check(src)
