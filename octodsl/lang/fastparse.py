"""A hand-written parser for .octo text without errors: the syntax tree lark and `_ToAst` make
of it, ten to thirty times faster (lark builds a tree of every token first, then transforms it).

It accepts a subset of what the grammar accepts and gives up (None) at anything else: a syntax
error, a number past MAX_INT, a loop or expression nested past MAX_NESTING, parentheses nested
too deep. parser.parse_syntax then parses the text with lark, which words the diagnostics; so a
plan with a problem gets exactly the diagnostics it always got, and a plan without one the tree
it always got (tests/lang/test_fastparse.py holds the two parsers equal on random plans).

Spans follow lark's `propagate_positions`: a node spans the tokens of the rule that made it,
the parentheses of an inlined `( expr )` belonging to the rule that holds it.
"""

from __future__ import annotations

import re

from ..limits import MAX_INT, MAX_NESTING
from ..plan import Span
from ..units import parse_size
from . import syntax as ast

_TOKEN = re.compile(
    r"""
    (?P<op>(BW|F|B|W)([0-9]+):([0-9]+)(?:\.\.([0-9]+))?(?![0-9A-Za-z_+*-]|\.[0-9]))
  | (?P<ws>[ \t\f\r\n]+)
  | (?P<comment>\#[^\n]*)
  | (?P<string>"[^"\n]*")
  | (?P<size>[0-9]+(?:\.[0-9]+)?(?:KiB|MiB|GiB|TiB|KB|MB|GB|TB|B)(?![0-9A-Za-z_]))
  | (?P<int>[0-9]+(?![0-9A-Za-z_]|\.[0-9]))
  | (?P<name>[a-z_][a-z0-9_]*)
  | (?P<opkind>BW|F|B|W)
  | (?P<punct>\.\.|[{}():,&+*-])
""",
    re.X,
)
"""The grammar's terminals (grammar/octo.lark), keywords read as names, and an op of numbers
written without spaces, `F3:5` or `F3:0..7` (most ops of a large plan), as one token. Where lark's contextual
lexer would read a text otherwise (a keyword where a name may stand, a size where only a
number may), the parser below meets a token it does not expect and gives up."""

_MAX_DIGITS = len(str(MAX_INT))


class _GiveUp(Exception):
    """The text is not one this parser reads: lark's turn."""


# A token: (kind, text, line, col). The kind of a name or punctuation is its text (so that a
# keyword is matched as its text), else the terminal's name in capitals (never a name's text).
# An OP token adds (kind, stage, mb column, mb, last mb or None, its column) to the four.
_Tok = tuple


def _tokens(source: str) -> list[_Tok]:
    out: list[_Tok] = []
    append = out.append
    line, line_start, pos = 1, 0, 0
    for m in _TOKEN.finditer(source):
        if m.start() != pos:
            raise _GiveUp
        pos = m.end()
        kind = m.lastgroup
        text = m.group()
        if kind == "ws":
            n = text.count("\n")
            if n:
                line += n
                line_start = m.start() + text.rindex("\n") + 1
            continue
        if kind == "comment":
            continue
        if kind == "op":
            col = m.start() - line_start + 1
            append(
                (
                    "OP",
                    text,
                    line,
                    col,
                    m.group(2),
                    m.group(3),
                    m.start(4) - m.start() + col,
                    m.group(4),
                    m.group(5),
                    m.start(5) - m.start() + col,
                )
            )
            continue
        assert kind is not None
        append(
            (
                text if kind in ("punct", "name") else kind.upper(),
                text,
                line,
                m.start() - line_start + 1,
            )
        )
    if pos != len(source):
        raise _GiveUp
    return out


def _span(tok: _Tok) -> Span:
    return Span(tok[2], tok[3], tok[2], tok[3] + len(tok[1]))


def _extent(first: _Tok, last: _Tok) -> Span:
    return Span(first[2], first[3], last[2], last[3] + len(last[1]))


def _number(text: str) -> int:
    if len(text.lstrip("0")) > _MAX_DIGITS or int(text) > MAX_INT:
        raise _GiveUp  # lark's path reports it (E104)
    return int(text)


class _Parser:
    def __init__(self, tokens: list[_Tok]):
        self.toks = tokens
        self.i = 0
        self.end: _Tok = ("$END", "", 0, 0)

    def peek(self) -> str:
        return self.toks[self.i][0] if self.i < len(self.toks) else "$END"

    def take(self, kind: str) -> _Tok:
        if self.i >= len(self.toks) or self.toks[self.i][0] != kind:
            raise _GiveUp
        tok = self.toks[self.i]
        self.i += 1
        return tok

    def last(self) -> _Tok:
        return self.toks[self.i - 1]

    # -- file, header -----------------------------------------------------------------------

    def file(self) -> ast.File:
        plan = self.plan_block()
        sections: list[ast.Section] = []
        while self.i < len(self.toks):
            sections.append(self.section())
        return ast.File(plan, sections)

    def plan_block(self) -> ast.PlanBlock:
        first = self.take("plan")
        name = self.take("STRING")
        self.take("{")
        entries = []
        while self.peek() != "}":
            entries.append(self.header_entry())
        return ast.PlanBlock(name[1][1:-1], entries, _extent(first, self.take("}")))

    def header_entry(self) -> ast.HeaderEntry:
        key = self.toks[self.i] if self.i < len(self.toks) else self.end
        if not _is_name(key[0]):
            raise _GiveUp
        self.i += 1
        kind = self.peek()
        if kind not in ("INT", "SIZE", "STRING") and not _is_name(kind):
            raise _GiveUp
        t = self.toks[self.i]
        self.i += 1
        text = t[1]
        value: int | str
        if kind == "INT":
            value = _number(text)
        elif kind == "SIZE":
            _number(text[: len(text) - len(text.lstrip("0123456789"))])
            value = parse_size(text)
        elif kind == "STRING":
            value = text[1:-1]
        else:
            value = text
        written = kind.lower() if kind in ("INT", "SIZE", "STRING") else "name"
        return ast.HeaderEntry(key[1], value, written, text, _extent(key, t), _span(t))

    # -- sections -----------------------------------------------------------------------------

    def section(self) -> ast.Section:
        head = self.peek()
        if head == "partition":
            return self.partition()
        if head == "stages":
            first = self.take("stages")
            count = self.take("INT")
            return ast.PartitionAbstract(_number(count[1]), _extent(first, count))
        if head == "placement":
            return self.placement()
        if head == "recompute":
            return self.recompute()
        if head == "schedule":
            return self.schedule()
        raise _GiveUp

    def partition(self) -> ast.Section:
        first = self.take("partition")
        if self.peek() == "STRING":
            t = self.take("STRING")
            return ast.PartitionPattern(t[1][1:-1], _extent(first, t), _span(t))
        self.take("{")
        stages = []
        while self.peek() == "stage":
            head = self.take("stage")
            index = _number(self.take("INT")[1])
            self.take(":")
            self.take("layers")
            a = _number(self.take("INT")[1])
            self.take("..")
            last = self.take("INT")
            stages.append(ast.StageDecl(index, a, _number(last[1]), _extent(head, last)))
        return ast.PartitionLayers(stages, _extent(first, self.take("}")))

    def placement(self) -> ast.Section:
        first = self.take("placement")
        if _is_name(self.peek()):
            t = self.toks[self.i]
            self.i += 1
            return ast.PlacementNamed(t[1], _extent(first, t))
        self.take("{")
        entries = []
        while self.peek() == "device":
            head = self.take("device")
            device = _number(self.take("INT")[1])
            self.take(":")
            self.take("stages")
            stages = [_number(self.take("INT")[1])]
            while self.peek() == ",":
                self.i += 1
                stages.append(_number(self.take("INT")[1]))
            entries.append(ast.DevicePlace(device, stages, _extent(head, self.last())))
        return ast.PlacementExplicit(entries, _extent(first, self.take("}")))

    def recompute(self) -> ast.RecomputeBlock:
        first = self.take("recompute")
        self.take("{")
        entries = []
        while self.peek() == "stage":
            head = self.take("stage")
            stage = _number(self.take("INT")[1])
            self.take(":")
            if not _is_name(self.peek()):
                raise _GiveUp
            mode = self.toks[self.i]
            self.i += 1
            entries.append(ast.RecomputeEntry(stage, mode[1], _extent(head, mode), _span(mode)))
        return ast.RecomputeBlock(entries, _extent(first, self.take("}")))

    def schedule(self) -> ast.ScheduleBlock:
        first = self.take("schedule")
        self.take("{")
        blocks = []
        while self.peek() == "device":
            head = self.take("device")
            device = _number(self.take("INT")[1])
            self.take("{")
            items = self.items(0)
            blocks.append(ast.DeviceBlock(device, items, _extent(head, self.take("}"))))
        return ast.ScheduleBlock(blocks, _extent(first, self.take("}")))

    # -- schedule items -----------------------------------------------------------------------

    def items(self, loops: int) -> list[ast.Item]:
        out: list[ast.Item] = []
        while True:
            head = self.peek()
            if head == "OP" or head == "OPKIND":
                out.append(self.op())
            elif head == "(":
                first = self.take("(")
                ops = [self.op()]
                while self.peek() == "&":
                    self.i += 1
                    ops.append(self.op())
                if len(ops) < 2:
                    raise _GiveUp
                out.append(ast.Overlap(ops, _extent(first, self.take(")"))))
            elif head == "for":
                out.append(self.loop(loops + 1))
            else:
                return out

    def loop(self, loops: int) -> ast.Loop:
        if loops > MAX_NESTING:
            raise _GiveUp  # lark's path reports it (E105)
        first = self.take("for")
        var = self.toks[self.i] if self.i < len(self.toks) else self.end
        if not _is_name(var[0]):
            raise _GiveUp
        self.i += 1
        self.take("in")
        lo = self.expr()[0]
        self.take("..")
        hi = self.expr()[0]
        self.take("{")
        body = self.items(loops)
        return ast.Loop(var[1], lo, hi, body, _extent(first, self.take("}")))

    def op(self) -> ast.OpItem:
        if self.peek() == "OP":
            return self.plain_op()
        kind = self.take("OPKIND")
        head = self.peek()
        if head == "INT":
            t = self.take("INT")
            stage: ast.Expr = ast.Num(_number(t[1]), _span(t))
        elif _is_name(head):
            t = self.toks[self.i]
            self.i += 1
            stage = ast.Var(t[1], _span(t))
        else:
            self.take("(")
            stage = self.expr()[0]
            self.take(")")
        self.take(":")
        mb, end = self.expr()
        mb_last = None
        if self.peek() == "..":
            self.i += 1
            mb_last, end = self.expr()
        return ast.OpItem(kind[1], stage, mb, mb_last, _extent(kind, end))

    def plain_op(self) -> ast.OpItem:
        _, text, line, col, kind, stage, mb_col, mb, last, last_col = self.toks[self.i]
        self.i += 1
        stage_col = col + len(kind)
        mb_item = ast.Num(_number(mb), Span(line, mb_col, line, mb_col + len(mb)))
        last_item = (
            None
            if last is None
            else ast.Num(_number(last), Span(line, last_col, line, last_col + len(last)))
        )
        return ast.OpItem(
            kind,
            ast.Num(_number(stage), Span(line, stage_col, line, stage_col + len(stage))),
            mb_item,
            last_item,
            Span(line, col, line, col + len(text)),
        )

    # -- expressions: (the expression, its last token: a `)` that closes it counts) ------------

    def expr(self) -> tuple[ast.Expr, _Tok]:
        e, first, last = self.sum()
        if _operators(e) > MAX_NESTING:
            raise _GiveUp  # lark's path reports it (E105)
        return e, last

    def sum(self) -> tuple[ast.Expr, _Tok, _Tok]:
        left, first, last = self.term()
        while self.peek() in ("+", "-"):
            op = self.toks[self.i][0]
            self.i += 1
            right, _, last = self.term()
            left = ast.BinOp(op, left, right, _extent(first, last))
        return left, first, last

    def term(self) -> tuple[ast.Expr, _Tok, _Tok]:
        left, first, last = self.atom()
        while self.peek() == "*":
            self.i += 1
            right, _, last = self.atom()
            left = ast.BinOp("*", left, right, _extent(first, last))
        return left, first, last

    def atom(self) -> tuple[ast.Expr, _Tok, _Tok]:
        head = self.peek()
        if head == "INT":
            t = self.take("INT")
            return ast.Num(_number(t[1]), _span(t)), t, t
        if _is_name(head):
            t = self.toks[self.i]
            self.i += 1
            return ast.Var(t[1], _span(t)), t, t
        first = self.take("(")
        e, _, _ = self.sum()
        return e, first, self.take(")")


def _is_name(kind: str) -> bool:
    """Whether a token of this kind is a name (a name's kind is its text)."""
    return kind[0].islower() or kind[0] == "_"


def _operators(e: ast.Expr) -> int:
    count, stack = 0, [e]
    while stack:
        x = stack.pop()
        if isinstance(x, ast.BinOp):
            count += 1
            stack += (x.left, x.right)
    return count


def parse(source: str) -> ast.File | None:
    """The syntax tree of `source` (without comments and blank lines), or None where lark's
    parser must read it."""
    try:
        return _Parser(_tokens(source)).file()
    except _GiveUp:
        return None
