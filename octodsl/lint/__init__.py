"""`octodsl lint`: every diagnostic for a plan text, front end and rules together."""

from __future__ import annotations

from ..gcpause import paused_collection
from ..lang import analyze
from ..lang.errors import Diagnostic, capped
from ..models import SpecError, load_model
from ..plan import Plan
from .rules import RULES, Context, run_rules
from .suppress import apply_suppressions

__all__ = ["RULES", "lint_plan", "lint_source"]


def lint_source(source: str, path: str = "<string>") -> tuple[Plan | None, list[Diagnostic]]:
    """Parse, lower and check a plan text; all diagnostics but the warnings its suppression
    comments silence, sorted by position, capped per code and line (`Diagnostic.count` says
    how many each stands for)."""
    with paused_collection():  # see gcpause: a plan at the op limit is millions of objects
        plan, diags = analyze(source, path)
        if plan is not None:
            diags = diags + lint_plan(plan)
        diags = apply_suppressions(source, diags)  # before the cap, which counts what it hides
    return plan, capped(sorted(diags, key=Diagnostic.sort_key))


def lint_plan(plan: Plan) -> list[Diagnostic]:
    """Check a Plan (from a file, a generator or the tuner). A model named in the header is
    loaded (a relative spec path is taken from the working directory) so the partition can be
    checked against its layers; with a memory limit too, each device's simulated peak memory is
    checked against it (E501)."""
    ctx = Context(plan)
    diags: list[Diagnostic] = []
    if plan.header.model:
        try:
            spec = load_model(plan.header.model)
        except SpecError as e:
            diags.append(Diagnostic("E206", str(e), plan.header.spans.get("model")))
        else:
            ctx.num_layers, ctx.pattern, ctx.spec = spec.num_layers, spec.pattern, spec
    return diags + run_rules(
        ctx, extra=[_memory] if plan.header.memory and plan.header.model else []
    )


def _memory(ctx: Context) -> list[Diagnostic]:
    # Imported here: the simulator (numba) costs a third of a second to import, which plans
    # without a model and a memory limit should not pay.
    from .memory import memory_diagnostics

    return memory_diagnostics(ctx.plan)
