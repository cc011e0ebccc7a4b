"""Errors a user can fix."""

from ..errors import OctoError


class PlanLaunchError(OctoError):
    """The plan does not fit the model or the launch (world size, DP degree, layers,
    micro-batches); raised on every rank before any pipeline communication."""
