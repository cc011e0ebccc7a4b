"""How fast a fused (flash) attention kernel runs, by sequence length and head dimension.

A device holds measured throughput curves of its attention kernel: TFLOP/s (FlashAttention's
convention: the causal half of 4 s^2 d FLOPs per head forward, 2.5x that backward) at a few
sequence lengths, for head dimensions 64 and 128. Between two measured lengths the rate is
interpolated in log(length); outside, the nearest measured one is taken (the curves flatten at
both ends); between head dimensions linearly, outside them the nearest. Sources per device:
docs/models-and-costs.md, "Attention".
"""

from __future__ import annotations

import bisect
import math
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class AttentionCurve:
    """Measured TFLOP/s of one direction (forward or backward) for one head dimension."""

    head_dim: int
    seq: tuple[int, ...]
    """Sequence lengths, ascending."""
    tflops: tuple[float, ...]
    """Achieved TFLOP/s at each."""

    def at(self, seq: int) -> float:
        """TFLOP/s at sequence length `seq`, interpolated in log(seq)."""
        i = bisect.bisect_left(self.seq, seq)
        if i == 0:
            return self.tflops[0]
        if i == len(self.seq):
            return self.tflops[-1]
        a, b = self.seq[i - 1], self.seq[i]
        t = (math.log(seq) - math.log(a)) / (math.log(b) - math.log(a))
        return self.tflops[i - 1] + t * (self.tflops[i] - self.tflops[i - 1])


@dataclass(frozen=True, slots=True)
class AttentionModel:
    """A device's causal flash-attention kernel: forward and backward curves by head dimension
    (the same curves for both when only forward + backward was measured)."""

    forward: tuple[AttentionCurve, ...]
    """Ascending head dimensions."""
    backward: tuple[AttentionCurve, ...]
    source: str = ""
    """Where the curves were measured (kernel, paper or page)."""

    def rates(self, seq: int, head_dim: int) -> tuple[float, float]:
        """Forward and backward FLOP/s at this sequence length and head dimension."""
        return _rate(self.forward, seq, head_dim), _rate(self.backward, seq, head_dim)


def _rate(curves: tuple[AttentionCurve, ...], seq: int, head_dim: int) -> float:
    dims = [c.head_dim for c in curves]
    i = bisect.bisect_left(dims, head_dim)
    if i == 0:
        return curves[0].at(seq) * 1e12
    if i == len(curves):
        return curves[-1].at(seq) * 1e12
    lo, hi = curves[i - 1], curves[i]
    t = (head_dim - lo.head_dim) / (hi.head_dim - lo.head_dim)
    return (lo.at(seq) + t * (hi.at(seq) - lo.at(seq))) * 1e12
