"""What both tune commands (`octodsl tune`, octodsl.cli.tune, and its whole-cluster search,
octodsl.cli.tune_cluster) take alike: the memory limit per device and the progress line."""

from __future__ import annotations

from typing import TYPE_CHECKING

from .. import limits
from .common import integer, memory_size

if TYPE_CHECKING:  # imported where used, to keep the command line quick to start
    from rich.live import Live

NO_LIMIT = "none"
EVALUATIONS = integer(1, limits.MAX_EVALUATIONS)
"""--evaluations' type."""
SEARCHES = integer(1, limits.MAX_SEARCHES)
"""--searches' type."""
JOBS = integer(1, limits.MAX_JOBS)
"""--jobs' type."""


def searches(args) -> int:
    """How many searches the tuner runs at most: --searches, else the tuner's default."""
    from ..tune.pipeline.loop import RESTARTS

    return RESTARTS if args.searches is None else args.searches


def jobs(args) -> int:
    """How many searches the tuner runs at once: --jobs, else one."""
    return 1 if args.jobs is None else args.jobs


def memory_option(text: str) -> int | str:
    """--memory's type: a size, or NO_LIMIT."""
    return NO_LIMIT if text.strip().lower() == NO_LIMIT else memory_size(text)


def memory_limit(args, own: int | None = None) -> int | None:
    """The memory limit per device: --memory's size (None for 'none'); else `own` (a --from
    plan's), else the --device's memory. OctoError for an unknown device."""
    from ..costs.devices import get_device

    if args.memory is None:
        return own if own is not None else get_device(args.device).memory
    return None if args.memory == NO_LIMIT else args.memory


class ProgressLine:
    """The search's phase, best iteration time so far and time left, on standard error while
    it runs (only on a terminal)."""

    def __init__(self, budget: float, enabled: bool) -> None:
        from rich.console import Console

        self.console = Console(stderr=True)
        self.enabled = enabled and self.console.is_terminal
        self.budget = budget
        self.live: Live | None = None

    def __enter__(self):
        if self.enabled:
            from rich.live import Live

            self.live = Live(console=self.console, transient=True, refresh_per_second=8)
            self.live.__enter__()
        return self if self.enabled else None

    def __call__(self, phase: str, best: float, left: float) -> None:
        from rich.text import Text

        best_text = "-" if best == float("inf") else f"{best * 1e3:,.1f} ms"
        assert self.live is not None, "the search reports progress only when it is shown"
        self.live.update(
            Text(
                f"tuning: {phase:<10} best {best_text:>12}   {max(left, 0.0):5.1f} s left",
                style="cyan",
            )
        )

    def __exit__(self, *exc) -> None:
        if self.live is not None:
            self.live.__exit__(*exc)
