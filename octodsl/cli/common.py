"""Helpers shared by the command modules."""

from __future__ import annotations

from ..errors import OctoError


class UserError(OctoError):
    """A bad command-line argument or an unreadable file."""


def read_text(path: str) -> str:
    """A file's text ('-' for standard input), or a UserError saying why it cannot be read."""
    import sys

    if path == "-":
        return sys.stdin.read()
    try:
        with open(path, encoding="utf-8") as f:
            return f.read()
    except FileNotFoundError:
        raise UserError(f"{path}: no such file") from None
    except IsADirectoryError:
        raise UserError(f"{path}: is a directory") from None
    except UnicodeDecodeError:
        raise UserError(f"{path}: not a UTF-8 text file") from None
    except OSError as e:
        raise UserError(f"{path}: {e.strerror}") from None


def write_output(path: str, text: str) -> None:
    """Write a command's result to `path`, or a UserError saying why it cannot be written."""
    try:
        with open(path, "w", encoding="utf-8") as f:
            f.write(text)
    except OSError as e:
        raise UserError(f"{path}: cannot write: {e.strerror}") from None


def stdout_console():
    """A rich Console for command output; piped output gets a wide page instead of rich's
    80-column default, so tables stay one line per row."""
    import sys

    from rich.console import Console

    return Console(highlight=False, width=None if sys.stdout.isatty() else 160)


def link_named(name: str):
    """A built-in link by name (--link, --dp-link)."""
    from ..costs.devices import get_link

    try:
        return get_link(name)
    except OctoError as e:
        raise UserError(str(e)) from None


def pipeline_link(name: str | None, table, default: str):
    """The link between pipeline devices: --link NAME, else the fitted link of a calibrated
    profile's table, else the built-in `default`."""
    if not name and table.calibration is not None and table.calibration.link is not None:
        return table.calibration.link
    return link_named(name or default)
