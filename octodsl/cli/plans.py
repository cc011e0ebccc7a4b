"""The one place the commands that use a plan (simulate, compare, tune --from, convert) load it:
a plan with errors is refused in one line naming their count and the command that lists them,
so that the list is printed by lint alone."""

from __future__ import annotations

from ..lang.errors import Diagnostic
from ..lint import lint_source
from ..plan import Plan
from .common import UserError, read_text


def checked_plan(path: str, *, allow: tuple[str, ...] = ()) -> tuple[Plan, str, list[Diagnostic]]:
    """The plan of the .octo file `path`, its text and its warnings; a UserError (exit 1) when
    it has errors other than those of the codes in `allow`."""
    source = read_text(path)
    plan, diags = lint_source(source, path)
    errors = sum(d.count for d in diags if d.is_error and d.code not in allow)
    if plan is None or errors:
        n = max(errors, 1)
        raise UserError(
            f"{path}: {n} error{'s' * (n != 1)}; run `octodsl lint {path}` to see "
            + ("it" if n == 1 else "them"),
            exit_code=1,
        )
    return plan, source, [d for d in diags if not d.is_error]
