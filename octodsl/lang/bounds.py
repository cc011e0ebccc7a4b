"""The bounds of octodsl.limits applied to a plan's text before anything is built from it:
numbers (never converted when longer than any accepted one) and nesting (checked without
recursion, so that what comes after may recurse: the tree is then at most MAX_NESTING deep)."""

from __future__ import annotations

import re

from lark import Tree

from ..limits import MAX_INT, MAX_NESTING, MAX_OPS, at_most
from ..plan import Span
from .errors import Diagnostic

_MAX_DIGITS = len(str(MAX_INT))
_BINOPS = frozenset({"add", "sub", "mul"})
_PAREN_OR_SKIPPED = re.compile(r'"[^"\n]*"|#[^\n]*|[()]')
"""A parenthesis, or a string or comment (whose parentheses do not count)."""


def whole_number(
    digits: str,
    span: Span | None,
    diags: list[Diagnostic],
    *,
    code: str = "E104",
    limit: int = MAX_INT,
    what: str = "a number",
) -> int | None:
    """The value of a run of ASCII digits, or None after a diagnostic when it is above `limit`
    (never above MAX_INT: Python refuses int() of a 5000-digit string, and is slow well below)."""
    if len(digits.lstrip("0")) <= len(str(limit)) and int(digits) <= limit:
        return int(digits)
    shown = digits if len(digits) <= 2 * _MAX_DIGITS else f"a {len(digits)}-digit number"
    diags.append(Diagnostic(code, f"{shown} is too large: {what} is {at_most(limit, '')}", span))
    return None


def ops_beyond_limit(stages: int, microbatches: int) -> str | None:
    """Why a complete plan of this shape (an F and a backward per stage and micro-batch) would
    have more than MAX_OPS ops, or None. Checked before anything walks every such pair."""
    needed = 2 * stages * microbatches
    if needed <= MAX_OPS:
        return None
    return (
        f"{stages:,} stages and {microbatches:,} micro-batches need {needed:,} ops or more: "
        f"a plan has {at_most(MAX_OPS, 'ops')}"
    )


def nesting(tree: Tree) -> list[Diagnostic]:
    """Loops nested deeper than MAX_NESTING, and expressions of more than MAX_NESTING
    operators (`a+b+c` has two; each nests the tree one level deeper)."""
    diags: list[Diagnostic] = []
    stack: list[tuple[Tree, int]] = [(tree, 0)]
    while stack:
        t, loops = stack.pop()
        if t.data == "loop":
            loops += 1
            if loops > MAX_NESTING:
                diags.append(
                    Diagnostic(
                        "E105",
                        f"loops nested {loops} deep: loops nest " + at_most(MAX_NESTING, "deep"),
                        _head_span(t),
                    )
                )
                continue  # one report for the whole nest
        if t.data in _BINOPS:
            count = _operators(t)
            if count > MAX_NESTING:
                diags.append(
                    Diagnostic(
                        "E105",
                        f"an expression of {count} operators: an expression "
                        "has " + at_most(MAX_NESTING, "operators"),
                        meta_span(t.meta),
                    )
                )
            continue  # an expression holds no loops
        stack.extend((c, loops) for c in t.children if isinstance(c, Tree))
    return diags


def parentheses(source: str) -> list[Diagnostic]:
    """Parentheses nested deeper than MAX_NESTING, found in the text (the tree keeps none)."""
    depth = 0
    for m in _PAREN_OR_SKIPPED.finditer(source):
        if m.group(0) == "(":
            depth += 1
            if depth > MAX_NESTING:
                return [
                    Diagnostic(
                        "E105",
                        f"parentheses nested {depth} deep: parentheses nest "
                        + at_most(MAX_NESTING, "deep"),
                        offset_span(source, m.start()),
                    )
                ]
        elif m.group(0) == ")":
            depth = max(0, depth - 1)
    return []


def offset_span(source: str, start: int, length: int = 1) -> Span:
    """The span of `length` characters at offset `start` of `source` (lines end at \\n only,
    as the parser counts them)."""
    line = source.count("\n", 0, start) + 1
    col = start - (source.rfind("\n", 0, start) + 1) + 1
    return Span(line, col, line, col + length)


def _operators(root: Tree) -> int:
    count, stack = 0, [root]
    while stack:
        t = stack.pop()
        count += 1
        stack.extend(c for c in t.children if isinstance(c, Tree) and c.data in _BINOPS)
    return count


def meta_span(meta) -> Span:
    """The span of a lark tree's meta (where a rule matched)."""
    return Span(meta.line, meta.column, meta.end_line, meta.end_column)


def _head_span(t: Tree) -> Span:
    """The keyword `for` of a loop."""
    m = t.meta
    return Span(m.line, m.column, m.line, m.column + 3)
