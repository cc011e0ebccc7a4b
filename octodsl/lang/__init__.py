"""The .octo language front end: text -> syntax tree -> Plan, with diagnostics."""

from __future__ import annotations

from pathlib import Path

from ..plan import Plan
from .errors import Diagnostic, PlanSyntaxError, Severity
from .lower import lower
from .parser import parse_syntax

__all__ = [
    "Diagnostic",
    "PlanSyntaxError",
    "Severity",
    "analyze",
    "load_plan",
    "parse_plan",
    "parse_syntax",
]


def analyze(source: str, path: str = "<string>") -> tuple[Plan | None, list[Diagnostic]]:
    """Parse and lower, returning every diagnostic instead of raising (lint's entry point)."""
    try:
        file = parse_syntax(source, path)
    except PlanSyntaxError as e:
        return None, e.diagnostics
    plan, diags = lower(file)
    return plan, _unique(diags)


def parse_plan(source: str, path: str = "<string>") -> Plan:
    """The Plan a text states; raises PlanSyntaxError when it has any error."""
    plan, diags = analyze(source, path)
    errors = [d for d in diags if d.is_error]
    if errors or plan is None:
        raise PlanSyntaxError(errors, path, source)
    return plan


def load_plan(path: str | Path) -> Plan:
    """parse_plan of a file (octodsl.inputs.read_text: an InputError when it cannot be read)."""
    from ..inputs import read_text

    return parse_plan(read_text(path, "plan"), str(path))


def _unique(diags: list[Diagnostic]) -> list[Diagnostic]:
    """A loop repeats the same problem once per iteration; report it once."""
    seen, out = set(), []
    for d in diags:
        key = (d.code, d.message, d.span)
        if key not in seen:
            seen.add(key)
            out.append(d)
    return out
