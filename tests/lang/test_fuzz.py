"""Random, mutated and hostile input never escapes as an exception: always diagnostics with a
position; and whatever parses into a plan, fmt lays out idempotently without changing the plan."""

from __future__ import annotations

from pathlib import Path

from hypothesis import given
from hypothesis import strategies as st

from octodsl.cli.fmt import format_source
from octodsl.lang import analyze, parse_plan
from octodsl.lint import lint_source

SEEDS = [
    (Path(__file__).parent / "golden" / f"{name}.octo").read_text()
    for name in ("messy", "recompute", "mesh")
]
TOKENS = [
    "plan",
    "{",
    "}",
    "device",
    "stages",
    "stage",
    "layers",
    "..",
    ":",
    "F0:1",
    "B",
    "W1:",
    "BW",
    "(",
    ")",
    "&",
    "for",
    "in",
    "i",
    "+",
    "*",
    "-",
    "#",
    "\n",
    '"',
    "80GiB",
    "12",
    ",",
    "recompute",
    "full",
    "selective",
    "none",
    "zero",
    "dp",
    "-1",
    "stage 1: full",
    "tp",
    "tp 2",
    "sequence_parallel",
    "true",
    "false",
    "gpus_per_node",
    "2.5",
    "runtime",
    "megatron",
    "runtime deepspeed",
    "grad_accum_dtype",
    "fp32",
    "grad_accum_dtype bf16",
    "overlap_grad_reduce true",
]


def _check(src: str) -> None:
    """lint returns diagnostics (never raises), each rendered with a position; a text whose plan
    is built without errors is laid out by fmt idempotently, stating the same plan."""
    plan, diags = lint_source(src, "fuzz.octo")
    for d in diags:
        text = d.render("fuzz.octo", src)
        assert text.startswith("fuzz.octo")
        if d.code.startswith("E1"):  # syntax errors always point somewhere
            assert d.span is not None and d.span.line >= 1 and d.span.col >= 1
    if plan is not None and not any(d.is_error for d in analyze(src)[1]):
        once = format_source(src)
        assert format_source(once) == once
        assert parse_plan(once).same_as(plan)


@given(st.text(max_size=200))
def test_random_text(src):
    _check(src)


@given(st.lists(st.sampled_from(TOKENS), max_size=60).map(" ".join))
def test_random_tokens(src):
    _check(src)


@given(st.data())
def test_mutated_plan(data):
    src = data.draw(st.sampled_from(SEEDS))
    for _ in range(data.draw(st.integers(1, 4))):
        i = data.draw(st.integers(0, len(src)))
        j = data.draw(st.integers(i, min(len(src), i + 8)))
        insert = data.draw(st.sampled_from(TOKENS + [""]))
        src = src[:i] + insert + src[j:]
    _check(src)


# -- hostile input: odd characters, huge numbers, deep nesting --------------------------------

ODD = [
    "\u2028",
    "\u2029",
    "\f",
    "\v",
    "\x1c",
    "\x1d",
    "\x1e",
    "\x85",
    "\x00",
    "\r",
    "\r\n",
    "\t",
    "\ufeff",
    "\u200b",
    "\u0663",
    "\u00b9",
    "\ud800",
    "\U0001f600",
    "\uffff",
    "é",
]
"""Line separators str.splitlines() knows and lark does not, NUL, a byte-order mark, a lone
surrogate (possible in a str, though no UTF-8 file decodes to one), digits of other scripts."""
NUMBERS = st.one_of(
    st.integers(0, 2).map(lambda n: "9" * n + "1"),
    st.integers(12, 6000).map(lambda n: "9" * n + "1"),
    st.sampled_from(["1e8", "1e9", "1.5", "80Gib", "1000000000001", "٣", "0x10"]),
)
"""Small numbers, numbers above MAX_INT and malformed ones. (Numbers in between are valid, and
a range up to one of them makes a plan of up to MAX_OPS ops, which takes seconds to lint.)"""


@given(st.data())
def test_hostile_values_in_a_plan(data):
    """A number, an odd character or a deep construct put anywhere in a plan."""
    src = data.draw(st.sampled_from(SEEDS))
    for _ in range(data.draw(st.integers(1, 3))):
        i = data.draw(st.integers(0, len(src)))
        piece = data.draw(
            st.one_of(
                NUMBERS,
                st.sampled_from(ODD),
                st.integers(0, 300).map(lambda n: "for i in 0..0 { " * n + "}" * n),
                st.integers(0, 300).map(lambda n: "F0:" + "+".join(["1"] * (n + 1))),
                st.integers(0, 300).map(lambda n: "F0:" + "(" * n + "1" + ")" * n),
            )
        )
        src = src[:i] + piece + src[i:]
    _check(src)


@given(loops=st.integers(0, 200), terms=st.integers(1, 200), parens=st.integers(0, 200))
def test_nesting_is_refused_exactly_past_the_limit(loops, terms, parens):
    from octodsl.limits import MAX_NESTING

    expr = "(" * parens + "+".join(["0"] * (terms - 1) + ["1"]) + ")" * parens
    body = "".join(f"for v{k} in 0..0 {{ " for k in range(loops)) + "}" * loops
    src = (
        'plan "t" { devices 1 microbatches 2 }\nstages 1 placement loop\n'
        f"schedule {{ device 0 {{ {body} F0:0 F0:{expr} BW0:0 BW0:1 }} }}\n"
    )
    _, diags = lint_source(src, "t.octo")
    over = (loops > MAX_NESTING) + (terms - 1 > MAX_NESTING) + (parens > MAX_NESTING)
    assert [d.code for d in diags] == ["E105"] * over
