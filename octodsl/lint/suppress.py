"""Suppression comments: `# octodsl: ignore[W401, W403]` ending a line silences those warnings
where they point at that line; `# octodsl: ignore-file[W402]` on a line of its own above the
plan (only comments and blank lines before it) silences them in the whole file
(docs/language.md, "Suppression comments"). Errors are never silenced. What is wrong with the
comments themselves is reported as W801 (an unknown code), W802 (a code that cannot be
ignored), W803 (silences nothing) and W804 (malformed).

The grammar discards comments, so the source text is scanned for them, once, with the parser's
own idea of a comment (a `#` outside a string literal, to the end of the line).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from ..lang.codes import CODES, Severity
from ..lang.errors import BOM, Diagnostic
from ..lang.parser import comment_matches, comment_positions
from ..lang.syntax import SUPPRESSION
from ..plan import Span

_FORM = re.compile(r"\s*(?P<kind>ignore-file|ignore)\s*\[(?P<codes>[^\]]*)\]", re.I)
"""What follows the start: which form, and the codes between the brackets (any text may follow:
the reason)."""
_HINT = "write `# octodsl: ignore[W401, W403]` at the end of the line the warnings point at"
_FILE_HINT = (
    "write `# octodsl: ignore-file[W402]` on a line of its own above the plan, with only "
    "comments and blank lines before it"
)


@dataclass(slots=True)
class _Named:
    """One code a suppression comment names, where, and whether it silenced anything."""

    code: str
    span: Span
    whole_file: bool
    used: bool = False


def apply_suppressions(source: str, diags: list[Diagnostic]) -> list[Diagnostic]:
    """`diags` less the warnings the suppression comments of `source` silence, with the
    comments' own problems added. A suppression that silences nothing (W803) is reported only
    when no error is left: with errors, some checks do not run, so it may yet have work."""
    source = source.removeprefix(BOM)  # positions are counted without it, as the parser does
    if SUPPRESSION.search(source) is None:  # the common case: no comment to read
        return diags
    problems: list[Diagnostic] = []
    by_line: dict[int, dict[str, _Named]] = {}
    whole_file: dict[str, _Named] = {}
    for named in _read(source, problems):
        table = whole_file if named.whole_file else by_line.setdefault(named.span.line, {})
        first = table.get(named.code)
        if first is not None:
            again = first.span.line == named.span.line  # in the same comment
            problems.append(
                Diagnostic(
                    "W803",
                    f"{named.code} is named twice" + " in this comment" * again,
                    named.span,
                    hint=None if again else f"first at line {first.span.line}",
                )
            )
        else:
            table[named.code] = named
    kept = []
    for d in diags:
        named = _silencer(d, by_line, whole_file)
        if named is None:
            kept.append(d)
        else:
            named.used = True
    if not any(d.is_error for d in kept):
        problems.extend(_unused(by_line, whole_file))
    return kept + problems


def _silencer(
    d: Diagnostic, by_line: dict[int, dict[str, _Named]], whole_file: dict[str, _Named]
) -> _Named | None:
    """The suppression that silences `d`, if one does: its line's, else the file's."""
    if not CODES[d.code].ignorable:
        return None
    on_line = by_line.get(d.span.line) if d.span else None
    return (on_line or {}).get(d.code) or whole_file.get(d.code)


def _unused(by_line: dict[int, dict[str, _Named]], whole_file: dict[str, _Named]):
    for table in (*by_line.values(), whole_file):
        for named in table.values():
            if not named.used:
                form, where = (
                    ("ignore-file", "in this file")
                    if named.whole_file
                    else ("ignore", "on this line")
                )
                yield Diagnostic(
                    "W803",
                    f"{form}[{named.code}] silences nothing: no {named.code} is reported {where}",
                    named.span,
                    hint="remove it, or the code from it",
                )


def _read(source: str, problems: list[Diagnostic]):
    """The codes each suppression comment of `source` names (W801, W802 and W804 in `problems`
    for those that name nothing usable)."""
    preamble_end = _first_statement(source)
    for m, line, col in comment_positions(source):
        text = m.group(0).rstrip()
        if not SUPPRESSION.match(text):
            continue
        at = m.start()
        own_line = not source[at - col + 1 : at].strip()
        yield from _directive(text, line, col, own_line, at < preamble_end, problems)


def _directive(
    text: str, line: int, col: int, own_line: bool, in_preamble: bool, problems: list[Diagnostic]
):
    """The codes one suppression comment names, its problems in `problems`."""
    whole = Span(line, col, line, col + len(text))
    start = SUPPRESSION.match(text)
    assert start is not None, "only a comment that starts as a suppression is read as one"
    form = _FORM.match(text, start.end())
    if form is None:
        problems.append(
            Diagnostic(
                "W804",
                "a malformed suppression comment: expected "
                "`# octodsl: ignore[CODE, ...]` or `# octodsl: ignore-file[CODE, ...]`",
                whole,
                hint=_HINT,
            )
        )
        return
    whole_file = form.group("kind").lower() == "ignore-file"
    if whole_file and not in_preamble:
        problems.append(
            Diagnostic(
                "W804",
                "ignore-file after the start of the plan silences nothing",
                whole,
                hint=_FILE_HINT,
            )
        )
        return
    if not whole_file and own_line:
        problems.append(
            Diagnostic(
                "W804",
                "ignore on a line of its own silences nothing: it "
                "silences the warnings of the line it ends",
                whole,
                hint=_HINT + ", or use ignore-file above the plan",
            )
        )
        return
    inner, offset = form.group("codes"), col + form.start("codes")
    if not inner.strip():
        problems.append(
            Diagnostic(
                "W804",
                "a suppression comment that names no code",
                whole,
                hint=_FILE_HINT if whole_file else _HINT,
            )
        )
        return
    for item in inner.split(","):
        code = item.strip()
        at = offset + item.find(code)
        span = Span(line, at, line, at + max(len(code), 1))  # an empty code: the caret at its place
        offset += len(item) + 1
        if _may_name(code, span, problems):
            yield _Named(code, span, whole_file)


def _may_name(code: str, span: Span, problems: list[Diagnostic]) -> bool:
    """Whether `code` is one a suppression may name; if not, why, in `problems`."""
    if not code:
        problems.append(Diagnostic("W804", "an empty code between commas", span))
        return False
    known = CODES.get(code)
    if known is None:
        right = code.upper() if code.upper() in CODES else None
        problems.append(
            Diagnostic(
                "W801",
                f"'{code}' is no code octodsl reports",
                span,
                hint=f"codes are written in capitals: {right}"
                if right
                else "the codes are listed in docs/diagnostics.md",
            )
        )
        return False
    if known.severity is Severity.ERROR:
        problems.append(
            Diagnostic(
                "W802",
                f"{code} ({known.title}) is an error, which cannot be "
                "ignored: a plan with errors is never run",
                span,
                hint="fix what it reports; only warnings can be ignored",
            )
        )
        return False
    if not known.ignorable:
        problems.append(
            Diagnostic(
                "W802",
                f"{code} ({known.title}) cannot be ignored: it is "
                "about the suppression comments themselves",
                span,
            )
        )
        return False
    return True


def _first_statement(source: str) -> int:
    """The offset of the first character that is neither whitespace nor in a comment (the
    length of `source` when there is none)."""
    at = 0
    for m in comment_matches(source):
        if source[at : m.start()].strip():
            break
        at = m.end()
    rest = source[at:]
    return at + len(rest) - len(rest.lstrip())
