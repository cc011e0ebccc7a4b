"""Syntax tree -> Plan: check the header, resolve placement shorthands, set what each stage
recomputes, unroll ranges and loops.

Problems found here (an unknown header field, an undefined loop variable) are diagnostics; the
plan is still built whenever devices and micro-batches are known, so lint can report the rest.
A plan past one of octodsl.limits is not built: each range and loop is counted before it is
unrolled, and nothing is unrolled once a limit is reached.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass, field

from pydantic import ValidationError

from ..limits import (
    MAX_INT,
    MAX_LAYERS,
    MAX_LOOP_ITERATIONS,
    MAX_OPS,
    MAX_STAGES,
    at_most,
)
from ..plan import (
    ACCUM_DTYPES,
    RUNTIMES,
    DevicePlacement,
    Header,
    Op,
    OpKind,
    Plan,
    Recompute,
    Slot,
    Span,
    Stage,
    placement_loop,
    placement_v,
)
from . import bounds
from . import syntax as ast
from .errors import Diagnostic, one_of
from .fmt import expr_text

PATTERN_SYMBOLS = "[Mm*G-E]"
"""Layer-pattern symbols (docs/language.md); `|` cuts stages."""

_FIELD_KINDS = {
    "devices": ("int",),
    "microbatches": ("int",),
    "microbatch_size": ("int",),
    "seq_len": ("int",),
    "dp": ("int",),
    "zero": ("int",),
    "ep": ("int",),
    "memory": ("int", "size"),
    "model": ("string", "name"),
    "tp": ("int",),
    "sequence_parallel": ("bool",),
    "gpus_per_node": ("int",),
    "overlap_tp_comm": ("bool",),
    "overlap_grad_reduce": ("bool",),
    "overlap_param_gather": ("bool",),
    "overlap_p2p_comm": ("bool",),
    "grad_accumulation_fusion": ("bool",),
    "scatter_gather_messages": ("bool",),
    "reduce_scatter": ("bool",),
    "runtime": ("name",),
    "grad_accum_dtype": ("name",),
}
BOOLEANS = {"true": True, "false": False}
"""How a `bool` field is written: a bare name, `true` or `false` (not 1, yes or "true")."""
_REQUIRED = ("devices", "microbatches")
ZERO_STAGES = (0, 1, 2)
ZERO_HINT = (
    "zero 0 shards nothing; zero 1 shards the optimizer state (the fp32 master copy, "
    "Adam m and v) over the dp copies; zero 2 the gradients as well"
)
RUNTIME_HINT = (
    "deepspeed: octodsl's executor on DeepSpeed's pipeline engine; megatron: Megatron-LM "
    "(they hold different bytes per parameter)"
)
ACCUM_HINT = (
    "the dtype the gradients are accumulated in; leave it out for the runtime's own (fp32 "
    "for a bf16 model in Megatron-LM, the model's dtype in DeepSpeed)"
)
_CHOICES = {"runtime": (RUNTIMES, RUNTIME_HINT), "grad_accum_dtype": (ACCUM_DTYPES, ACCUM_HINT)}
"""The fields whose value is one of a few names, and the hint for any other."""
RECOMPUTE_MODES = {m.value: m for m in Recompute}
_OP_KINDS = {k.value: k for k in OpKind}


def lower(file: ast.File) -> tuple[Plan | None, list[Diagnostic]]:
    """Build the Plan; returns (None, diagnostics) when the header lacks what a plan needs."""
    diags: list[Diagnostic] = []
    header = _header(file.plan, diags)
    if header is None:
        return None, diags
    sections = _sections(file, diags)
    stages, partition_span = _partition(sections.get("partition"), diags)
    if stages is None or not _ops_fit(len(stages), header, partition_span, diags):
        return None, diags
    recompute_sec = sections.get("recompute")
    assert recompute_sec is None or isinstance(
        recompute_sec, ast.RecomputeBlock
    )  # see _section_name
    _recompute(recompute_sec, stages, partition_span is not None, diags)
    placement, placement_span = _placement(
        sections.get("placement"), len(stages), header.devices, diags
    )
    unroller = _Unroller(diags)
    schedule_sec = sections.get("schedule")
    assert schedule_sec is None or isinstance(schedule_sec, ast.ScheduleBlock)  # see _section_name
    schedule, schedule_spans = unroller.schedule(schedule_sec, header.devices)
    if unroller.stopped:
        return None, diags
    plan = Plan(
        header,
        stages,
        placement,
        schedule,
        partition_span,
        placement_span,
        schedule_spans,
        schedule_sec.span if schedule_sec else None,
    )
    return plan, diags


# -- header ------------------------------------------------------------------------------------


def _header(block: ast.PlanBlock, diags: list[Diagnostic]) -> Header | None:
    values: dict = {"name": block.name}
    spans: dict[str, Span] = {}
    for e in block.entries:
        if e.key not in _FIELD_KINDS:
            close = difflib.get_close_matches(e.key, _FIELD_KINDS, n=1)
            diags.append(
                Diagnostic(
                    "E110",
                    f"unknown header field '{e.key}'",
                    e.span,
                    hint=f"did you mean '{close[0]}'?"
                    if close
                    else "fields are " + ", ".join(_FIELD_KINDS),
                )
            )
            continue
        if e.key in values:
            diags.append(
                Diagnostic(
                    "E113",
                    f"'{e.key}' is given twice",
                    e.span,
                    hint=f"first given at line {spans[e.key].line}",
                )
            )
            continue
        kinds = _FIELD_KINDS[e.key]
        boolean = e.kind == "name" and e.text in BOOLEANS
        if not (e.kind in kinds or ("bool" in kinds and boolean)):
            want = (
                one_of(_CHOICES[e.key][0])
                if e.key in _CHOICES
                else "a quoted string"
                if "string" in kinds
                else "true or false"
                if "bool" in kinds
                else "a size such as 80GiB"
                if e.key == "memory"
                else "a whole number"
            )
            diags.append(
                Diagnostic("E111", f"'{e.key}' must be {want}, not {_shown(e.text)}", e.value_span)
            )
            continue
        if e.key in _CHOICES and e.value not in _CHOICES[e.key][0]:
            names, hint = _CHOICES[e.key]
            close = difflib.get_close_matches(str(e.value), names, n=1)
            diags.append(
                Diagnostic(
                    "E111",
                    f"'{e.key}' must be {one_of(names)}, not {_shown(e.text)}",
                    e.value_span,
                    hint=f"did you mean '{close[0]}'?" if close else hint,
                )
            )
            continue
        values[e.key] = BOOLEANS[e.text] if "bool" in kinds else e.value
        spans[e.key] = e.value_span
    if values.get("zero", 0) not in ZERO_STAGES:
        # Not one of the range errors below: the values are a choice, not a limit. The plan is
        # still built (with no sharding), so that lint reports the rest.
        diags.append(
            Diagnostic(
                "E114",
                f"'zero' must be 0, 1 or 2, not {values.pop('zero')}",
                spans["zero"],
                hint=ZERO_HINT,
            )
        )
    missing = [k for k in _REQUIRED if k not in values]
    for k in missing:
        diags.append(
            Diagnostic(
                "E112",
                f"the plan header does not give '{k}'",
                block.span,
                hint=f"add a line such as '{k} 4' inside plan {{ ... }}",
            )
        )
    if missing:
        return None
    try:
        return Header(**values, spans=spans)
    except ValidationError as err:
        for item in err.errors():
            key = str(item["loc"][0]) if item["loc"] else ""
            if item["type"] == "less_than_equal":
                msg = f"must be {at_most(item['ctx']['le'], 'bytes' if key == 'memory' else '')}"
            elif item["type"] == "greater_than_equal":
                msg = f"must be at least {item['ctx']['ge']}"
            else:
                msg = item["msg"].lower()
            diags.append(Diagnostic("E114", f"'{key}' {msg}", spans.get(key, block.span)))
        return None


def _shown(text: str, most: int = 40) -> str:
    """A value as a message quotes it: at most `most` characters (the excerpt under the message
    shows where the rest is)."""
    return text if len(text) <= most else text[: most - 3] + "..."


def _sections(file: ast.File, diags: list[Diagnostic]) -> dict[str, ast.Section]:
    found: dict[str, ast.Section] = {}
    for sec in file.sections:
        name = _section_name(sec)
        if name in found:
            diags.append(
                Diagnostic(
                    "E120",
                    f"a second {name} section",
                    sec.span,
                    hint=f"the first is at line {found[name].span.line}",
                )
            )
            continue
        found[name] = sec
    for name in ("partition", "placement", "schedule"):
        if name not in found:
            example = {
                "partition": "'stages 4' or partition { stage 0: layers 0..9 ... }",
                "placement": "'placement loop'",
                "schedule": "schedule { device 0 { F0:0 ... } ... }",
            }[name]
            diags.append(
                Diagnostic("E121", f"the plan has no {name}", file.plan.span, hint=f"add {example}")
            )
    return found


def _section_name(sec: ast.Section) -> str:
    if isinstance(sec, (ast.PartitionLayers, ast.PartitionPattern, ast.PartitionAbstract)):
        return "partition"
    if isinstance(sec, (ast.PlacementExplicit, ast.PlacementNamed)):
        return "placement"
    if isinstance(sec, ast.RecomputeBlock):
        return "recompute"
    return "schedule"


# -- partition ---------------------------------------------------------------------------------


def _partition(sec, diags: list[Diagnostic]) -> tuple[list[Stage] | None, Span | None]:
    """The stages; None when there are more than MAX_STAGES or a layer past MAX_LAYERS."""
    if sec is None:
        return [], None
    count = (
        sec.count
        if isinstance(sec, ast.PartitionAbstract)
        else len(sec.stages)
        if isinstance(sec, ast.PartitionLayers)
        else sec.pattern.count("|") + 1
    )
    if count > MAX_STAGES:
        diags.append(
            Diagnostic(
                "E207", f"{count:,} stages: a plan has {at_most(MAX_STAGES, 'stages')}", sec.span
            )
        )
        return None, sec.span
    if count == 0:
        diags.append(
            Diagnostic(
                "E205",
                "the partition has no stages",
                sec.span,
                hint="a plan needs at least one stage",
            )
        )
    if isinstance(sec, ast.PartitionAbstract):
        return [Stage(span=sec.span) for _ in range(sec.count)], sec.span
    if isinstance(sec, ast.PartitionLayers):
        stages = []
        for i, d in enumerate(sec.stages):
            if d.index != i:
                diags.append(
                    Diagnostic(
                        "E203",
                        f"stage {d.index} is declared where stage {i} is expected",
                        d.span,
                        hint="declare stages in order, numbered from 0",
                    )
                )
            stages.append(Stage(d.first, d.last, None, d.span))
        past = [d for d in sec.stages if max(d.first, d.last) >= MAX_LAYERS]
        for d in past:
            diags.append(
                Diagnostic(
                    "E207",
                    f"layer {max(d.first, d.last):,}: a model has {at_most(MAX_LAYERS, 'layers')}",
                    d.span,
                    hint=f"layers are numbered 0..{MAX_LAYERS - 1}",
                )
            )
        return (None if past else stages), sec.span
    layers = sum(not ch.isspace() and ch != "|" for ch in sec.pattern)
    if layers > MAX_LAYERS:
        diags.append(
            Diagnostic(
                "E207",
                f"a pattern of {layers:,} layers: a model has {at_most(MAX_LAYERS, 'layers')}",
                sec.value_span,
            )
        )
        return None, sec.span
    return _pattern_stages(sec, diags), sec.span


def _ops_fit(stages: int, header: Header, span: Span | None, diags: list[Diagnostic]) -> bool:
    why = bounds.ops_beyond_limit(stages, header.microbatches)
    if why is not None:
        diags.append(
            Diagnostic(
                "E157",
                why,
                span or header.spans.get("microbatches"),
                hint="fewer stages or fewer micro-batches",
            )
        )
    return why is None


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
                diags.append(
                    Diagnostic(
                        "E140",
                        f"'{ch}' is not a layer symbol",
                        Span(line, c, line, c + 1),
                        hint="symbols: [ embedding, M mamba2, m mamba1, * attention, "
                        "G gated-deltanet, - mlp, E moe, ] lm head; | cuts stages",
                    )
                )
        if not symbols:
            c = col0 + start
            diags.append(
                Diagnostic(
                    "E202",
                    f"stage {len(stages)} is empty",
                    Span(line, c, line, c + 1),
                    hint="two cuts '|' in a row, or a cut at an end of the pattern",
                )
            )
        stages.append(
            Stage(layer, layer + len(symbols) - 1 if symbols else layer - 1, symbols, sec.span)
        )
        layer += len(symbols)
    return stages


def _split_cuts(pattern: str) -> list[tuple[str, int]]:
    out, start = [], 0
    for piece in pattern.split("|"):
        out.append((piece, start))
        start += len(piece) + 1
    return out


# -- placement ---------------------------------------------------------------------------------


def _placement(
    sec, num_stages: int, devices: int, diags: list[Diagnostic]
) -> tuple[list[DevicePlacement], Span | None]:
    if sec is None:
        return [], None
    if isinstance(sec, ast.PlacementExplicit):
        return [DevicePlacement(e.device, tuple(e.stages), e.span) for e in sec.entries], sec.span
    if sec.name == "loop":
        return _with_span(placement_loop(num_stages, devices), sec.span), sec.span
    if sec.name == "v":
        if num_stages != 2 * devices:
            diags.append(
                Diagnostic(
                    "E131",
                    f"a V placement needs 2 x devices = {2 * devices} stages; "
                    f"the partition has {num_stages}",
                    sec.span,
                )
            )
            return [], None  # no placement: lint reports no stage as unplaced again
        return _with_span(placement_v(num_stages, devices), sec.span), sec.span
    diags.append(
        Diagnostic(
            "E130",
            f"unknown placement '{sec.name}'",
            sec.span,
            hint="use 'loop', 'v' or placement { device 0: stages 0, 1 ... }",
        )
    )
    return [], None


def _with_span(entries: list[DevicePlacement], span: Span) -> list[DevicePlacement]:
    for e in entries:
        e.span = span
    return entries


# -- recompute ---------------------------------------------------------------------------------


def _recompute(
    sec: ast.RecomputeBlock | None, stages: list[Stage], partitioned: bool, diags: list[Diagnostic]
) -> None:
    """Set the recompute mode of each stage the section names (the others keep `none`).
    Without a partition (E121) no stage number is reported as missing."""
    if sec is None:
        return
    first: dict[int, ast.RecomputeEntry] = {}
    for e in sec.entries:
        mode = _recompute_mode(e, diags)
        if e.stage in first:
            diags.append(
                Diagnostic(
                    "E172",
                    f"stage {e.stage} is named twice in the recompute section",
                    e.span,
                    hint=f"first at line {first[e.stage].span.line}",
                )
            )
            continue
        first[e.stage] = e
        if e.stage >= len(stages):
            if partitioned:
                diags.append(
                    Diagnostic(
                        "E171",
                        f"stage {e.stage} does not exist: the partition has "
                        f"{_stage_count(len(stages))}",
                        e.span,
                    )
                )
            continue
        if mode is not None:
            stages[e.stage].recompute = mode
            stages[e.stage].recompute_span = e.span


def _stage_count(n: int) -> str:
    """'4 stages (0..3)', '1 stage (stage 0)', 'no stages'."""
    return f"{n} stages (0..{n - 1})" if n > 1 else "1 stage (stage 0)" if n else "no stages"


def _recompute_mode(e: ast.RecomputeEntry, diags: list[Diagnostic]) -> Recompute | None:
    mode = RECOMPUTE_MODES.get(e.mode)
    if mode is None:
        close = difflib.get_close_matches(e.mode, RECOMPUTE_MODES, n=1)
        diags.append(
            Diagnostic(
                "E170",
                f"unknown recompute mode '{e.mode}'",
                e.mode_span,
                hint=f"did you mean '{close[0]}'?"
                if close
                else "the modes are none, full and selective",
            )
        )
    return mode


# -- schedule ---------------------------------------------------------------------------------


@dataclass
class _Unroller:
    """Unrolls ranges and loops into slots. Each range's ops and each loop's iterations are
    counted against MAX_OPS and MAX_LOOP_ITERATIONS before they are expanded; past a limit, or
    at an index expression beyond MAX_INT, it reports once and stops (`stopped`)."""

    diags: list[Diagnostic]
    ops_left: int = MAX_OPS
    iterations_left: int = MAX_LOOP_ITERATIONS
    stopped: bool = False
    seen: set = field(default_factory=set)
    constant: dict[int, list[Slot]] = field(default_factory=dict)
    """The slots of each op item that names no loop variable, by id(item): a loop body gives
    the same ones on every iteration (Slot and Op are frozen, so they are shared)."""

    def schedule(
        self, sec: ast.ScheduleBlock | None, devices: int
    ) -> tuple[list[list[Slot]], list[Span | None]]:
        schedule: list[list[Slot]] = [[] for _ in range(devices)]
        spans: list[Span | None] = [None] * devices
        if sec is None:
            return schedule, spans
        for block in sec.devices:
            d = block.device
            if d >= devices:
                self.note(
                    Diagnostic(
                        "E154",
                        f"device {d} does not exist: the plan has {devices} "
                        f"devices (0..{devices - 1})",
                        block.span,
                    )
                )
                continue
            first = spans[d]
            if first is not None:
                self.note(
                    Diagnostic(
                        "E153",
                        f"device {d} has a second schedule block",
                        block.span,
                        hint=f"the first is at line {first.line}",
                    )
                )
                continue
            spans[d] = block.span
            self.items(block.items, {}, schedule[d])
        return schedule, spans

    def items(self, items: list[ast.Item], env: dict[str, int], out: list[Slot]) -> None:
        for item in items:
            if self.stopped:
                return
            if isinstance(item, ast.OpItem):
                out.extend(self.op_slots(item, env))
            elif isinstance(item, ast.Overlap):
                ops = []
                for o in item.ops:
                    got = self.ops(o, env)
                    if o.mb_last is not None:
                        self.note(
                            Diagnostic(
                                "E155", "an overlap group holds single ops, not ranges", o.span
                            )
                        )
                    ops.extend(got[:1])
                if ops:
                    out.append(Slot(tuple(ops), item.span))
            else:
                self.loop(item, env, out)

    def loop(self, item: ast.Loop, env: dict[str, int], out: list[Slot]) -> None:
        first, last = self.eval(item.first, env), self.eval(item.last, env)
        if first is None or last is None:
            return
        if item.var in env:
            self.note(
                Diagnostic("E156", f"loop variable '{item.var}' hides an outer one", item.span)
            )
        if last < first:
            self.note(
                Diagnostic(
                    "E151",
                    f"the loop range {first}..{last} is empty",
                    item.span,
                    hint="ranges are inclusive and must not run backwards",
                )
            )
        count = max(0, last - first + 1)
        if count > self.iterations_left:
            self.stop(
                Diagnostic(
                    "E158",
                    f"the loop over {first}..{last} takes the plan's loops past the "
                    f"limit: loops iterate {at_most(MAX_LOOP_ITERATIONS, 'times in all')}",
                    item.span,
                )
            )
            return
        self.iterations_left -= count
        # One env for every iteration, restored after: the body only reads it.
        outer = env.get(item.var)
        for v in range(first, last + 1):
            env[item.var] = v
            self.items(item.body, env, out)
        if outer is None:
            env.pop(item.var, None)
        else:
            env[item.var] = outer

    def op_slots(self, item: ast.OpItem, env: dict[str, int]) -> list[Slot]:
        slots = self.constant.get(id(item))
        if slots is None:
            slots = [Slot((op,), item.span) for op in self.ops(item, env)]
            if _constant(item) and slots:
                self.constant[id(item)] = slots
        elif len(slots) > self.ops_left:
            return [Slot((op,), item.span) for op in self.ops(item, env)]  # reports the limit
        else:
            self.ops_left -= len(slots)
        return slots

    def ops(self, item: ast.OpItem, env: dict[str, int]) -> list[Op]:
        kind = _OP_KINDS[item.kind]
        stage = self.eval(item.stage, env)
        first = self.eval(item.mb, env)
        last = first if item.mb_last is None else self.eval(item.mb_last, env)
        if stage is None or first is None or last is None:
            return []
        if last < first:
            self.note(
                Diagnostic(
                    "E151",
                    f"the micro-batch range {first}..{last} is empty",
                    item.span,
                    hint="ranges are inclusive and must not run backwards",
                )
            )
        count = max(0, last - first + 1)
        if count > self.ops_left:
            self.stop(
                Diagnostic(
                    "E157",
                    f"{item.kind}{stage}:{first}..{last} takes the plan past the limit: "
                    f"a plan has {at_most(MAX_OPS, 'ops')}",
                    item.span,
                )
            )
            return []
        self.ops_left -= count
        return [Op(kind, stage, m, item.span) for m in range(first, last + 1)]

    def eval(self, e: ast.Expr, env: dict[str, int]) -> int | None:
        """The expression's value; None after a diagnostic. Recursive: the parser bounds an
        expression to MAX_NESTING operators."""
        if isinstance(e, ast.Num):
            return e.value
        if isinstance(e, ast.Var):
            if e.name not in env:
                self.note(
                    Diagnostic(
                        "E150",
                        f"'{e.name}' is not a loop variable here",
                        e.span,
                        hint="names in ops must be variables of an enclosing 'for'",
                    )
                )
                return None
            return env[e.name]
        a, b = self.eval(e.left, env), self.eval(e.right, env)
        if a is None or b is None:
            return None
        v = a + b if e.op == "+" else a - b if e.op == "-" else a * b
        if abs(v) > MAX_INT:
            self.stop(
                Diagnostic(
                    "E159",
                    f"the value of {expr_text(e)} is too large: an index is {at_most(MAX_INT, '')}",
                    e.span,
                )
            )
            return None
        return v

    def note(self, d: Diagnostic) -> None:
        """Report `d` once: a loop finds the same problem on every iteration."""
        key = (d.code, d.message, d.span)
        if key not in self.seen:
            self.seen.add(key)
            self.diags.append(d)

    def stop(self, d: Diagnostic) -> None:
        self.note(d)
        self.stopped = True


def _constant(item: ast.OpItem) -> bool:
    return all(isinstance(e, ast.Num) for e in (item.stage, item.mb, item.mb_last or item.mb))
