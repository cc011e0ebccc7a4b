"""Turn a communication hang or a lost peer into one line: a rank that waits longer than the
timeout, or whose peer's connection closes (the peer's process died), prints what it waited for
and from whom, and the process exits non-zero without a traceback (the launcher then stops the
job).

Every rank runs its own clock, so in a real hang each stuck rank reports its own wait.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta

import torch.distributed as dist

EXIT_CODE = 3
DEFAULT_TIMEOUT = 300.0
"""Seconds a rank may wait on one message before the watchdog stops the job."""

_CLOSED = ("Connection closed by peer", "Connection reset by peer", "Broken pipe")
"""How gloo words a connection whose other end has gone."""


def lost_peer(error: BaseException) -> bool:
    """Whether a communication error says that the other side's process is gone."""
    return isinstance(error, RuntimeError) and any(text in str(error) for text in _CLOSED)


class Watchdog:
    def __init__(self, timeout: float, whoami: str):
        self.timeout = timeout
        self.whoami = whoami
        self.last_done = "nothing yet"
        """The last op this rank finished, for the report."""

    def wait(self, work: dist.Work, what: str, peer: str) -> None:
        """Wait for `work`, a message exchanged with `peer`; after `timeout` seconds, or when
        the peer is gone, report `what` and exit."""
        with self.watching(peer, what):
            start = time.monotonic()
            if _polls(work):
                delay = 1e-5
                while not work.is_completed():
                    if time.monotonic() - start > self.timeout:
                        self.expire(what)
                    time.sleep(delay)
                    delay = min(2 * delay, 1e-3)
                work.wait()
                return
            try:
                work.wait(timeout=timedelta(seconds=self.timeout))
            except RuntimeError as e:
                if "imed out" not in str(e) and "timeout" not in str(e).lower():
                    raise
                self.expire(what)

    @contextmanager
    def watching(self, peer: str, what: str) -> Iterator[None]:
        """Around any call that talks to `peer` (posting a send or a receive, waiting): the
        peer's loss becomes the watchdog's report instead of a traceback."""
        try:
            yield
        except RuntimeError as e:
            if lost_peer(e):
                self.lost(peer, what)
            raise

    def expire(self, what: str) -> None:
        self._exit(f"waited more than {self.timeout:g} s for {what}")

    def lost(self, peer: str, what: str) -> None:
        self._exit(
            f"lost {peer}: its connection closed (the process ended) while this rank "
            f"waited for {what}"
        )

    def _exit(self, report: str) -> None:
        print(
            f"octodsl watchdog: {self.whoami} {report}; last op done: {self.last_done}. Exiting.",
            file=sys.stderr,
            flush=True,
        )
        sys.stdout.flush()
        os._exit(EXIT_CODE)  # the peers are stuck or gone: no clean shutdown is possible


def _polls(work: dist.Work) -> bool:
    """NCCL work waits on the GPU stream, not the host: poll it instead."""
    return dist.get_backend() == "nccl"
