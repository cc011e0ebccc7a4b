"""`octodsl lint`: every diagnostic for a plan text, front end and rules together."""

from __future__ import annotations

from ..lang import analyze
from ..lang.errors import Diagnostic
from ..plan import Plan
from .rules import RULES, Context, run_rules

__all__ = ["RULES", "lint_plan", "lint_source"]


def lint_source(source: str, path: str = "<string>") -> tuple[Plan | None, list[Diagnostic]]:
    """Parse, lower and check a plan text; all diagnostics, sorted by position."""
    plan, diags = analyze(source, path)
    if plan is not None:
        diags = diags + lint_plan(plan)
    return plan, sorted(diags, key=Diagnostic.sort_key)


def lint_plan(plan: Plan) -> list[Diagnostic]:
    """Check a Plan (from a file, a generator or the tuner)."""
    return run_rules(Context(plan))
