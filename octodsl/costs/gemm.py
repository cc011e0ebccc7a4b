"""How long one GEMM takes on a device, by its shape: a roofline with tile and wave quantization.

A GPU's matrix library computes C[m, n] = A[m, k] B[k, n] in output tiles of tm x tn, one tile per
streaming multiprocessor (SM) at a time, each tile a loop over k. So:
- *tile quantization*: the tiles cover ceil(m / tm) x ceil(n / tn) x tm x tn outputs, more than
  m x n when a dimension is not a multiple of the tile;
- *wave quantization*: the tiles run in waves of `sms` at once, the last wave partly idle;
- *the mainloop's ramp*: each tile pays a prologue and an epilogue (loading the first slices,
  writing C), worth `k_ramp` steps of k, so a short k runs below the mainloop's rate;
- smaller tiles reuse each loaded element less and run at a lower rate (`Tile.rate`);
- the library picks the tile that finishes first (cuBLAS's heuristics, roughly);
- and the GEMM can take no less than its bytes (A, B and C once) over the memory bandwidth.
(NVIDIA, "Matrix Multiplication Background User's Guide", docs.nvidia.com/deeplearning/
performance.) `peak_fraction` is what the best-shaped large GEMMs reach of the dense peak, a
published measurement per device (docs/models-and-costs.md, "GEMM efficiency").

A CPU (`sms` 0) has none of this: its GEMMs run at `peak_fraction` of the peak, memory-bound
ones at the bandwidth.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from .work import Gemm


@dataclass(frozen=True, slots=True)
class Tile:
    """One output tile shape the library can pick, and its mainloop rate relative to the
    largest tile's."""

    rows: int
    cols: int
    rate: float = 1.0


@dataclass(frozen=True, slots=True)
class GemmModel:
    """The shape model of one device's GEMMs."""

    peak_fraction: float
    """Of the dense matrix peak: the rate of a large, well-shaped GEMM's mainloop."""
    sms: int = 0
    """Streaming multiprocessors (0: a CPU, no tile or wave quantization)."""
    tiles: tuple[Tile, ...] = ()
    """The output tiles the library chooses between."""
    k_ramp: float = 0.0
    """Steps of k a tile's prologue and epilogue cost: a tile over k runs k + k_ramp steps."""
    ceiling: float = 1.0
    """Of the peak, the most any shape reaches: a measured maximum over a search of shapes
    (MAMF, `devices._tensor_core_gemm`), which the tiles and waves of a larger GEMM would
    otherwise exceed (on an A100 the power limit lowers the clock of the largest: Horace He,
    "Strangely, Matrix Multiplications on GPUs Run Faster When Given 'Predictable' Data",
    2024)."""

    def seconds(self, g: Gemm, peak: float, bandwidth: float, element_bytes: int) -> float:
        """Time of `g` at a dense peak of `peak` FLOP/s and an achievable memory bandwidth of
        `bandwidth` bytes per second, its elements `element_bytes` wide."""
        if g.m <= 0 or g.n <= 0 or g.k <= 0 or g.batch <= 0:
            return 0.0
        memory = element_bytes * (g.m * g.k + g.k * g.n + g.m * g.n) * g.batch / bandwidth
        rate = peak * self.peak_fraction
        if self.sms <= 0 or not self.tiles:
            return max(g.flops / rate, memory)
        per_sm = rate / self.sms
        steps = g.k + self.k_ramp
        best = math.inf
        for t in self.tiles:
            tiles = math.ceil(g.m / t.rows) * math.ceil(g.n / t.cols) * g.batch
            waves = math.ceil(tiles / self.sms)
            best = min(best, waves * 2.0 * t.rows * t.cols * steps / (per_sm * t.rate))
        return max(best, g.flops / (peak * self.ceiling), memory)

    def efficiency(self, g: Gemm, peak: float, bandwidth: float, element_bytes: int) -> float:
        """Achieved FLOP/s of `g` over the peak."""
        s = self.seconds(g, peak, bandwidth, element_bytes)
        return g.flops / (s * peak) if s > 0 else 0.0
