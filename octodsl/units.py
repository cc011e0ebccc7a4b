"""Byte sizes as people write and read them: `parse_size('80GiB')`, the exact spelling a plan
file keeps (`exact_size`) and the rounded one reports print (`size`); and times in reports
(`milliseconds`)."""

from __future__ import annotations

import math
import re
from fractions import Fraction

_UNITS = {
    "B": 1,
    "KB": 10**3,
    "MB": 10**6,
    "GB": 10**9,
    "TB": 10**12,
    "KiB": 2**10,
    "MiB": 2**20,
    "GiB": 2**30,
    "TiB": 2**40,
}

_EXACT_ORDER = ("TiB", "GiB", "MiB", "KiB", "TB", "GB", "MB", "KB")
"""Of two spellings as short, the first here wins."""


_SIZE = re.compile(r"\s*([0-9]+(?:\.[0-9]*)?|\.[0-9]+)\s*(" + "|".join(_UNITS) + r")?\s*")
"""A plain decimal number (no sign, exponent, nan or inf) and an optional unit."""


def parse_size(text: str) -> int:
    """'80GiB' -> bytes, rounded to a whole byte; '1.5GB' and a plain number too. ValueError
    for anything else, negative sizes included; no upper bound (the caller has one)."""
    m = _SIZE.fullmatch(text) if len(text) <= 64 else None
    if m is None:
        raise ValueError(f"cannot read {text.strip()[:64]!r} as a size (e.g. 80GiB, 512MB, 1024)")
    number, unit = m.groups()
    # Exact arithmetic: a float would round 1.1TB, and overflow on a long number.
    return round(Fraction(number) * _UNITS[unit or "B"])


def exact_size(nbytes: int) -> str:
    """The shortest exact spelling, as a plan file writes it: 80 GiB as `80GiB`, a device's
    80 GB as `80GB`, else the plain number."""
    exact = [
        f"{nbytes // _UNITS[unit]}{unit}" for unit in _EXACT_ORDER if nbytes % _UNITS[unit] == 0
    ]
    return min(exact, key=len, default=str(nbytes))


def size(nbytes: float, digits: int = 1) -> str:
    """Rounded, in the largest binary unit it reaches: `79.5 GiB`, `38.6 MiB`."""
    for unit in ("TiB", "GiB", "MiB", "KiB"):
        if abs(nbytes) >= _UNITS[unit]:
            return f"{nbytes / _UNITS[unit]:.{digits}f} {unit}"
    return f"{nbytes:g} B"


def milliseconds(seconds: float) -> str:
    """'1,336.1 ms': one decimal from 10 ms on, four significant digits below (small models'
    iterations); 'inf' for an infinite time."""
    if math.isinf(seconds):
        return "inf"
    ms = seconds * 1e3
    return f"{ms:,.1f} ms" if ms >= 10 else f"{ms:.4g} ms"
