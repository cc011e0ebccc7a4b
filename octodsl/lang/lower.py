"""Syntax tree -> Plan: check the header, resolve placement shorthands, unroll ranges and loops.

Problems found here (an unknown header field, an undefined loop variable) are diagnostics; the
plan is still built whenever devices and micro-batches are known, so lint can report the rest.
"""

from __future__ import annotations

import difflib

from pydantic import ValidationError

from ..plan import (DevicePlacement, Header, Op, OpKind, Plan, Slot, Span, Stage,
                    placement_loop, placement_v)
from . import syntax as ast
from .errors import Diagnostic

PATTERN_SYMBOLS = "[Mm*G-E]"
"""Layer-pattern symbols (docs/language.md); `|` cuts stages."""

_FIELD_KINDS = {
    "devices": ("int",), "microbatches": ("int",), "microbatch_size": ("int",),
    "seq_len": ("int",), "dp": ("int",), "memory": ("int", "size"),
    "model": ("string", "name"),
}
_REQUIRED = ("devices", "microbatches")


def lower(file: ast.File) -> tuple[Plan | None, list[Diagnostic]]:
    """Build the Plan; returns (None, diagnostics) when the header lacks what a plan needs."""
    diags: list[Diagnostic] = []
    header = _header(file.plan, diags)
    if header is None:
        return None, diags
    sections = _sections(file, diags)
    stages, partition_span = _partition(sections.get("partition"), diags)
    placement, placement_span = _placement(sections.get("placement"), len(stages), header.devices, diags)
    schedule, schedule_spans = _schedule(sections.get("schedule"), header.devices, diags)
    plan = Plan(header, stages, placement, schedule, partition_span, placement_span, schedule_spans)
    return plan, diags


# -- header ------------------------------------------------------------------------------------

def _header(block: ast.PlanBlock, diags: list[Diagnostic]) -> Header | None:
    values: dict = {"name": block.name}
    spans: dict[str, Span] = {}
    for e in block.entries:
        if e.key not in _FIELD_KINDS:
            close = difflib.get_close_matches(e.key, _FIELD_KINDS, n=1)
            diags.append(Diagnostic(
                "E110", f"unknown header field '{e.key}'", e.span,
                hint=f"did you mean '{close[0]}'?" if close else
                "fields are " + ", ".join(_FIELD_KINDS)))
            continue
        if e.key in values:
            diags.append(Diagnostic("E113", f"'{e.key}' is given twice", e.span,
                                    hint=f"first given at line {spans[e.key].line}"))
            continue
        if e.kind not in _FIELD_KINDS[e.key]:
            want = "a quoted string" if "string" in _FIELD_KINDS[e.key] else (
                "a size such as 80GiB" if e.key == "memory" else "a whole number")
            diags.append(Diagnostic("E111", f"'{e.key}' must be {want}, not {e.text}", e.value_span))
            continue
        values[e.key] = e.value
        spans[e.key] = e.value_span
    missing = [k for k in _REQUIRED if k not in values]
    for k in missing:
        diags.append(Diagnostic("E112", f"the plan header does not give '{k}'", block.span,
                                hint=f"add a line such as '{k} 4' inside plan {{ ... }}"))
    if missing:
        return None
    try:
        return Header(**values, spans=spans)
    except ValidationError as err:
        for item in err.errors():
            key = str(item["loc"][0]) if item["loc"] else ""
            diags.append(Diagnostic("E114", f"'{key}': {item['msg'].lower()}", spans.get(key, block.span)))
        return None


def _sections(file: ast.File, diags: list[Diagnostic]) -> dict[str, ast.Section]:
    found: dict[str, ast.Section] = {}
    for sec in file.sections:
        name = _section_name(sec)
        if name in found:
            diags.append(Diagnostic("E120", f"a second {name} section", sec.span,
                                    hint=f"the first is at line {found[name].span.line}"))
            continue
        found[name] = sec
    for name in ("partition", "placement", "schedule"):
        if name not in found:
            example = {"partition": "'stages 4' or partition { stage 0: layers 0..9 ... }",
                       "placement": "'placement loop'",
                       "schedule": "schedule { device 0 { F0:0 ... } ... }"}[name]
            diags.append(Diagnostic("E121", f"the plan has no {name}", file.plan.span,
                                    hint=f"add {example}"))
    return found


def _section_name(sec: ast.Section) -> str:
    if isinstance(sec, (ast.PartitionLayers, ast.PartitionPattern, ast.PartitionAbstract)):
        return "partition"
    if isinstance(sec, (ast.PlacementExplicit, ast.PlacementNamed)):
        return "placement"
    return "schedule"


# -- partition ---------------------------------------------------------------------------------

def _partition(sec, diags: list[Diagnostic]) -> tuple[list[Stage], Span | None]:
    if sec is None:
        return [], None
    if isinstance(sec, ast.PartitionAbstract):
        if sec.count < 1:
            diags.append(Diagnostic("E114", "a plan needs at least one stage", sec.span))
        return [Stage(span=sec.span) for _ in range(sec.count)], sec.span
    if isinstance(sec, ast.PartitionLayers):
        stages = []
        for i, d in enumerate(sec.stages):
            if d.index != i:
                diags.append(Diagnostic("E203", f"stage {d.index} is declared where stage {i} is expected",
                                        d.span, hint="declare stages in order, numbered from 0"))
            stages.append(Stage(d.first, d.last, None, d.span))
        return stages, sec.span
    return _pattern_stages(sec, diags), sec.span


def _pattern_stages(sec: ast.PartitionPattern, diags: list[Diagnostic]) -> list[Stage]:
    stages: list[Stage] = []
    layer = 0
    # The string's content starts one column after the opening quote.
    line, col0 = sec.value_span.line, sec.value_span.col + 1
    for piece, start in _split_cuts(sec.pattern):
        symbols = "".join(ch for ch in piece if not ch.isspace())
        for k, ch in enumerate(piece):
            if not ch.isspace() and ch not in PATTERN_SYMBOLS:
                c = col0 + start + k
                diags.append(Diagnostic("E140", f"'{ch}' is not a layer symbol", Span(line, c, line, c + 1),
                                        hint="symbols: [ embedding, M mamba2, m mamba1, * attention, "
                                        "G gated-deltanet, - mlp, E moe, ] lm head; | cuts stages"))
        if not symbols:
            c = col0 + start
            diags.append(Diagnostic("E202", f"stage {len(stages)} is empty", Span(line, c, line, c + 1),
                                    hint="two cuts '|' in a row, or a cut at an end of the pattern"))
        stages.append(Stage(layer, layer + len(symbols) - 1 if symbols else layer - 1, symbols, sec.span))
        layer += len(symbols)
    return stages


def _split_cuts(pattern: str) -> list[tuple[str, int]]:
    out, start = [], 0
    for piece in pattern.split("|"):
        out.append((piece, start))
        start += len(piece) + 1
    return out


# -- placement ---------------------------------------------------------------------------------

def _placement(sec, num_stages: int, devices: int,
               diags: list[Diagnostic]) -> tuple[list[DevicePlacement], Span | None]:
    if sec is None:
        return [], None
    if isinstance(sec, ast.PlacementExplicit):
        return [DevicePlacement(e.device, tuple(e.stages), e.span) for e in sec.entries], sec.span
    if sec.name == "loop":
        return _with_span(placement_loop(num_stages, devices), sec.span), sec.span
    if sec.name == "v":
        if num_stages != 2 * devices:
            diags.append(Diagnostic("E131", f"a V placement needs 2 x devices = {2 * devices} stages; "
                                    f"the partition has {num_stages}", sec.span))
            return [], sec.span
        return _with_span(placement_v(num_stages, devices), sec.span), sec.span
    diags.append(Diagnostic("E130", f"unknown placement '{sec.name}'", sec.span,
                            hint="use 'loop', 'v' or placement { device 0: stages 0, 1 ... }"))
    return [], sec.span


def _with_span(entries: list[DevicePlacement], span: Span) -> list[DevicePlacement]:
    for e in entries:
        e.span = span
    return entries


# -- schedule ----------------------------------------------------------------------------------

def _schedule(sec: ast.ScheduleBlock | None, devices: int,
              diags: list[Diagnostic]) -> tuple[list[list[Slot]], list[Span | None]]:
    schedule: list[list[Slot]] = [[] for _ in range(devices)]
    spans: list[Span | None] = [None] * devices
    if sec is None:
        return schedule, spans
    for block in sec.devices:
        d = block.device
        if d >= devices:
            diags.append(Diagnostic("E154", f"device {d} does not exist: the plan has {devices} "
                                    f"devices (0..{devices - 1})", block.span))
            continue
        if spans[d] is not None:
            diags.append(Diagnostic("E153", f"device {d} has a second schedule block", block.span,
                                    hint=f"the first is at line {spans[d].line}"))
            continue
        spans[d] = block.span
        _unroll(block.items, {}, schedule[d], diags)
    return schedule, spans


def _unroll(items: list[ast.Item], env: dict[str, int], out: list[Slot],
            diags: list[Diagnostic]) -> None:
    for item in items:
        if isinstance(item, ast.OpItem):
            out.extend(Slot((op,), item.span) for op in _ops(item, env, diags))
        elif isinstance(item, ast.Overlap):
            ops = []
            for o in item.ops:
                got = _ops(o, env, diags)
                if o.mb_last is not None:
                    diags.append(Diagnostic("E155", "an overlap group holds single ops, not ranges", o.span))
                ops.extend(got[:1])
            if ops:
                out.append(Slot(tuple(ops), item.span))
        else:
            first, last = _eval(item.first, env, diags), _eval(item.last, env, diags)
            if first is None or last is None:
                continue
            if item.var in env:
                diags.append(Diagnostic("E156", f"loop variable '{item.var}' hides an outer one", item.span))
            if last < first:
                diags.append(Diagnostic("E151", f"the loop range {first}..{last} is empty", item.span,
                                        hint="ranges are inclusive and must not run backwards"))
            for v in range(first, last + 1):
                _unroll(item.body, {**env, item.var: v}, out, diags)


def _ops(item: ast.OpItem, env: dict[str, int], diags: list[Diagnostic]) -> list[Op]:
    kind = OpKind(item.kind)
    stage = _eval(item.stage, env, diags)
    first = _eval(item.mb, env, diags)
    last = first if item.mb_last is None else _eval(item.mb_last, env, diags)
    if stage is None or first is None or last is None:
        return []
    if last < first:
        diags.append(Diagnostic("E151", f"the micro-batch range {first}..{last} is empty", item.span,
                                hint="ranges are inclusive and must not run backwards"))
    return [Op(kind, stage, m, item.span) for m in range(first, last + 1)]


def _eval(e: ast.Expr, env: dict[str, int], diags: list[Diagnostic]) -> int | None:
    if isinstance(e, ast.Num):
        return e.value
    if isinstance(e, ast.Var):
        if e.name not in env:
            diags.append(Diagnostic("E150", f"'{e.name}' is not a loop variable here", e.span,
                                    hint="names in ops must be variables of an enclosing 'for'"))
            return None
        return env[e.name]
    a, b = _eval(e.left, env, diags), _eval(e.right, env, diags)
    if a is None or b is None:
        return None
    return a + b if e.op == "+" else a - b if e.op == "-" else a * b
