"""Diagnostics: one type for every problem found in a plan or an input file, printed as

FILE:LINE:COL: error[CODE]: message
  LINE | source text
       |     ^^^^
  hint: ...
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from ..plan import Span
from .codes import CODES, Severity


@dataclass(frozen=True, slots=True)
class Diagnostic:
    code: str
    """Stable identifier, one of octodsl.lang.codes.CODES (which says its severity and title)."""
    message: str
    span: Span | None = None
    hint: str | None = None
    notes: tuple[str, ...] = ()
    """Extra lines printed after the caret (e.g. the steps of a wait-for cycle)."""
    more: int = 0
    """Diagnostics of the same code left out after this one (`capped`), counted but not shown."""
    more_lines: tuple[int, int] = (0, 0)
    """The first and last line of those left out."""

    @property
    def severity(self) -> Severity:
        return CODES[self.code].severity

    @property
    def is_error(self) -> bool:
        return self.severity is Severity.ERROR

    @property
    def count(self) -> int:
        """The problems this diagnostic stands for: itself and those left out after it."""
        return 1 + self.more

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
        if self.more:
            lo, hi = self.more_lines
            where = (
                " on this line"
                if s and lo == hi == s.line
                else f" at line {lo}"
                if lo == hi
                else f" at lines {lo}..{hi}"
            )
            out.append(f"  and {self.more:,} more like this{where}")
        return "\n".join(out)


MAX_PER_LINE = 8
"""Diagnostics of one code shown per source line; the rest are counted (`capped`)."""
MAX_PER_CODE = 20
"""Diagnostics of one code shown per file."""


def capped(diags: list[Diagnostic]) -> list[Diagnostic]:
    """`diags` (sorted) with at most MAX_PER_LINE of a code on a line and MAX_PER_CODE of a code
    in all: each one left out is counted on the last one shown of its code (on its line, when
    the line's cap left it out), so that no code floods the output and the counts stay whole."""
    shown: list[Diagnostic] = []
    on_line: Counter = Counter()
    last: dict[object, int] = {}
    for d in diags:
        line = d.span.line if d.span else 0
        if on_line[d.code, line] < MAX_PER_LINE and on_line[d.code] < MAX_PER_CODE:
            on_line[d.code, line] += 1
            on_line[d.code] += 1
            last[d.code, line] = last[d.code] = len(shown)
            shown.append(d)
            continue
        i = last[d.code, line] if (d.code, line) in last else last[d.code]
        kept = shown[i]
        lo, hi = kept.more_lines if kept.more else (line, line)
        shown[i] = dataclasses.replace(
            kept, more=kept.more + d.count, more_lines=(min(lo, line), max(hi, line))
        )
    return shown


BOM = "\ufeff"
"""The UTF-8 byte-order mark some editors put at the start of a file."""


def source_lines(source: str) -> list[str]:
    r"""The lines of a text as positions count them: only \n ends a line (a \r before it is
    part of the line end). str.splitlines() also splits at \f, \v, \x1c..\x1e, \x85, U+2028
    and U+2029, which a comment may hold. A leading byte-order mark is no character of line 1."""
    return [line.removesuffix("\r") for line in source.removeprefix(BOM).split("\n")]


EXCERPT_WIDTH = 100
"""Characters of a source line an excerpt shows; a longer line is cut, marked with '...'."""
EXCERPT_LEAD = 20
"""Characters of a cut line shown before the span's start."""


def _excerpt(source: str, s: Span) -> list[str]:
    lines = source_lines(source)
    if not 1 <= s.line <= len(lines):
        return []
    # One column per character, as the parser counts them; what a terminal would not show as
    # one character (a form feed, U+2028, ...) is shown as '?' so that the caret stays aligned.
    text = "".join(c if c.isprintable() else "?" for c in lines[s.line - 1].expandtabs(1))
    start = s.col - 1
    end = max(start + 1, s.end_col - 1 if s.end_line == s.line else len(text))
    # a line longer than the excerpt (a 5000-digit number) is cut around the span's start
    lo = max(0, min(start - EXCERPT_LEAD, len(text) - EXCERPT_WIDTH))
    hi = min(len(text), lo + EXCERPT_WIDTH)
    head = "..." if lo else ""
    shown = head + text[lo:hi] + ("..." if hi < len(text) else "")
    caret = " " * (len(head) + start - lo) + "^" * (min(end, max(hi, start + 1)) - start)
    gutter = str(s.line)
    pad = " " * len(gutter)
    return [f"  {gutter} | {shown}", f"  {pad} | {caret}"]


def one_of(items: Sequence[str]) -> str:
    """['a', 'b', 'c'] -> 'a, b or c' (['a'] -> 'a'): the choices a message names."""
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " or " + items[-1]


def ranges_text(values: Iterable[int]) -> str:
    """[0, 1, 2, 5] -> '0..2, 5'."""
    vs = sorted(set(values))
    parts, i = [], 0
    while i < len(vs):
        j = i
        while j + 1 < len(vs) and vs[j + 1] == vs[j] + 1:
            j += 1
        parts.append(str(vs[i]) if i == j else f"{vs[i]}..{vs[j]}")
        i = j + 1
    return ", ".join(parts)


class PlanSyntaxError(Exception):
    """Raised when a file cannot be turned into a Plan; carries every diagnostic found."""

    def __init__(self, diagnostics: list[Diagnostic], path: str, source: str | None):
        self.diagnostics = sorted(diagnostics, key=Diagnostic.sort_key)
        self.path = path
        self.source = source
        super().__init__(self.render())

    def render(self) -> str:
        return "\n".join(d.render(self.path, self.source) for d in self.diagnostics)
