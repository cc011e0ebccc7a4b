"""Turn a communication hang into an error: a rank that waits longer than the timeout prints
what it is stuck on and the process exits non-zero (the launcher then stops the job).

Every rank runs its own clock, so in a real hang each stuck rank reports its own wait.
"""

from __future__ import annotations

import os
import sys
import time
from datetime import timedelta

import torch.distributed as dist

EXIT_CODE = 3


class Watchdog:
    def __init__(self, timeout: float, whoami: str):
        self.timeout = timeout
        self.whoami = whoami
        self.last_done = "nothing yet"
        """The last op this rank finished, for the report."""

    def wait(self, work: dist.Work, what: str) -> None:
        """Wait for `work`; after `timeout` seconds report `what` and exit."""
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

    def expire(self, what: str) -> None:
        print(f"octodsl watchdog: {self.whoami} waited more than {self.timeout:g} s for {what}; "
              f"last op done: {self.last_done}. Exiting.", file=sys.stderr, flush=True)
        sys.stdout.flush()
        os._exit(EXIT_CODE)  # the peers are stuck too: no clean shutdown is possible


def _polls(work: dist.Work) -> bool:
    """NCCL work waits on the GPU stream, not the host: poll it instead."""
    return dist.get_backend() == "nccl"
