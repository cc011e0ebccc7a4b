"""An op's text form: `Op.label` writes it, `Op.parse` reads it back, and nothing else does."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from octodsl.errors import OctoError
from octodsl.plan import Op, OpKind, PlanError

ops = st.builds(
    Op, st.sampled_from(list(OpKind)), st.integers(0, 10**12 - 1), st.integers(0, 10**12 - 1)
)


def test_label_is_the_plans_spelling():
    assert Op(OpKind.F, 3, 5).label == "F3:5"
    assert Op(OpKind.BW, 0, 2).label == "BW0:2"
    assert str(Op(OpKind.W, 12, 0)) == "W12:0"


@given(ops)
def test_parse_reads_back_every_label(op):
    assert Op.parse(op.label) == op


@given(st.text(alphabet="FBWX0123456789:+-_ .٣", max_size=9))
def test_what_parse_accepts_is_a_label(text):
    # Exactly one spelling per op: whatever parses is the label of what it parses to.
    try:
        op = Op.parse(text)
    except PlanError:
        return
    assert op.label == text


@pytest.mark.parametrize(
    "junk",
    [
        "",
        "F",
        "F3",
        "F3:",
        ":5",
        "X3:5",
        "f3:5",
        "BWW3:5",
        "F 3:5",
        "F3: 5",
        " F3:5",
        "F3:5\n",
        "F+3:5",
        "F-1:5",
        "F03:5",
        "F3:05",
        "F3_0:5",
        "F1e3:5",
        "F٣:5",
        "F3:٥",
        "F3:5:1",
        "F3.0:5",
        "F1234567890123:0",
    ],
)
def test_parse_refuses_anything_else_with_a_clear_error(junk):
    with pytest.raises(PlanError, match="is not an op: write the kind") as info:
        Op.parse(junk)
    assert repr(junk) in str(info.value) and isinstance(info.value, OctoError)
