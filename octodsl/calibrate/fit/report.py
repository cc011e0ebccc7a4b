"""What the fit saw and how well it matches: the profile's calibration.fit."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class FitReport:
    """Filled in by the steps as they run (each writes its own fields)."""

    ops: int = 0
    residual: float = 0.0
    """Mean Huber loss of the op-work fit (relative residuals)."""
    dispatch: float = 0.0
    handoffs: int = 0
    probe: list[tuple[int, float]] = field(default_factory=list)
    probe_latency: float | None = None
    overlap_fraction: float = 0.0
    notes: list[str] = field(default_factory=list)
    runs: list[dict] = field(default_factory=list)
    """Per calibration run: measured and simulated iteration time after the fit."""
    memory: dict = field(default_factory=dict)
    timeline: float = 1.0
    """The factor step 9 put on every op's cost."""

    def as_json(self) -> dict:
        """The profile's calibration.fit (its key names are the file format's)."""
        return {
            "ops": self.ops,
            "op_residual": self.residual,
            "dispatch": self.dispatch,
            "handoffs": self.handoffs,
            "probe": [list(p) for p in self.probe],
            "probe_latency": self.probe_latency,
            "overlap_fraction": self.overlap_fraction,
            "notes": self.notes,
            "runs": self.runs,
            "memory": self.memory,
            "timeline": self.timeline,
        }
