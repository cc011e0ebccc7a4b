"""Plans <-> the compute-only action CSV of `torch.distributed.pipelining`
(`_PipelineScheduleRuntime._load_csv` / `_dump_csv`): one row per rank, one action per cell in
the rank's order, an empty cell an idle step.

Actions are `{stage}{kind}{micro-batch}`. Kinds: torch F = our F, I = our B (input gradient
only), W = our W, B = our BW (fused backward). An overlap group `(F0:7 & BW7:3)` is
`(0F7;7B3)OVERLAP_F_B` (torch has no other kind of group, so every group is written so).

Reading: rows are devices; stages, placement (the row holding each stage) and micro-batches are
inferred, giving an abstract plan (`stages N`) named after the file. Actions that are not
compute are dropped: REDUCE_GRAD, UNSHARD and RESHARD are what torch's runtime adds to a
compute-only schedule by itself, and the SEND_/RECV_ actions of a compute+comms file follow
from the plan's dependencies (a warning says they were dropped). A stage whose backwards mix
fused and split forms (torch's own DualPipeV does) cannot be written in .octo: its fused
backwards are split into B then W in the same place, with a warning.

Rows end at a line feed (LF or CR LF, as in .octo files); a leading byte-order mark is ignored;
numbers are ASCII digits, bounded by octodsl.limits. A file that passes these checks is then
checked as lint checks a plan, so a schedule that deadlocks is refused as lint refuses it.

Diagnostics (line = row, col = where the cell's text starts):
E601 a cell that is no action; E602 a compute action without a micro-batch; E603 a stage on
two rows; E604 an op given twice; E605 a stage, op or micro-batch missing; E606 an empty file;
E607 a number past a limit; E310 a deadlock (lint's); W601 communication actions dropped;
W602 fused backwards split.

Writing: the CSV carries the schedule and, by where ops run, the placement; the rest of a plan
(model, layers, header sizes) has no place in it. What changes how the plan runs and would be
lost without a word, ZeRO sharding, recompute and the mesh (tp, sequence_parallel,
gpus_per_node), is named by `export_warnings` (W603). A CSV read back states tp 1.
"""

from __future__ import annotations

import re
from collections import defaultdict
from dataclasses import dataclass, replace
from pathlib import PurePath

from ..lang.bounds import ops_beyond_limit, whole_number
from ..lang.errors import Diagnostic, PlanSyntaxError, ranges_text, source_lines
from ..limits import MAX_DEVICES, MAX_MICROBATCHES, MAX_STAGES, at_most
from ..lint import lint_plan
from ..plan import (
    DevicePlacement,
    Header,
    Op,
    OpKind,
    Plan,
    PlanError,
    Recompute,
    Slot,
    Span,
    Stage,
)

TO_TORCH = {OpKind.F: "F", OpKind.B: "I", OpKind.W: "W", OpKind.BW: "B"}
FROM_TORCH = {v: k for k, v in TO_TORCH.items()}
GROUP = "OVERLAP_F_B"

# [0-9], not \d: \d takes any script's digits (Arabic-Indic, Devanagari, ...), which int() reads.
_ACTION = re.compile(
    r"([0-9]+)(F|I|B|W|UNSHARD|RESHARD|REDUCE_GRAD|SEND_F|RECV_F|SEND_B|RECV_B)([0-9]*)"
)
_IN_CSV_TERMS = "(device 0 is row 1; F1:4 is the action 1F4, BW1:4 is 1B4, B1:4 is 1I4)"
"""How lint's words for a plan read in a CSV's terms."""
_DROPPED_SILENTLY = {"UNSHARD", "RESHARD", "REDUCE_GRAD"}
_HINT = (
    "actions look like 0F1 (stage 0, forward, micro-batch 1), 3I0, 3W0, 2B5 or (0F7;7B3)OVERLAP_F_B"
)


def write_csv(plan: Plan) -> str:
    """The plan's schedule as torch's compute-only CSV (no idle cells: a plan is an order).
    Raises PlanError when an op runs on a device that does not hold its stage, since the CSV
    states the placement by where ops run."""
    home = plan.stage_device()
    rows = []
    for d, slots in enumerate(plan.schedule):
        for slot in slots:
            for op in slot.ops:
                if not 0 <= op.stage < len(home) or home[op.stage] != d:
                    raise PlanError(
                        f"{op} is scheduled on device {d}, which does not hold stage "
                        f"{op.stage}; the CSV cannot say so"
                    )
        rows.append(",".join(_cell(slot) for slot in slots))
    return "\n".join(rows) + "\n"


def export_warnings(plan: Plan) -> list[Diagnostic]:
    """What write_csv drops of `plan` that changes how it runs: its `zero`, its mesh fields
    (tp, sequence_parallel, ep, gpus_per_node) and the stages of its recompute section that
    recompute (W603, at where the plan states them)."""
    out = []
    if plan.header.zero:
        out.append(
            Diagnostic(
                "W603",
                f"'zero {plan.header.zero}' is dropped: the CSV has no place for ZeRO sharding",
                plan.header.spans.get("zero"),
                "set the sharding up in the training script instead",
            )
        )
    out.extend(_mesh_warnings(plan.header))
    recompute = [(i, s) for i, s in enumerate(plan.stages) if s.recompute is not Recompute.NONE]
    if recompute:
        shown = ", ".join(f"stage {i}: {s.recompute}" for i, s in recompute)
        out.append(
            Diagnostic(
                "W603",
                f"the recompute section ({shown}) is dropped: the CSV has no place for it",
                recompute[0][1].recompute_span,
                "torch's pipeline keeps every activation unless the stage's module "
                "checkpoints itself",
            )
        )
    return out


_MESH_DROPPED = {
    "tp": (
        "tensor parallelism",
        "split each stage over its tp group in the training script "
        "(torch.distributed.tensor.parallel)",
    ),
    "sequence_parallel": (
        "sequence parallelism",
        "set it up with the tp plan in the training script",
    ),
    "ep": (
        "expert parallelism",
        "spread the MoE layers' experts over the data-parallel ranks in the training script",
    ),
    "gpus_per_node": ("the cluster's shape", "the launcher places the ranks on the nodes"),
}
"""Header fields of the mesh the CSV cannot state: what each means, and where it goes instead."""


def _mesh_warnings(h: Header) -> list[Diagnostic]:
    """A W603 for each mesh field that is not its default, at where the plan states it."""
    out = []
    for key, (what, hint) in _MESH_DROPPED.items():
        value = getattr(h, key)
        if value == Header.model_fields[key].default:
            continue
        shown = str(value).lower()  # a bool as the plan writes it
        out.append(
            Diagnostic(
                "W603",
                f"'{key} {shown}' is dropped: the CSV has no place for {what}",
                h.spans.get(key),
                hint,
            )
        )
    return out


def _cell(slot: Slot) -> str:
    acts = [_torch(op) for op in slot.ops]
    return acts[0] if len(acts) == 1 else f"({';'.join(acts)}){GROUP}"


def _torch(op: Op) -> str:
    """The op as torch writes an action: stage, kind, micro-batch."""
    return f"{op.stage}{TO_TORCH[op.kind]}{op.mb}"


def read_csv(
    text: str, path: str = "<csv>", name: str | None = None
) -> tuple[Plan, list[Diagnostic]]:
    """The abstract plan a CSV states, and the warnings about it; raises PlanSyntaxError with
    every error found. The plan is named `name`, else after the file."""
    reader = _Reader()
    # Every line is a rank, a blank one too (as torch's csv.reader sees it); the final newline
    # ends the last row.
    lines = source_lines(text)
    if lines[-1] == "":
        lines.pop()
    if len(lines) > MAX_DEVICES:
        reader.report(
            "E607",
            f"{len(lines):,} rows, one device each: a plan has {at_most(MAX_DEVICES, 'devices')}",
            Span(MAX_DEVICES + 1, 1, MAX_DEVICES + 1, 2),
        )
        raise PlanSyntaxError(reader.diags, path, text)
    rows = [reader.row(n + 1, line) for n, line in enumerate(lines)]
    if not any(rows):
        reader.report(
            "E606",
            "the file has no actions",
            None,
            "one row per rank, its actions separated by commas",
        )
    plan = reader.plan(rows, name or PurePath(path).stem)
    if not reader.has_errors():
        reader.lint(plan)
    if reader.has_errors():
        raise PlanSyntaxError([d for d in reader.diags if d.is_error], path, text)
    return plan, reader.diags


@dataclass(slots=True)
class _Cell:
    ops: tuple[Op, ...]
    span: Span


class _Reader:
    def __init__(self) -> None:
        self.diags: list[Diagnostic] = []
        self.comms_dropped = False
        """Whether the warning about dropped communication actions was given (once per file)."""

    def report(self, code: str, message: str, span: Span | None, hint: str | None = None) -> None:
        self.diags.append(Diagnostic(code, message, span, hint))

    def has_errors(self) -> bool:
        return any(d.is_error for d in self.diags)

    # -- one row ---------------------------------------------------------------------------

    def row(self, line: int, text: str) -> list[_Cell]:
        cells = []
        for col, raw in _split(text):
            stripped = raw.strip()
            if not stripped:
                continue  # an idle step
            col += len(raw) - len(raw.lstrip())
            cell = self.cell(line, col, stripped)
            if cell is not None:
                cells.append(cell)
        return cells

    def cell(self, line: int, col: int, text: str) -> _Cell | None:
        span = Span(line, col, line, col + len(text))
        if text.startswith("("):
            close = text.find(")")
            if close < 0 or text[close + 1 :] != GROUP:
                self.report(
                    "E601",
                    f"{_shown(text)} is not an action",
                    span,
                    f"an overlap group is written (ACTION;ACTION){GROUP}",
                )
                return None
            ops, start = [], col + 1
            for part in text[1:close].split(";"):
                sub = part.strip()
                sub_col = start + len(part) - len(part.lstrip())
                start += len(part) + 1
                op = self.action(line, sub_col, sub) if sub else None
                if op is not None:
                    ops.append(op)
            if not ops:
                self.report("E601", "an overlap group without compute actions", span, _HINT)
                return None
            return _Cell(tuple(ops), span)
        op = self.action(line, col, text)
        return None if op is None else _Cell((op,), span)

    def action(self, line: int, col: int, text: str) -> Op | None:
        span = Span(line, col, line, col + len(text))
        m = _ACTION.fullmatch(text)
        if m is None:
            self.report("E601", f"{_shown(text)} is not an action", span, _HINT)
            return None
        _, kind, mb = m.groups()
        stage = self.index(m, 1, MAX_STAGES, "a stage", span)
        if kind in _DROPPED_SILENTLY:
            return None
        if kind not in FROM_TORCH:
            if not self.comms_dropped:
                self.comms_dropped = True
                self.report(
                    "W601",
                    f"communication actions such as '{text}' are dropped",
                    span,
                    "octodsl derives the messages from the plan's dependencies",
                )
            return None
        if not mb:
            self.report("E602", f"'{text}' names no micro-batch", span, f"e.g. {text}0")
            return None
        microbatch = self.index(m, 3, MAX_MICROBATCHES, "a micro-batch", span)
        if stage is None or microbatch is None:
            return None
        return Op(FROM_TORCH[kind], stage, microbatch, span)

    def index(self, m: re.Match, group: int, count: int, what: str, span: Span) -> int | None:
        """The stage or micro-batch number of an action (group `group` of its match `m`, at
        `span`), of which a plan has at most `count` (0..count - 1)."""
        col = span.col + m.start(group)
        at = Span(span.line, col, span.line, col + len(m.group(group)))
        return whole_number(
            m.group(group), at, self.diags, code="E607", limit=count - 1, what=f"{what} number"
        )

    # -- the whole file ----------------------------------------------------------------------

    def plan(self, rows: list[list[_Cell]], name: str) -> Plan:
        # A cell that could not be read, or a stage on the wrong row, would show up again as
        # missing ops: absences are looked for only in a file without such errors.
        ops = [(d, op) for d, cells in enumerate(rows) for c in cells for op in c.ops]
        num_stages = 1 + max((op.stage for _, op in ops), default=-1)
        microbatches = 1 + max((op.mb for _, op in ops), default=0)
        too_many = ops_beyond_limit(num_stages, microbatches)
        if too_many is not None:
            self.report(
                "E607",
                too_many,
                None,
                "the file names stages up to "
                f"{num_stages - 1} and micro-batches up to {microbatches - 1}",
            )
        home = self.placement(ops, num_stages, check_missing=not self.has_errors())
        rows = self.split_mixed(rows)
        self.completeness(rows, num_stages, microbatches, check_missing=not self.has_errors())
        placement = [
            DevicePlacement(d, tuple(s for s in range(num_stages) if home.get(s) == d))
            for d in range(len(rows))
        ]
        header = Header(name=name, devices=max(1, len(rows)), microbatches=microbatches)
        schedule = [[Slot(c.ops, c.span) for c in cells] for cells in rows]
        return Plan(
            header,
            [Stage() for _ in range(num_stages)],
            [p for p in placement if p.stages],
            schedule,
        )

    def placement(
        self, ops: list[tuple[int, Op]], num_stages: int, check_missing: bool
    ) -> dict[int, int]:
        home: dict[int, int] = {}
        first: dict[int, Op] = {}
        for d, op in ops:
            if op.stage not in home:
                home[op.stage], first[op.stage] = d, op
            elif home[op.stage] != d:
                self.report(
                    "E603",
                    f"stage {op.stage} is on row {d + 1} and on row {home[op.stage] + 1}",
                    op.span,
                    f"{_torch(first[op.stage])} runs it on row {home[op.stage] + 1}; "
                    "a stage lives on one rank",
                )
        absent = [s for s in range(num_stages if check_missing else 0) if s not in home]
        if absent:
            self.report(
                "E605",
                f"stage{'s' * (len(absent) > 1)} {ranges_text(absent)} "
                f"appear{'s' * (len(absent) == 1)} in no row",
                None,
                f"the file has stages up to {num_stages - 1}",
            )
        return home

    def split_mixed(self, rows: list[list[_Cell]]) -> list[list[_Cell]]:
        """Split the fused backwards of stages that also have split ones (torch's DualPipeV)."""
        kinds: dict[int, set[OpKind]] = defaultdict(set)
        for cells in rows:
            for c in cells:
                for op in c.ops:
                    kinds[op.stage].add(op.kind)
        mixed = {s for s, k in kinds.items() if OpKind.BW in k and k & {OpKind.B, OpKind.W}}
        if not mixed:
            return rows
        out = []
        for cells in rows:
            new: list[_Cell] = []
            for c in cells:
                fused = [op for op in c.ops if op.kind is OpKind.BW and op.stage in mixed]
                new.append(
                    _Cell(
                        tuple(
                            Op(OpKind.B, op.stage, op.mb, op.span) if op in fused else op
                            for op in c.ops
                        ),
                        c.span,
                    )
                )
                new.extend(_Cell((Op(OpKind.W, op.stage, op.mb, op.span),), c.span) for op in fused)
            out.append(new)
        self.report(
            "W602",
            "stage"
            + ("s " if len(mixed) > 1 else " ")
            + ", ".join(map(str, sorted(mixed)))
            + " mix fused (B) and split (I, W) backwards; each fused one became B then W",
            None,
            "a .octo stage either splits every backward or fuses every one",
        )
        return out

    def completeness(
        self, rows: list[list[_Cell]], num_stages: int, microbatches: int, check_missing: bool
    ) -> None:
        seen: dict[tuple[OpKind, int, int], Op] = {}
        row_of: dict[int, int] = {}
        split: set[int] = set()
        for d, cells in enumerate(rows):
            for c in cells:
                for op in c.ops:
                    row_of.setdefault(op.stage, d)
                    if op.kind in (OpKind.B, OpKind.W):
                        split.add(op.stage)
                    first = seen.get(op.key())
                    if first is not None:
                        at = first.span
                        assert at is not None, "an op read from a CSV has its cell's span"
                        self.report(
                            "E604",
                            f"{_torch(op)} is given twice",
                            op.span,
                            f"first at row {at.line}, column {at.col}",
                        )
                    else:
                        seen[op.key()] = op
        if not check_missing:
            return
        partial = self.absent_microbatches(seen, sorted(row_of), microbatches, row_of)
        for s in range(num_stages):
            need = (OpKind.F, OpKind.B, OpKind.W) if s in split else (OpKind.F, OpKind.BW)
            missing = [
                _torch(Op(k, s, m))
                for m in range(microbatches)
                for k in need
                if (k, s, m) not in seen and m not in partial.get(s, ())
            ]
            if missing and s in row_of:
                shown = ", ".join(missing[:5]) + (", ..." if len(missing) > 5 else "")
                self.report(
                    "E605",
                    f"stage {s} lacks {len(missing)} action(s): {shown}",
                    Span(row_of[s] + 1, 1, row_of[s] + 1, 2),
                    f"every stage needs a forward and a backward for each micro-batch "
                    f"0..{microbatches - 1}",
                )

    def absent_microbatches(
        self,
        seen: dict[tuple[OpKind, int, int], Op],
        stages: list[int],
        microbatches: int,
        row_of: dict[int, int],
    ) -> dict[int, set[int]]:
        """Report the micro-batches that some stages have no action of at all, by micro-batch:
        a stray `1F4` in a file of micro-batches 0..3 appears only on stage 1, rather than
        making every other stage lack micro-batch 4. Returns, per stage, the micro-batches so
        reported, whose missing actions are not listed again by stage."""
        having: dict[int, set[int]] = defaultdict(set)
        first: dict[int, Op] = {}
        for (_, s, m), op in seen.items():
            having[m].add(s)
            first.setdefault(m, op)
        groups: dict[tuple[int, ...], list[int]] = defaultdict(list)
        for m in range(microbatches):
            if len(having[m]) < len(stages):
                groups[tuple(sorted(having[m]))].append(m)
        reported: dict[int, set[int]] = defaultdict(set)
        for on, ms in groups.items():
            lacking = [s for s in stages if s not in on]
            stray = on and len(lacking) >= len(on)
            for s in stages if stray else lacking:
                reported[s].update(ms)
            mbs = f"micro-batch{'es' * (len(ms) > 1)} {ranges_text(ms)}"
            if not on:
                self.report(
                    "E605",
                    f"no action names {mbs}",
                    None,
                    f"micro-batches are numbered from 0 without gaps; the file names "
                    f"micro-batches up to {microbatches - 1}",
                )
            elif not stray:
                s = lacking[0]
                self.report(
                    "E605",
                    f"stage{'s' * (len(lacking) > 1)} {ranges_text(lacking)} "
                    f"{'have' if len(lacking) > 1 else 'has'} no action of {mbs}",
                    Span(row_of[s] + 1, 1, row_of[s] + 1, 2),
                    f"stage{'s' * (len(on) > 1)} {ranges_text(on)} "
                    f"{'have' if len(on) > 1 else 'has'} {'them' if len(ms) > 1 else 'it'}",
                )
            else:
                self.report(
                    "E605",
                    f"{mbs} appear{'s' * (len(ms) == 1)} only on "
                    f"stage{'s' * (len(on) > 1)} {ranges_text(on)}",
                    first[ms[0]].span,
                    f"stage{'s' * (len(lacking) > 1)} {ranges_text(lacking)} "
                    f"{'have' if len(lacking) > 1 else 'has'} none of "
                    f"{'their' if len(ms) > 1 else 'its'} actions; every stage needs a "
                    "forward and a backward for each micro-batch",
                )
        return reported

    def lint(self, plan: Plan) -> None:
        """Lint's errors for a plan read without errors: a schedule that deadlocks (E310)."""
        for d in lint_plan(plan):
            if d.is_error:
                self.diags.append(replace(d, hint=(d.hint + " " if d.hint else "") + _IN_CSV_TERMS))


def _shown(text: str) -> str:
    """A cell quoted for a message, with what a terminal would not show written as escapes
    (a byte-order mark or a zero-width space inside a cell would otherwise be invisible)."""
    return "'" + "".join(c if c.isprintable() else ascii(c)[1:-1] for c in text) + "'"


def _split(line: str) -> list[tuple[int, str]]:
    """The cells of one CSV line with the 1-based column each starts at. Quoted cells (as the
    csv module writes them) lose their quotes; torch's actions never need any."""
    cells: list[tuple[int, str]] = []
    i, n = 0, len(line)
    while True:
        start = i
        if i < n and line[i] == '"':
            j, buf = i + 1, []
            while j < n:
                if line[j] == '"' and j + 1 < n and line[j + 1] == '"':
                    buf.append('"')
                    j += 2
                elif line[j] == '"':
                    break
                else:
                    buf.append(line[j])
                    j += 1
            cells.append((start + 2, "".join(buf)))
            i = line.find(",", j)
        else:
            j = line.find(",", i)
            cells.append((start + 1, line[i:] if j < 0 else line[i:j]))
            i = j
        if i < 0:
            return cells
        i += 1
