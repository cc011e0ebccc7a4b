"""The one base class of every error a user can fix.

A bad option, an unreadable or invalid file (plan, CSV, model spec, profile, trace), a plan that
cannot run or does not fit: each is an `OctoError`, raised wherever it is found and carrying the
file and source position when known. The command line converts them in one place
(`octodsl.cli.main`) into `octodsl: error: PATH:LINE:COL: message`, never a traceback; anything
else that escapes is a bug and is reported as an internal error.

Diagnostics of a plan's text (lint) are not exceptions: they are `lang.errors.Diagnostic`s, many
per file, and `lang.errors.PlanSyntaxError` carries them when a file cannot be parsed at all.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .plan import Span


class OctoError(Exception):
    """An error in what the user gave; the message says what is wrong and, where it can, how to
    fix it. `path` and `span` say where, when known."""

    exit_code: int = 2
    """The command line's exit status for this error (2: bad input; 1: the input is valid but
    asks for what cannot be done, as `tune` when no plan fits)."""

    def __init__(
        self,
        message: str,
        *,
        path: str | None = None,
        span: Span | None = None,
        exit_code: int | None = None,
    ):
        super().__init__(message)
        self.message = message
        self.path = path
        self.span = span
        if exit_code is not None:
            self.exit_code = exit_code

    def at(self, path: str | None, span: Span | None = None) -> OctoError:
        """Fill in where the error is, unless a more precise place is already known."""
        if self.path is None:
            self.path = path
        if self.span is None:
            self.span = span
        return self

    def where(self) -> str:
        """`PATH:LINE:COL: `, `PATH: ` or nothing."""
        if self.path is None:
            return ""
        if self.span is None:
            return f"{self.path}: "
        return f"{self.path}:{self.span.line}:{self.span.col}: "

    def __str__(self) -> str:
        return self.where() + self.message
