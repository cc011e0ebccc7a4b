"""fastparse's tree is lark's: on every plan of the repository and on generated plans written
with random spacing, comments and parentheses; and it gives up where lark reports an error."""

from __future__ import annotations

from pathlib import Path
from unittest import mock

import pytest
from hypothesis import given
from hypothesis import strategies as st

from octodsl.gen import generate_text
from octodsl.lang import fastparse, parser
from octodsl.lang.errors import PlanSyntaxError

ROOT = Path(__file__).resolve().parents[2]
PLANS = sorted(p for p in ROOT.glob("**/*.octo") if ".venv" not in p.parts)


def lark_tree(source: str):
    with mock.patch.object(fastparse, "parse", lambda s: None):
        return parser.parse_syntax(source)


def check(source: str, *, fast_reads: bool = True) -> None:
    """fastparse gives lark's tree or gives up (always where lark finds an error); with
    `fast_reads`, the text is one it reads (a spaced-out op such as `F0:1 + 2` is left to lark)."""
    try:
        ref = lark_tree(source)
    except PlanSyntaxError:
        assert fastparse.parse(source) is None  # an error: lark's path words it
        return
    fast = fastparse.parse(source)
    if fast is None:
        assert not fast_reads, "a plan fastparse should read"
        return
    assert parser._with_layout(fast, source) == ref  # spans included (dataclass equality)


@pytest.mark.parametrize("path", PLANS, ids=lambda p: str(p.relative_to(ROOT)))
def test_the_repository_plans(path):
    check(path.read_text(encoding="utf-8", errors="replace").removeprefix("\ufeff"))


_SPACES = st.sampled_from([" ", "  ", "\n", " # note\n", "\t", "\r\n"])


@given(st.sampled_from(["1f1b", "zb-v", "interleaved", "zb-h1", "dualpipev"]), st.data())
def test_generated_plans_respaced(name, data):
    text = generate_text(
        name, devices=2, microbatches=4, chunks=2 if name == "interleaved" else None
    )
    pieces = text.split(" ")
    out = pieces[0] + "".join(data.draw(_SPACES) + p for p in pieces[1:])
    # a range or index now and then in parentheses, or with a sum, as people write them
    out = out.replace(
        ":3", data.draw(st.sampled_from([":3", ":(3)", ":(1+2)", ":1 + 2", ":( 3 )"]))
    )
    check(out, fast_reads=" + " not in out)


@given(st.text(alphabet='plan"x{}devices 12microbatchesF0:.()+-*#\n', max_size=120))
def test_random_text(source):
    check(source, fast_reads=False)
