"""Text -> syntax tree. The grammar is loaded once; lark's errors become Diagnostics here and
nowhere else, worded for people (no terminal names)."""

from __future__ import annotations

import dataclasses
import functools
import re
from collections.abc import Iterator
from importlib import resources
from typing import cast

from lark import Lark, Token, Transformer_NonRecursive, v_args
from lark.exceptions import (
    UnexpectedCharacters,
    UnexpectedEOF,
    UnexpectedInput,
    UnexpectedToken,
)

from ..plan import Header, Span
from ..units import parse_size
from . import bounds, fastparse
from . import syntax as ast
from .errors import BOM, Diagnostic, PlanSyntaxError, one_of, source_lines

MAX_SYNTAX_ERRORS = 20
"""Syntax errors reported at most: each costs a parse of the file (with the blocks before it
blanked)."""
_STRING_OR_COMMENT = re.compile(r'"[^"\n]*"|#[^\n]*')
_NUMBER_LIKE = re.compile(r"[0-9A-Za-z_]+(?:\.[0-9A-Za-z_]+)*")
"""What a malformed number such as `1e8`, `1.5` or `80Gib` runs to (the lexer stops at it)."""
_NUMBER_HINT = (
    "a number is written in decimal digits only, such as 100000000; a size is a "
    "number and a unit, such as 80GiB or 1.5TB"
)
_SIGN_HINT = "devices, stages and micro-batches are numbered from 0"

# How each terminal is named in "expected ..." messages; string terminals print as 'literal'.
_WORDS = {
    "OPKIND": "an op (F, B, W or BW)",
    "NAME": "a name",
    "INT": "a number",
    "SIZE": "a size such as 80GiB",
    "STRING": "a quoted string",
    "$END": "end of file",
}
# The order expected alternatives are listed in.
_ORDER = ["OPKIND", "INT", "NAME", "STRING", "SIZE"]


@functools.cache
def _parser() -> Lark:
    text = resources.files("octodsl.grammar").joinpath("octo.lark").read_text()
    return Lark(text, parser="lalr", propagate_positions=True, maybe_placeholders=False)


@functools.cache
def _terminal_words() -> dict[str, str]:
    words = dict(_WORDS)
    for t in _parser().terminals:
        if t.pattern.type == "str":
            words[t.name] = f"'{t.pattern.value}'"
    return words


def _describe_expected(expected: set[str]) -> str:
    words = _terminal_words()
    names = sorted(expected, key=lambda n: (_ORDER.index(n) if n in _ORDER else len(_ORDER), n))
    items = [words.get(n, n) for n in names if n in words]
    return one_of(items) if items else ""


def _token_span(tok: Token) -> Span:
    # A token the lexer made has its position; only the parser's repairs make tokens without
    # one, and those reach neither a tree that is transformed nor an error's token.
    assert tok.line is not None and tok.column is not None, f"token {tok!r} has no position"
    return Span(
        tok.line, tok.column, tok.end_line or tok.line, tok.end_column or tok.column + len(tok)
    )


def _lex_pos(e: UnexpectedCharacters) -> int:
    """Where in the text the lexer stopped. (lark leaves `pos_in_stream` unannotated, `= None`
    on UnexpectedInput, so its type reads as None; UnexpectedCharacters always sets it.)"""
    return cast(int, e.pos_in_stream)


def _malformed_number(e: UnexpectedInput, source: str) -> str | None:
    """The text of the malformed number lark stopped at, if that is what it stopped at: the
    grammar's numbers refuse to be followed by a letter, so `1e8` is not read as 1 then `e8`."""
    m = _NUMBER_LIKE.match(source, _lex_pos(e)) if isinstance(e, UnexpectedCharacters) else None
    return m.group(0) if m and m.group(0)[0] in "0123456789" else None


def _negative_number(e: UnexpectedInput, source: str) -> str | None:
    """The text of the negative number (`-1`, `-80GiB`) at a '-' that lark stopped at where a
    number may stand. (The lexer reads no sign: a '-' is subtraction's.)"""
    if not (isinstance(e, UnexpectedToken) and e.token.value == "-" and "INT" in e.expected):
        return None
    assert e.token.end_pos is not None, "a '-' is a token the lexer made, with its position"
    m = _NUMBER_LIKE.match(source, e.token.end_pos)
    return "-" + m.group(0) if m and m.group(0)[0] in "0123456789" else None


def _header_range(e: UnexpectedToken) -> str | None:
    """What the header field whose value `e` stopped at may be ("'dp' is at least 1"), if that
    is where it stopped: after a field's name, where a string may stand too."""
    prev = e.token_history[-1] if e.token_history else None
    field = (
        Header.model_fields.get(prev.value) if prev is not None and prev.type == "NAME" else None
    )
    if prev is None or field is None or "STRING" not in e.expected:
        return None
    bound = {k: getattr(m, k) for m in field.metadata for k in ("ge", "le") if hasattr(m, k)}
    if "ge" not in bound:
        return None
    low, high = bound["ge"], bound.get("le")
    if high is not None and high - low < 4:
        return f"'{prev.value}' is " + ", ".join(map(str, range(low, high))) + f" or {high}"
    return f"'{prev.value}' is at least {low}"


def _syntax_diagnostic(e: UnexpectedInput, source: str) -> Diagnostic:
    """One lark error, in words, with a hint for a construct people confuse."""
    d = _plain_diagnostic(e, source)
    hint = _did_you_mean(e, source)
    return dataclasses.replace(d, hint=hint) if hint else d


def _plain_diagnostic(e: UnexpectedInput, source: str) -> Diagnostic:
    bad = _malformed_number(e, source)
    if bad is not None:
        span = Span(e.line, e.column, e.line, e.column + len(bad))
        return Diagnostic("E103", f"'{bad}' is not a number", span, hint=_NUMBER_HINT)
    negative = _negative_number(e, source)
    if negative is not None:
        assert isinstance(e, UnexpectedToken)  # see _negative_number
        start = _token_span(e.token)
        span = Span(start.line, start.col, start.line, start.col + len(negative))
        what = _header_range(e)
        return Diagnostic(
            "E103",
            f"'{negative}' is not a number: a plan's numbers have no sign",
            span,
            hint=what or _SIGN_HINT,
        )
    if isinstance(e, UnexpectedCharacters):
        pos = _lex_pos(e)
        ch = source[pos] if pos < len(source) else ""
        span = Span(e.line, e.column, e.line, e.column + 1)
        exp = _describe_expected(set(e.allowed or ()))
        msg = f"unexpected character {ch!r}"
        return Diagnostic("E101", msg, span, hint=f"expected {exp}" if exp else None)
    if isinstance(e, UnexpectedToken):
        tok = e.token
        exp = _describe_expected(set(e.expected))
        if tok.type == "$END":
            return Diagnostic("E102", f"unexpected end of file; expected {exp}", _end_span(source))
        shown = _terminal_words().get(tok.type, tok.type)
        what = (
            f"'{tok.value}'"
            if shown.startswith("'") or tok.type in ("NAME", "INT", "OPKIND")
            else shown
        )
        return Diagnostic("E101", f"unexpected {what}; expected {exp}", _token_span(tok))
    if isinstance(e, UnexpectedEOF):
        return Diagnostic("E102", "unexpected end of file", _end_span(source))
    return Diagnostic("E101", str(e).splitlines()[0], None)


_PLACEMENT_HINT = (
    "a placement entry names the device first, then its stages: "
    "'device 0: stages 0, 7' (or 'placement loop')"
)
_PARTITION_COUNT_HINT = "a partition of N stages without layers is written 'stages {n}'"
_STAGES_BLOCK_HINT = (
    "'stages N' counts stages; stages of named layers are written "
    "partition { stage 0: layers 0..13 ... }"
)
_BACKWARD_HINT = (
    "a fused backward is one op, BW2:5; a split one is two, B2:5 (input gradient) "
    "then W2:5 (weight gradient)"
)
_CSV_HINT = (
    "PyTorch's I (input backward) is B here and its B (full backward) is BW; ops are F, B, W or BW"
)


def _did_you_mean(e: UnexpectedInput, source: str) -> str | None:
    """A hint for the constructs people confuse: a placement entry in the other order
    (`stage 0: device 0`), `partition 4` or `stages { ... }`, a backward written `WB`, `B W`
    or in lower case, PyTorch's `I`."""
    if isinstance(e, UnexpectedCharacters):
        pos = _lex_pos(e)
        return _CSV_HINT if source.startswith("I", pos) and "OPKIND" in (e.allowed or ()) else None
    if not isinstance(e, UnexpectedToken):
        return None
    tok, prev = e.token, e.token_history[-1] if e.token_history else None
    before = prev.type if prev is not None else None
    if tok.type == "STAGE" and "DEVICE" in e.expected:
        return _PLACEMENT_HINT
    if before == "PARTITION" and tok.type == "INT":
        return _PARTITION_COUNT_HINT.format(n=tok.value)
    if before == "STAGES" and tok.type == "LBRACE":
        return _STAGES_BLOCK_HINT
    if before == "OPKIND" and tok.type == "OPKIND":
        return _BACKWARD_HINT
    if (
        tok.type == "NAME"
        and "OPKIND" in e.expected
        and re.fullmatch(r"(bw|wb|[fbw])[0-9]+", tok.value)
    ):
        return "ops are written in capitals: " + _BACKWARD_HINT
    return None


def _end_span(source: str) -> Span:
    """Just after the last character that is not whitespace or a comment."""
    code = _STRING_OR_COMMENT.sub(
        lambda m: m.group(0) if m.group(0).startswith('"') else "", source
    )
    end = len(code.rstrip())
    line = source.count("\n", 0, end) + 1
    col = end - (source.rfind("\n", 0, end) + 1) + 1
    return Span(line, col, line, col + 1)


def parse_syntax(source: str, path: str = "<string>") -> ast.File:
    """Parse .octo text into a syntax tree (fastparse's, when it reads the text; lark's, which
    words the errors, otherwise); raises PlanSyntaxError with the syntax errors found:
    the first one of each block (the rest of the block, up to its matching `}`, is skipped, so
    that the well-formed lines after it are not reported), and the first one of each section
    outside a block. A leading byte-order mark is ignored."""
    source = source.removeprefix(BOM)
    # Parentheses first: fastparse recurses into them (lark's path reports them, E105).
    fast = None if bounds.parentheses(source) else fastparse.parse(source)
    if fast is not None:
        return _with_layout(fast, source)
    errors: list[Diagnostic] = []
    text, tree, last = source, None, -1
    lark = _parser()
    while True:
        try:
            tree = lark.parse(text)
            break
        except UnexpectedInput as e:
            d = _syntax_diagnostic(e, text)
            at = _error_offset(e, text)
            if at is None or at <= last:  # the end of the file, or no progress: a consequence
                if not errors:
                    errors.append(d)
                break
            errors.append(d)
            if len(errors) >= MAX_SYNTAX_ERRORS:
                break
            text, last = _skip_block(text, at), at
    if errors or tree is None:
        raise PlanSyntaxError(bounds.parentheses(source) + errors, path, source)
    errors = bounds.parentheses(source) + bounds.nesting(tree)
    if errors:
        raise PlanSyntaxError(errors, path, source)
    to_ast = _ToAst()
    file: ast.File = to_ast.transform(tree)
    if to_ast.diags:
        raise PlanSyntaxError(list(to_ast.diags), path, source)
    return _with_layout(file, source)


def _with_layout(file: ast.File, source: str) -> ast.File:
    """`file` with the comments (which the grammar ignores) and blank lines of its source, for fmt."""
    file.comments = [
        ast.Comment(m.group(0).rstrip(), Span(line, col, line, col + len(m.group(0))))
        for m, line, col in comment_positions(source)
    ]
    file.blank_lines = frozenset(
        i for i, text in enumerate(source_lines(source), 1) if not text.strip()
    )
    return file


def _error_offset(e: UnexpectedInput, text: str) -> int | None:
    """Where in `text` the error is; None at the end of the file."""
    if isinstance(e, UnexpectedToken):
        return None if e.token.type == "$END" else e.token.start_pos
    if isinstance(e, UnexpectedCharacters):
        return _lex_pos(e)
    return None


_SECTION_START = re.compile(
    r"^[ \t]*(?:partition|placement|recompute|schedule|stages|plan)\b", re.M
)


def _skip_block(text: str, at: int) -> str:
    """`text` with what follows an error at offset `at` blanked up to the end of its block: the
    inside of the innermost `{ ... }` holding it, or outside a block its line and those up to
    the next section. Blanks keep the line ends, so positions are as in the source."""
    code = _STRING_OR_COMMENT.sub(lambda m: " " * len(m.group(0)), text)
    opened: list[int] = []
    lo = hi = None
    for i, ch in enumerate(code):
        if ch == "{":
            opened.append(i)
        elif ch == "}" and opened:
            o = opened.pop()
            if o < at <= i:
                lo, hi = o + 1, i
                break
    if lo is None:
        inner = [o for o in opened if o < at]  # a block the file never closes
        if inner:
            lo, hi = inner[-1] + 1, len(text)
        else:
            lo = text.rfind("\n", 0, at) + 1
            nxt = _SECTION_START.search(
                text, text.find("\n", at) + 1 if "\n" in text[at:] else len(text)
            )
            hi = nxt.start() if nxt else len(text)
    assert hi is not None
    return text[:lo] + re.sub(r"[^\n]", " ", text[lo:hi]) + text[hi:]


def comment_matches(source: str):
    """Every `#...` outside a string literal."""
    return (m for m in _STRING_OR_COMMENT.finditer(source) if m.group(0).startswith("#"))


def comment_positions(source: str) -> Iterator[tuple[re.Match, int, int]]:
    """Every comment (`comment_matches`) with its line and column (lines end at \\n only, as
    the parser counts them). Lines are counted on from the comment before, not from the top
    (`bounds.offset_span` per comment made a file of many comments quadratic)."""
    line, at = 1, 0
    for m in comment_matches(source):
        line += source.count("\n", at, m.start())
        at = m.start()
        yield m, line, at - source.rfind("\n", 0, at)


def _binop(op: str):
    """The _ToAst method for the binary operator `op`."""

    def method(self, meta, children):
        left, right = children
        return ast.BinOp(op, left, right, bounds.meta_span(meta))

    return method


@v_args(meta=True)
class _ToAst(Transformer_NonRecursive):
    """lark tree -> syntax tree, spans attached; without recursion, so that how deep a tree it
    can take does not hang on Python's recursion limit. Numbers above MAX_INT are noted in
    `diags` (and stand as 0)."""

    def __init__(self):
        super().__init__()
        self.diags: list[Diagnostic] = []

    def _int(self, t: Token) -> int:
        value = bounds.whole_number(t.value, _token_span(t), self.diags)
        return 0 if value is None else value

    # header
    def start(self, meta, children):
        return ast.File(children[0], children[1:])

    def plan_block(self, meta, children):
        name, *entries = children
        return ast.PlanBlock(name.value[1:-1], entries, bounds.meta_span(meta))

    def header_entry(self, meta, children):
        key, (value, kind, text, vspan) = children
        return ast.HeaderEntry(key.value, value, kind, text, bounds.meta_span(meta), vspan)

    def int_value(self, meta, children):
        (t,) = children
        return self._int(t), "int", t.value, _token_span(t)

    def size_value(self, meta, children):
        (t,) = children
        digits = re.match(r"[0-9]+", t.value)
        assert digits is not None, "the grammar's SIZE starts with a digit"
        whole = digits.group(0)
        fits = bounds.whole_number(whole, _token_span(t), self.diags) is not None
        return parse_size(t.value) if fits else 0, "size", t.value, _token_span(t)

    def string_value(self, meta, children):
        (t,) = children
        return t.value[1:-1], "string", t.value, _token_span(t)

    def name_value(self, meta, children):
        (t,) = children
        return t.value, "name", t.value, _token_span(t)

    # partition
    def partition_layers(self, meta, children):
        return ast.PartitionLayers(children, bounds.meta_span(meta))

    def stage_decl(self, meta, children):
        i, a, b = (self._int(t) for t in children)
        return ast.StageDecl(i, a, b, bounds.meta_span(meta))

    def partition_pattern(self, meta, children):
        (t,) = children
        return ast.PartitionPattern(t.value[1:-1], bounds.meta_span(meta), _token_span(t))

    def partition_abstract(self, meta, children):
        (t,) = children
        return ast.PartitionAbstract(self._int(t), bounds.meta_span(meta))

    # placement
    def placement_explicit(self, meta, children):
        return ast.PlacementExplicit(children, bounds.meta_span(meta))

    def placement_named(self, meta, children):
        (t,) = children
        return ast.PlacementNamed(t.value, bounds.meta_span(meta))

    def device_place(self, meta, children):
        d, stages = children
        return ast.DevicePlace(self._int(d), stages, bounds.meta_span(meta))

    def int_list(self, meta, children):
        return [self._int(t) for t in children]

    # recompute
    def recompute(self, meta, children):
        return ast.RecomputeBlock(children, bounds.meta_span(meta))

    def recompute_entry(self, meta, children):
        stage, mode = children
        return ast.RecomputeEntry(
            self._int(stage), mode.value, bounds.meta_span(meta), _token_span(mode)
        )

    # schedule
    def schedule(self, meta, children):
        return ast.ScheduleBlock(children, bounds.meta_span(meta))

    def device_block(self, meta, children):
        d, *items = children
        return ast.DeviceBlock(self._int(d), items, bounds.meta_span(meta))

    def op(self, meta, children):
        kind, stage, (mb, mb_last) = children
        return ast.OpItem(kind.value, stage, mb, mb_last, bounds.meta_span(meta))

    def mb(self, meta, children):
        return children[0], (children[1] if len(children) > 1 else None)

    def overlap(self, meta, children):
        return ast.Overlap(children, bounds.meta_span(meta))

    def loop(self, meta, children):
        var, first, last, *body = children
        return ast.Loop(var.value, first, last, body, bounds.meta_span(meta))

    # expressions
    def num(self, meta, children):
        (t,) = children
        return ast.Num(self._int(t), _token_span(t))

    def var(self, meta, children):
        (t,) = children
        return ast.Var(t.value, _token_span(t))

    add = _binop("+")
    sub = _binop("-")
    mul = _binop("*")
