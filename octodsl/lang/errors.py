"""Diagnostics: one type for every problem found in a plan or an input file, printed as

    FILE:LINE:COL: error[CODE]: message
      LINE | source text
           |     ^^^^
      hint: ...
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from ..plan import Span


class Severity(str, enum.Enum):
    ERROR = "error"
    WARNING = "warning"


@dataclass(frozen=True, slots=True)
class Diagnostic:
    code: str
    """Stable identifier, e.g. E101 (syntax), E2xx (structure), E3xx (schedule), W4xx."""
    message: str
    span: Span | None = None
    hint: str | None = None
    severity: Severity = Severity.ERROR
    notes: tuple[str, ...] = ()
    """Extra lines printed after the caret (e.g. the steps of a wait-for cycle)."""

    @property
    def is_error(self) -> bool:
        return self.severity is Severity.ERROR

    def sort_key(self) -> tuple:
        s = self.span
        return (s.line, s.col) if s else (0, 0), self.code

    def render(self, path: str, source: str | None) -> str:
        """The diagnostic as text: position, message, source line with caret, notes, hint."""
        s = self.span
        where = f"{path}:{s.line}:{s.col}" if s else path
        out = [f"{where}: {self.severity.value}[{self.code}]: {self.message}"]
        if s and source is not None:
            out.extend(_excerpt(source, s))
        out.extend(f"  {n}" for n in self.notes)
        if self.hint:
            out.append(f"  hint: {self.hint}")
        return "\n".join(out)


def _excerpt(source: str, s: Span) -> list[str]:
    lines = source.splitlines()
    if not 1 <= s.line <= len(lines):
        return []
    text = lines[s.line - 1].expandtabs(1)
    end = s.end_col if s.end_line == s.line else len(text) + 1
    width = max(1, end - s.col)
    gutter = str(s.line)
    pad = " " * len(gutter)
    return [f"  {gutter} | {text}", f"  {pad} | {' ' * (s.col - 1)}{'^' * width}"]


class PlanSyntaxError(Exception):
    """Raised when a file cannot be turned into a Plan; carries every diagnostic found."""

    def __init__(self, diagnostics: list[Diagnostic], path: str, source: str | None):
        self.diagnostics = sorted(diagnostics, key=Diagnostic.sort_key)
        self.path = path
        self.source = source
        super().__init__(self.render())

    def render(self) -> str:
        return "\n".join(d.render(self.path, self.source) for d in self.diagnostics)
