"""parse_size reads exactly what a size can be: a plain decimal number and a unit, exactly
(no float rounding, no overflow); anything else is a ValueError with a message, never another
exception (it was an OverflowError for 'infGiB', a bare int() error for '-1GiB')."""

from __future__ import annotations

from fractions import Fraction

import pytest
from hypothesis import given
from hypothesis import strategies as st

from octodsl.units import _UNITS, parse_size


@given(st.text(max_size=40))
def test_any_text_is_a_size_or_a_value_error(text):
    try:
        value = parse_size(text)
    except ValueError as e:
        assert "cannot read" in str(e)
    else:
        assert isinstance(value, int) and value >= 0


@given(
    st.decimals(min_value=0, max_value=10**6, places=3, allow_nan=False),
    st.sampled_from(sorted(_UNITS)),
)
def test_decimal_sizes_are_exact(number, unit):
    assert parse_size(f"{number}{unit}") == round(Fraction(str(number)) * _UNITS[unit])


@pytest.mark.parametrize(
    "text", ["-1GiB", "nanGiB", "infGiB", "1e3", "1e400GiB", "0x10", "1,5GB", "GiB", "", "9" * 70]
)
def test_not_sizes(text):
    with pytest.raises(ValueError, match="cannot read"):
        parse_size(text)


def test_exact_where_a_float_is_not():
    assert parse_size("1.1TB") == 1_100_000_000_000
    assert parse_size("9" * 40 + "TiB") == int("9" * 40) * 2**40
