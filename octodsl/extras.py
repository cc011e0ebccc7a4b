"""The optional dependencies, by the setup.cfg extra that installs them, and the one error a
command raises when one it needs is missing.

`pip install octodsl` brings what lint, fmt, gen, convert, simulate, models and devices need;
the commands that need more call `require` before doing anything, so that the user reads which
extra to install, not an ImportError. tests/test_install.py checks these lists against
setup.cfg's.
"""

from __future__ import annotations

from importlib.util import find_spec

from .errors import OctoError

EXTRAS: dict[str, tuple[str, ...]] = {
    # the search simulates thousands of plans (numba compiles the simulator; without it the
    # budget buys a hundredth of the search) and fits partitions with CP-SAT (ortools)
    "tune": ("numba", "ortools"),
    # the executor and the profiler: torch layers, run under DeepSpeed's pipeline engine
    "run": ("torch", "deepspeed"),
    "plot": ("matplotlib",),
    "hf": ("transformers",),
}
"""Each extra's top-level modules (setup.cfg's [options.extras_require] names their packages)."""

_EXTRA_OF = {module: extra for extra, modules in EXTRAS.items() for module in modules}


class MissingExtra(OctoError):
    """An optional dependency a command needs is not installed."""


def installed(module: str) -> bool:
    """Whether `module` (top-level) can be imported; finds it without importing it."""
    return find_spec(module) is not None


def require(what: str, *modules: str) -> None:
    """Raise MissingExtra, naming the extra(s) to install, when any of `modules` (each one of
    EXTRAS') is missing. `what` is what needs them: a command, or a command and option."""
    missing = [m for m in modules if not installed(m)]
    if missing:
        extras = ",".join(dict.fromkeys(_EXTRA_OF[m] for m in missing))
        raise MissingExtra(f"{what} needs {' and '.join(missing)}: pip install 'octodsl[{extras}]'")
