"""Any Plan as .octo text, through the template templates/plan.octo.j2.

Python decides what to write (header values, the placement shorthand, the stages that
recompute, compacted schedule items wrapped as `octodsl fmt` wraps them, so fmt leaves the text
unchanged); the template lays it out."""

from __future__ import annotations

from collections.abc import Mapping

import jinja2

from ..plan import Header, Plan, PlanError, Recompute, Slot, placement_loop, placement_v
from ..units import exact_size
from .compact import compact

WRAP = 100
"""Schedule lines stay within this many columns, as in `octodsl fmt`."""
_INDENT = 4
"""Schedule items sit two levels deep (schedule, device)."""

_env = jinja2.Environment(
    loader=jinja2.PackageLoader("octodsl.templates", "."),
    trim_blocks=True,
    lstrip_blocks=True,
    keep_trailing_newline=True,
    undefined=jinja2.StrictUndefined,
    autoescape=False,
)


def render_plan(
    plan: Plan, comments: Mapping[int, Mapping[int, str]] | None = None, title: str | None = None
) -> str:
    """The plan as .octo text. `comments[d][i]` is written as a `# ...` line before slot i of
    device d (and nothing is compacted across it); `title` becomes comment lines on top."""
    comments = comments or {}
    return _env.get_template("plan.octo.j2").render(
        title=title.splitlines() if title else [],
        name=plan.header.name.replace('"', "'").replace("\n", " "),
        header=_header(plan.header),
        partition=_partition(plan),
        placement=_placement(plan),
        recompute=[
            (i, s.recompute.value)
            for i, s in enumerate(plan.stages)
            if s.recompute is not Recompute.NONE
        ],
        devices=[
            _device_lines(slots, comments.get(d, {})) for d, slots in enumerate(plan.schedule)
        ],
    )


def _header(h: Header) -> list[tuple[str, str]]:
    out = [("devices", str(h.devices)), ("microbatches", str(h.microbatches))]
    if h.model is not None:
        out.append(("model", f'"{h.model}"'))
    for key in ("microbatch_size", "seq_len"):
        if getattr(h, key) is not None:
            out.append((key, str(getattr(h, key))))
    if h.tp != 1:
        out.append(("tp", str(h.tp)))
    if h.sequence_parallel is not None:  # as set: None (on when tp > 1) is the default
        out.append(("sequence_parallel", "true" if h.sequence_parallel else "false"))
    if h.dp != 1:
        out.append(("dp", str(h.dp)))
    if h.zero != 0:
        out.append(("zero", str(h.zero)))
    if h.ep != 1:
        out.append(("ep", str(h.ep)))
    if h.memory is not None:
        out.append(("memory", exact_size(h.memory)))
    if h.gpus_per_node != Header.model_fields["gpus_per_node"].default:
        out.append(("gpus_per_node", str(h.gpus_per_node)))
    out += [(name, "true" if value else "false") for name, value in h.runtime_changes()]
    if h.runtime is not None:
        out.append(("runtime", h.runtime))
    if h.grad_accum_dtype is not None:
        out.append(("grad_accum_dtype", h.grad_accum_dtype))
    return out


def _partition(plan: Plan) -> str | list[tuple[int, int]]:
    stages = plan.stages
    if all(s.abstract for s in stages):
        return f"stages {len(stages)}"
    if any(s.abstract for s in stages):
        raise PlanError("a partition cannot mix stages with layers and abstract stages")
    symbols = [s.symbols for s in stages]
    if all(symbols):
        return 'partition "' + "|".join(p for p in symbols if p) + '"'
    return [s.bounds for s in stages]


def _placement(plan: Plan) -> str | list[tuple[int, tuple[int, ...]]]:
    written = _nonempty(plan.placement)
    S, P = plan.num_stages, plan.devices
    if written == _nonempty(placement_loop(S, P)):
        return "loop"
    if S == 2 * P and written == _nonempty(placement_v(S, P)):
        return "v"
    return [(p.device, p.stages) for p in plan.placement if p.stages]


def _nonempty(entries) -> list[tuple[int, tuple[int, ...]]]:
    return sorted((p.device, p.stages) for p in entries if p.stages)


def _device_lines(slots: list[Slot], comments: Mapping[int, str]) -> list[str]:
    cuts = sorted({0, len(slots), *(i for i in comments if 0 <= i <= len(slots))})
    lines: list[str] = []
    for a, b in zip(cuts, cuts[1:] + [None], strict=True):
        if a in comments:
            lines.append(f"# {comments[a]}")
        if b is not None:
            lines.extend(_wrap(compact(slots[a:b])))
    return lines


def _wrap(items: list[str]) -> list[str]:
    """Loops on lines of their own; other items filled into lines as `octodsl fmt` fills them."""
    lines: list[str] = []
    line: list[str] = []
    width = _INDENT
    for item in items:
        loop = item.startswith("for ")
        if line and (loop or width + len(item) + 1 > WRAP):
            lines.append(" ".join(line))
            line, width = [], _INDENT
        if loop:
            lines.append(item)
            continue
        line.append(item)
        width += len(item) + 1
    if line:
        lines.append(" ".join(line))
    return lines
