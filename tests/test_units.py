import pytest
from hypothesis import given
from hypothesis import strategies as st

from octodsl.units import exact_size, parse_size, size


def test_parse_size():
    assert parse_size("1.5TB") == 1_500_000_000_000
    assert parse_size("512MiB") == 512 * 2**20
    assert parse_size(" 80GiB ") == 80 * 2**30
    assert parse_size("1234") == 1234
    with pytest.raises(ValueError):
        parse_size("80 gigs")


@pytest.mark.parametrize(
    "nbytes, spelled",
    [
        (80 << 30, "80GiB"),
        (80 * 10**9, "80GB"),
        (3 << 20, "3MiB"),
        (1 << 40, "1TiB"),
        (1500, "1500"),
        (2000, "2KB"),
    ],
)
def test_exact_size_is_the_shortest_exact_spelling(nbytes, spelled):
    assert exact_size(nbytes) == spelled


@given(st.integers(min_value=0, max_value=2**50))
def test_exact_size_reads_back(nbytes):
    assert parse_size(exact_size(nbytes)) == nbytes


@pytest.mark.parametrize(
    "nbytes, digits, shown",
    [
        (79.5 * 2**30, 1, "79.5 GiB"),
        (38.6 * 2**20, 1, "38.6 MiB"),
        (20 * 2**30, 2, "20.00 GiB"),
        (1536, 2, "1.50 KiB"),
        (100, 1, "100 B"),
        (3 * 2**40, 1, "3.0 TiB"),
    ],
)
def test_size_rounds_in_the_largest_unit_reached(nbytes, digits, shown):
    assert size(nbytes, digits) == shown
