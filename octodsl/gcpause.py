"""Pausing the cyclic garbage collector while a large structure is built.

A plan at the op limit is millions of small objects (ops, slots, edges); the collector's passes
over them while they are built cost as much as building them, and none of them is garbage yet.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def paused_collection() -> Iterator[None]:
    collecting = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if collecting:
            gc.enable()
