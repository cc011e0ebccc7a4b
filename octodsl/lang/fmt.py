"""Canonical layout of a .octo syntax tree (`octodsl fmt`).

Rules: two-space indents; one blank line between sections, at most one inside a block where the
source had some; schedule items that shared a source line share an output line; every comment is
kept, on its own line before the construct that follows it, or trailing on the line it ended. A
block written on one line that ends in a suppression comment stays on one line, whatever its
width: split, the warnings the comment silences would point at lines it is not on.
Idempotent, and parse(fmt(x)) states the same plan as parse(x).
"""

from __future__ import annotations

from dataclasses import replace

from ..plan import Plan
from . import syntax as ast

INDENT = "  "
WRAP = 100
"""Items of one source line are broken into output lines of at most this many characters."""


def format_file(file: ast.File, expanded: Plan | None = None) -> str:
    """The canonical text of `file`; with `expanded` (the file's lowered plan), ranges and loops
    are written out op by op."""
    if expanded is not None:
        file = _expand(file, expanded)
    out = _Writer(file.comments, file.blank_lines)
    _plan_block(out, file.plan)
    for sec in file.sections:
        out.section_break()
        _section(out, sec)
    out.flush(None, 0)
    return out.text()


class _Writer:
    def __init__(self, comments: list[ast.Comment], blank_lines: frozenset[int]):
        self.blank_lines = blank_lines
        self.pending = sorted(comments, key=lambda c: (c.span.line, c.span.col))
        self.lines: list[str] = []
        self.last_line = 0
        """Last source line written: a blank source line between it and the next is kept."""
        self.trailable = False
        """Whether the last output line may still take a trailing comment."""
        self.block_start = True
        self.force_blank = False

    def _gap(self, line: int) -> None:
        gap = any(n in self.blank_lines for n in range(self.last_line + 1, line))
        if self.lines and (self.force_blank or (not self.block_start and gap)):
            self.lines.append("")
        self.force_blank = False
        self.block_start = False

    def flush(self, before: tuple[int, int] | None, depth: int) -> None:
        """Write the comments that come before source position `before` (all when None): on the
        last output line when they sat on its source line, else on lines of their own."""
        while self.pending and (
            before is None or (self.pending[0].span.line, self.pending[0].span.col) < before
        ):
            c = self.pending.pop(0)
            if self.trailable and c.span.line == self.last_line:
                self.lines[-1] += "  " + c.text
                self.trailable = False
                continue
            self._gap(c.span.line)
            self.lines.append(INDENT * depth + c.text)
            self.last_line = c.span.line
            self.trailable = False

    def keeps_line(self, span: ast.Span) -> bool:
        """Whether `span` is one source line that a suppression comment ends."""
        if span.line != span.end_line:
            return False
        for c in self.pending:  # sorted; the comments before the block are still pending
            if c.span.line > span.line:
                break
            if c.span.line == span.line and c.span.col >= span.end_col and c.suppresses:
                return True
        return False

    def line(self, text: str, depth: int, span: ast.Span) -> None:
        """Write one output line made from the source range `span`."""
        self.flush((span.line, span.col), depth)
        self._gap(span.line)
        self.lines.append(INDENT * depth + text)
        self.last_line = span.end_line
        self.trailable = True

    def open(self, text: str, depth: int, span: ast.Span) -> None:
        """The opening line of a block that spans `span`."""
        self.line(text + " {", depth, ast.Span(span.line, span.col, span.line, span.col))
        self.block_start = True

    def close(self, depth: int, span: ast.Span) -> None:
        """The closing brace of the block that spans `span`."""
        brace = ast.Span(span.end_line, span.end_col - 1, span.end_line, span.end_col)
        self.flush((brace.line, brace.col), depth + 1)
        self.block_start = True  # no blank line before a brace
        self.line("}", depth, brace)

    def section_break(self) -> None:
        self.force_blank = True

    def text(self) -> str:
        return "\n".join(self.lines) + "\n"


def _block(
    out: _Writer, head: str, entries: list[tuple[str, ast.Span]], depth: int, span: ast.Span
) -> None:
    """A block of one entry per line, or all on one line where `out.keeps_line` says so."""
    if out.keeps_line(span):
        out.line(_one_line(head, [text for text, _ in entries]), depth, span)
        return
    out.open(head, depth, span)
    for text, at in entries:
        out.line(text, depth + 1, at)
    out.close(depth, span)


def _one_line(head: str, parts: list[str]) -> str:
    return " ".join([head, "{", *parts, "}"])


def _plan_block(out: _Writer, p: ast.PlanBlock) -> None:
    _block(out, f'plan "{p.name}"', [(f"{e.key} {e.text}", e.span) for e in p.entries], 0, p.span)


def _section(out: _Writer, sec: ast.Section) -> None:
    if isinstance(sec, ast.PartitionAbstract):
        out.line(f"stages {sec.count}", 0, sec.span)
    elif isinstance(sec, ast.PartitionPattern):
        out.line(f'partition "{sec.pattern}"', 0, sec.span)
    elif isinstance(sec, ast.PartitionLayers):
        stages = [(f"stage {s.index}: layers {s.first}..{s.last}", s.span) for s in sec.stages]
        _block(out, "partition", stages, 0, sec.span)
    elif isinstance(sec, ast.PlacementNamed):
        out.line(f"placement {sec.name}", 0, sec.span)
    elif isinstance(sec, ast.PlacementExplicit):
        entries = [
            (f"device {e.device}: stages " + ", ".join(map(str, e.stages)), e.span)
            for e in sec.entries
        ]
        _block(out, "placement", entries, 0, sec.span)
    elif isinstance(sec, ast.RecomputeBlock):
        modes = [(f"stage {r.stage}: {r.mode}", r.span) for r in sec.entries]
        _block(out, "recompute", modes, 0, sec.span)
    elif out.keeps_line(sec.span):
        out.line(_one_line("schedule", [_device_line(b) for b in sec.devices]), 0, sec.span)
    else:
        out.open("schedule", 0, sec.span)
        for block in sec.devices:
            if out.keeps_line(block.span):
                out.line(_device_line(block), 1, block.span)
                continue
            out.open(f"device {block.device}", 1, block.span)
            _items(out, block.items, 2)
            out.close(1, block.span)
        out.close(0, sec.span)


def _device_line(block: ast.DeviceBlock) -> str:
    return _one_line(f"device {block.device}", [_inline(i) for i in block.items])


def _items(out: _Writer, items: list[ast.Item], depth: int) -> None:
    """Items that start on the same source line are written on one line, wrapped at WRAP
    columns; a loop written over several lines keeps its body on lines of its own."""
    group: list[ast.Item] = []
    width = len(INDENT) * depth

    def emit() -> None:
        nonlocal width
        if group:
            text = " ".join(_inline(i) for i in group)
            first, last = group[0].span, group[-1].span
            out.line(text, depth, ast.Span(first.line, first.col, last.end_line, last.end_col))
            group.clear()
        width = len(INDENT) * depth

    for item in items:
        if isinstance(item, ast.Loop) and item.span.end_line > item.span.line:
            emit()
            out.open(
                f"for {item.var} in {expr_text(item.first)}..{expr_text(item.last)}",
                depth,
                item.span,
            )
            _items(out, item.body, depth + 1)
            out.close(depth, item.span)
        else:
            size = len(_inline(item)) + 1
            if group and (item.span.line != group[0].span.line or width + size > WRAP):
                emit()
            group.append(item)
            width += size
    emit()


def _inline(item: ast.Item) -> str:
    if isinstance(item, ast.OpItem):
        mb = expr_text(item.mb) + (
            f"..{expr_text(item.mb_last)}" if item.mb_last is not None else ""
        )
        stage = expr_text(item.stage)
        if not isinstance(item.stage, (ast.Num, ast.Var)):
            stage = f"({stage})"
        return f"{item.kind}{stage}:{mb}"
    if isinstance(item, ast.Overlap):
        return "(" + " & ".join(_inline(o) for o in item.ops) + ")"
    body = " ".join(_inline(i) for i in item.body)
    return f"for {item.var} in {expr_text(item.first)}..{expr_text(item.last)} {{ {body} }}"


_PREC = {"+": 1, "-": 1, "*": 2}


def expr_text(e: ast.Expr) -> str:
    """An expression as fmt writes it: the fewest parentheses that keep its meaning."""
    if isinstance(e, ast.Num):
        return str(e.value)
    if isinstance(e, ast.Var):
        return e.name
    p = _PREC[e.op]
    left, right = expr_text(e.left), expr_text(e.right)
    if isinstance(e.left, ast.BinOp) and _PREC[e.left.op] < p:
        left = f"({left})"
    if isinstance(e.right, ast.BinOp) and (
        _PREC[e.right.op] < p or (_PREC[e.right.op] == p and e.op == "-")
    ):
        right = f"({right})"
    return f"{left}{e.op}{right}"


def _expand(file: ast.File, plan: Plan) -> ast.File:
    """The same file with each device's items replaced by its ops, one item per slot, grouped
    by the source line they came from (so comments keep their place)."""
    sections = []
    for sec in file.sections:
        if isinstance(sec, ast.ScheduleBlock):
            sec = replace(
                sec, devices=[replace(b, items=_explicit_items(plan, b)) for b in sec.devices]
            )
        sections.append(sec)
    return replace(file, sections=sections)


def _explicit_items(plan: Plan, block: ast.DeviceBlock) -> list[ast.Item]:
    if block.device >= len(plan.schedule):
        return block.items
    items: list[ast.Item] = []
    for slot in plan.schedule[block.device]:
        ops = [_op_item(op) for op in slot.ops]
        if len(ops) == 1:
            items.append(ops[0])
        else:
            assert slot.span is not None, "a lowered plan's overlap groups keep their spans"
            items.append(ast.Overlap(ops, slot.span))
    return items


def _op_item(op) -> ast.OpItem:
    s = op.span
    return ast.OpItem(op.kind.value, ast.Num(op.stage, s), ast.Num(op.mb, s), None, s)
