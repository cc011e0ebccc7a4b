"""Errors a user can fix."""

from ..errors import OctoError


class PlanLaunchError(OctoError):
    """The plan does not fit the model or the launch (world size, DP degree, layers,
    micro-batches, the DeepSpeed config); raised on every rank before any pipeline
    communication."""


class CheckpointError(OctoError):
    """A checkpoint cannot be saved or loaded (a folder that cannot be written, a full disk, no
    checkpoint, one of another layout); raised on every rank together, none left waiting."""
