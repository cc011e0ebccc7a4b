"""The calibration plans: a few classic schedules per process count that together vary what
the fit needs to tell apart (fused and split backwards, one and two stages per device, stage
sizes, how many processes compute at once)."""

from __future__ import annotations

from ..gen import generate_text

CALIBRATION_SCHEDULES = ("1f1b", "zb-h1", "zb-v", "interleaved")
"""Fused backward, split backward, two chunks per device in a V, and two per device looped with
a fused backward: without the last, every fused backward the fit saw ran on a stage of a
1F1B (one stage per device), and its per-op overhead came out of two stage sizes only (12.8
and 29.6 ms in two fits of the same machine), over-predicting the fused backward of small
stages (docs/calibration.md, "Why held-out plans were off")."""


def calibration_plans(
    model: str,
    profile: str,
    ranks: list[int],
    schedules: tuple[str, ...] = CALIBRATION_SCHEDULES,
    shape: dict | None = None,
) -> list[tuple[int, str, str]]:
    """(processes, name, .octo text) of each calibration plan: every schedule on every process
    count, with 2 x processes micro-batches, layers balanced by the profile's F + B + W time.
    `shape`: microbatch_size and seq_len for the plans' headers (the profile's)."""
    out = []
    for p in ranks:
        for name in schedules:
            m = 2 * p
            text = generate_text(name, p, m, None, model, "time", profile=profile, **(shape or {}))
            out.append((p, f"calibrate-{name}-p{p}-m{m}", text))
    return out
