"""The version of octodsl that is running: what `octodsl --version` prints and what the JSON
outputs and the files octodsl writes record (`octodsl_version`), so that a plan, a profile or a
trace says what made it."""

from __future__ import annotations

import functools

from . import __version__ as SOURCE_VERSION

FIELD = "octodsl_version"
"""The key under which JSON outputs, profiles and traces record the version."""


@functools.cache
def version() -> str:
    """The installed distribution's version (its metadata, what pip reports), else the source's
    `octodsl.__version__` when run from a tree that is not installed. setup.cfg reads its
    version from `octodsl.__version__`, so both are the same string in an up-to-date install."""
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import version as dist_version

    try:
        return dist_version("octodsl")
    except PackageNotFoundError:
        return SOURCE_VERSION


def made_by(command: str) -> str:
    """ "`octodsl COMMAND` (octodsl X.Y.Z)": how the comment on top of a plan octodsl writes
    names what wrote it."""
    return f"`octodsl {command}` (octodsl {version()})"
