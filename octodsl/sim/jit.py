"""`njit`: numba's compiler when numba is installed, else the plain function.

The simulator's loops are written once, over numpy arrays. With numba they run compiled (the
machine code is cached on disk, so only the first run on a machine pays for compiling); without
it the same code runs as Python, correct but about a hundred times slower.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

# numba's compiler, called with its private `_nrt` option (absent from numba's stubs), or None.
_numba_njit: Callable[..., Any] | None
try:
    from numba import njit as _numba_njit
except ImportError:  # pragma: no cover - depends on the environment
    _numba_njit = None

JIT = _numba_njit is not None


def njit(fn=None, *, refcounts: bool = True, inline: bool = False):
    """Compile `fn` (cached on disk). refcounts=False compiles it without numba's reference
    counting, for a function that allocates nothing and keeps none of the arrays it is given:
    numba counts a reference for each array a call passes or reads out of a tuple, which for
    the list scheduler's small per-decision functions was half of its time. inline=True has
    numba inline `fn` where it is called (its IR, before compiling): a compiled call passes
    named tuples of arrays by value, a few hundred words for the fill model's, which LLVM
    copies for each call of a function it does not inline itself (the same operations run,
    so the same results)."""
    if fn is None:
        return lambda f: njit(f, refcounts=refcounts, inline=inline)
    if _numba_njit is None:  # JIT is False
        return fn
    return _numba_njit(
        cache=True, nogil=True, _nrt=refcounts, inline="always" if inline else "never"
    )(fn)


def seconds_compiling(
    run: Callable[[], object], on_compile: Callable[[], None] | None = None
) -> float:
    """Call `run` and return the seconds numba spent compiling kernels in it: 0 where every
    kernel it called came from the disk cache or was compiled before in this process (and
    without numba). A compile that calls for others counts once. `on_compile` is called when
    the first compile starts (a progress display: compiling takes tens of seconds)."""
    if _numba_njit is None:
        run()
        return 0.0
    from numba.core.event import TimingListener, install_listener

    class Timer(TimingListener):
        def on_start(self, event):
            if on_compile is not None and self._depth == 0 and not self.done:
                on_compile()
            super().on_start(event)

    timer = Timer()
    with install_listener("numba:compile", timer):
        run()
    return timer.duration if timer.done else 0.0
