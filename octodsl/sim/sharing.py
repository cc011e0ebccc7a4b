"""Devices that share processors: compute slows down while other devices compute.

On a machine whose pipeline processes outnumber its cores (4 ranks on 2 CPU cores), or whose
cores share memory bandwidth, an op runs slower while other devices compute. The model
(processor sharing): with k devices computing at time t, each progresses at

    rate(k) = min(1, cores / k) / (1 + contention * (min(k, cores) - 1))
              / (1 + oversubscription * max(0, k - cores))

of its own speed (the last factor: what time-slicing more processes than cores costs beyond the
fair share, such as context switches and caches refilled), and a device whose own messages are in flight for a fraction x of its op
needs (1 + overlap_slowdown * x) times the work. An op of nominal duration w that starts at s
ends at the e with integral of rate over [s, e] = w.

`simulate` finds durations consistent with the timeline they produce by iterating: walk, then
stretch every node by the concurrency of the last walk, with damping, until nothing moves
(`stretch`). The optimizer step, where every device updates at once, is shared exactly
(`shared_phase`). With no `Sharing` (the default) nothing changes.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .jit import njit

ROUNDS = 60
"""Most walks `simulate` makes to settle the durations."""
TOLERANCE = 1e-4
"""Settled when no node's duration moves by more than this fraction."""


@dataclass(frozen=True)
class Sharing:
    cores: float | None = None
    """Processors the devices share (None: one each)."""
    contention: float = 0.0
    overlap_slowdown: float = 0.0
    oversubscription: float = 0.0

    @property
    def active(self) -> bool:
        return (
            self.cores is not None
            or self.contention > 0
            or self.overlap_slowdown > 0
            or self.oversubscription > 0
        )

    def rate(self, k: float) -> float:
        """Speed of each of k devices computing at once, as a fraction of running alone."""
        return _rate(
            float(k),
            -1.0 if self.cores is None else float(self.cores),
            self.contention,
            self.oversubscription,
        )


@njit
def _rate(k, cores, contention, oversubscription):
    if k <= 1.0:
        return 1.0
    within = k if cores <= 0.0 else min(k, cores)
    r = 1.0 / (1.0 + contention * (within - 1.0))
    if cores > 0.0 and k > cores:
        r *= cores / k / (1.0 + oversubscription * (k - cores))
    return r


@njit
def stretch(start, end, work, cores, contention, oversubscription):
    """Durations under processor sharing, given the last timeline (start, end per node) and
    each node's work in seconds alone: node n starts at start[n] and runs until it has done
    work[n] at the rate the other nodes' last intervals leave it."""
    N = start.shape[0]
    times = np.empty(2 * N)
    delta = np.empty(2 * N)
    for n in range(N):
        times[2 * n] = start[n]
        delta[2 * n] = 1.0
        times[2 * n + 1] = end[n]
        delta[2 * n + 1] = -1.0
    order = np.argsort(times, kind="mergesort")
    # Breakpoints and the number of nodes running from each to the next.
    bt = np.empty(2 * N + 1)
    bk = np.zeros(2 * N + 1)
    nb = 0
    level = 0.0
    i = 0
    while i < 2 * N:
        t = times[order[i]]
        while i < 2 * N and times[order[i]] == t:
            level += delta[order[i]]
            i += 1
        bt[nb] = t
        bk[nb] = level
        nb += 1
    out = np.zeros(N)
    for n in range(N):
        w = work[n]
        if w <= 0.0:
            continue
        s = start[n]
        e_old = end[n]
        # The last breakpoint at or before s (s is one, so there is one). Node n's own last
        # interval [s, e_old) is counted in bk there; from e_old on (a breakpoint too) it is
        # not, and is added.
        lo = 0
        hi = nb
        while lo < hi:
            mid = (lo + hi) // 2
            if bt[mid] <= s:
                lo = mid + 1
            else:
                hi = mid
        seg = lo - 1
        t = s
        left = w
        while True:
            k = bk[seg]
            if bt[seg] >= e_old:
                k += 1.0
            t_next = bt[seg + 1] if seg + 1 < nb else np.inf
            r = _rate(max(k, 1.0), cores, contention, oversubscription)
            if (t_next - t) * r >= left:
                t += left / r
                break
            left -= (t_next - t) * r
            t = t_next
            seg += 1
        out[n] = t - s
    return out


def shared_phase(work: np.ndarray, sharing: Sharing | None) -> np.ndarray:
    """Per device: seconds until its share of a phase that every device starts at once (the
    optimizer step) is done, given each one's work alone."""
    work = np.asarray(work, float)
    if sharing is None or not sharing.active:
        return work.copy()
    done = np.zeros_like(work)
    left = work.copy()
    active = left > 0
    t = 0.0
    while active.any():
        r = sharing.rate(int(active.sum()))
        dt = float(left[active].min()) / r
        t += dt
        left[active] -= dt * r
        finished = active & (left <= 1e-15 * max(1.0, float(work.max())))
        done[finished] = t
        active &= ~finished
    return done
