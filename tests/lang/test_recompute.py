"""The header's `zero` and the `recompute` section: what they lower to, and each problem's code,
position, message and hint (negative numbers too, which the lexer cannot read as numbers)."""

from __future__ import annotations

from pathlib import Path

import pytest

from octodsl.lang import PlanSyntaxError, analyze, parse_plan
from octodsl.lint import lint_source
from octodsl.plan import Recompute

from ..conftest import check_golden

GOLDEN = Path(__file__).parent / "golden"
HEAD = 'plan "t" {\n  devices 2\n  microbatches 2\n}\n'
BODY = """stages 4
placement loop
recompute {
  stage 1: full
  stage 2: selective
}
schedule {
  device 0 { F0:0..1 F2:0..1 BW2:0..1 BW0:0..1 }
  device 1 { F1:0..1 F3:0 BW3:0 F3:1 BW3:1 BW1:0..1 }
}
"""
GOOD = HEAD + BODY


def diagnostics(src: str, code: str | None = None) -> list:
    _, diags = analyze(src, "t.octo")
    return [d for d in diags if code is None or d.code == code]


def only(src: str, code: str):
    """The one diagnostic of `src`, which has `code`."""
    diags = diagnostics(src)
    assert [d.code for d in diags] == [code], [d.render("t.octo", src) for d in diags]
    return diags[0]


def position(src: str, needle: str) -> tuple[int, int]:
    i = src.index(needle)
    return src.count("\n", 0, i) + 1, i - (src.rfind("\n", 0, i) + 1) + 1


def at(d, src: str, needle: str) -> None:
    """`d` marks exactly the first `needle` of `src`."""
    line, col = position(src, needle)
    assert (d.span.line, d.span.col, d.span.end_line, d.span.end_col) == (
        line,
        col,
        line,
        col + len(needle),
    )


# -- zero ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("zero", [0, 1, 2])
def test_zero_is_a_header_field(zero):
    plan = parse_plan(GOOD.replace("microbatches 2", f"microbatches 2\n  dp 8\n  zero {zero}"))
    assert (plan.header.zero, plan.header.dp) == (zero, 8)


def test_zero_defaults_to_0():
    assert parse_plan(GOOD).header.zero == 0


@pytest.mark.parametrize("value", ["3", "7", "1000000"])
def test_zero_outside_0_to_2_says_what_each_value_shards(value):
    src = GOOD.replace("microbatches 2", f"microbatches 2\n  dp 8\n  zero {value}")
    d = only(src, "E114")
    at(d, src, value)
    assert d.message == f"'zero' must be 0, 1 or 2, not {value}"
    assert d.hint == (
        "zero 0 shards nothing; zero 1 shards the optimizer state (the fp32 master "
        "copy, Adam m and v) over the dp copies; zero 2 the gradients as well"
    )
    rendered = d.render("t.octo", src)
    assert rendered.startswith("t.octo:5:8: error[E114]") and f"  5 |   zero {value}" in rendered
    assert "^" * len(value) in rendered


def test_zero_of_the_wrong_type():
    src = GOOD.replace("microbatches 2", "microbatches 2\n  zero full")
    d = only(src, "E111")
    assert d.message == "'zero' must be a whole number, not full"


# -- negative numbers ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "field, value, hint",
    [
        ("dp", "-1", "'dp' is at least 1"),
        ("zero", "-1", "'zero' is 0, 1 or 2"),
        ("memory", "-80GiB", "'memory' is at least 1"),
        ("devices", "-2", "'devices' is at least 1"),
    ],
)
def test_a_negative_header_value_is_named_with_its_range(field, value, hint):
    src = (
        GOOD.replace("microbatches 2", f"microbatches 2\n  {field} {value}")
        if field != "devices"
        else GOOD.replace("devices 2", f"devices {value}")
    )
    with pytest.raises(PlanSyntaxError) as e:
        parse_plan(src, "t.octo")
    (d,) = e.value.diagnostics  # one slip, one error: the number after the '-' is read on
    assert d.code == "E103"
    at(d, src, value)
    assert d.message == f"'{value}' is not a number: a plan's numbers have no sign"
    assert d.hint == hint


@pytest.mark.parametrize(
    "old, new, value",
    [
        ("F0:0..1", "F0:-1", "-1"),
        ("stages 4", "stages -4", "-4"),
        ("stage 1: full", "stage -1: full", "-1"),
    ],
)
def test_a_negative_number_elsewhere(old, new, value):
    src = GOOD.replace(old, new, 1)
    (d,) = diagnostics(src)
    assert (d.code, d.message) == (
        "E103",
        f"'{value}' is not a number: a plan's numbers have no sign",
    )
    at(d, src, value)
    assert d.hint == "devices, stages and micro-batches are numbered from 0"


def test_a_minus_where_no_number_may_stand_is_a_plain_syntax_error():
    (d,) = diagnostics(GOOD.replace("placement loop", "placement loop -1"))
    assert d.code == "E101" and d.message.startswith("unexpected '-'")


# -- the recompute section ----------------------------------------------------------------------

PARTITIONS = [
    "stages 4",
    'partition "[M|-*|M-|E]"',
    "partition { stage 0: layers 0..1 stage 1: layers 2..3 stage 2: layers 4..5 stage 3: layers 6..7 }",
]


@pytest.mark.parametrize("partition", PARTITIONS)
def test_recompute_sets_the_named_stages_with_every_partition_form(partition):
    src = GOOD.replace("stages 4", partition)
    plan = parse_plan(src)
    assert plan.recompute() == [Recompute.NONE, Recompute.FULL, Recompute.SELECTIVE, Recompute.NONE]
    spans = [s.recompute_span for s in plan.stages]
    assert spans[0] is None and spans[3] is None
    assert (spans[1].line, spans[1].col, spans[1].end_col) == (*position(src, "stage 1: full"), 16)
    assert spans[2].line == spans[1].line + 1


def test_none_may_be_written_and_a_plan_without_the_section_recomputes_nothing():
    plan = parse_plan(GOOD.replace("stage 2: selective", "stage 2: none"))
    assert plan.recompute() == [Recompute.NONE, Recompute.FULL, Recompute.NONE, Recompute.NONE]
    assert plan.stages[2].recompute_span is not None  # written, so it has a place
    start, end = GOOD.index("recompute {"), GOOD.index("schedule {")
    bare = parse_plan(GOOD[:start] + GOOD[end:])
    assert bare.recompute() == [Recompute.NONE] * 4
    assert not bare.same_as(parse_plan(GOOD))  # same_as compares what stages recompute


def test_entries_may_share_a_line_and_comments_stand_anywhere():
    src = GOOD.replace(
        "recompute {\n  stage 1: full\n  stage 2: selective\n}",
        "recompute { # why\n stage # a\n 1 # b\n : # c\n full  stage 2: selective }  # end",
    )
    assert parse_plan(src).recompute() == parse_plan(GOOD).recompute()


def test_section_order_is_free():
    start, end = GOOD.index("recompute {"), GOOD.index("schedule {")
    section = GOOD[start:end]
    src = GOOD[:start] + GOOD[end:] + section
    assert parse_plan(src).same_as(parse_plan(GOOD))


def test_e170_an_unknown_mode_with_a_did_you_mean():
    src = GOOD.replace("stage 1: full", "stage 1: ful")
    d = only(src, "E170")
    assert d.message == "unknown recompute mode 'ful'"
    assert d.hint == "did you mean 'full'?"
    at(d, src, "ful")  # the mode, not the line
    d = only(GOOD.replace("stage 2: selective", "stage 2: selctive"), "E170")
    assert d.hint == "did you mean 'selective'?"
    d = only(GOOD.replace("stage 2: selective", "stage 2: lazy"), "E170")
    assert d.hint == "the modes are none, full and selective"
    # the stage keeps `none`; the other line still applies
    plan, _ = analyze(src)
    assert plan is not None and plan.recompute()[1:3] == [Recompute.NONE, Recompute.SELECTIVE]


def test_mode_words_that_are_keywords_elsewhere_are_modes_here():
    d = only(GOOD.replace("stage 1: full", "stage 1: stages"), "E170")
    assert d.message == "unknown recompute mode 'stages'"


@pytest.mark.parametrize(
    "partition, stage, count",
    [
        ("stages 4", 9, "4 stages (0..3)"),
        ("stages 4", 4, "4 stages (0..3)"),
        ("stages 1", 1, "1 stage (stage 0)"),
        ("stages 4", 65536, "4 stages (0..3)"),
    ],
)
def test_e171_a_stage_that_does_not_exist_names_the_stage_count(partition, stage, count):
    src = GOOD.replace("stages 4", partition).replace(
        "stage 1: full\n  stage 2: selective", f"stage {stage}: selective"
    )
    d = only(src, "E171")
    assert d.message == f"stage {stage} does not exist: the partition has {count}"
    at(d, src, f"stage {stage}: selective")


def test_e171_not_reported_without_a_partition_or_stages():
    src = GOOD.replace("stages 4\n", "")
    assert [d.code for d in diagnostics(src)] == ["E121"]
    src = GOOD.replace("stages 4", "stages 0")
    d = diagnostics(src, "E171")[0]
    assert d.message == "stage 1 does not exist: the partition has no stages"


def test_e172_a_stage_named_twice_points_at_the_first():
    src = GOOD.replace("stage 2: selective", "stage 2: selective\n  stage 1: selective")
    d = only(src, "E172")
    assert d.message == "stage 1 is named twice in the recompute section"
    at(d, src, "stage 1: selective")
    assert d.hint == f"first at line {position(src, 'stage 1: full')[0]}"
    plan, _ = analyze(src)
    assert plan is not None and plan.recompute()[1] is Recompute.FULL  # the first one holds


def test_e120_the_section_twice():
    src = GOOD.replace("schedule {", "recompute { stage 3: full }\nschedule {")
    d = only(src, "E120")
    assert d.message == "a second recompute section"
    at(d, src, "recompute { stage 3: full }")
    assert d.hint == f"the first is at line {position(src, 'recompute {')[0]}"


def test_stage_numbers_are_bounded():
    from octodsl.limits import MAX_INT

    huge = "9" * 5000
    src = GOOD.replace("stage 1: full", f"stage {huge}: full")
    d = only(src, "E104")
    at(d, src, huge)
    d = only(GOOD.replace("stage 1: full", f"stage {MAX_INT + 1}: full"), "E104")
    assert d.message.startswith(f"{MAX_INT + 1} is too large")


def test_recompute_is_no_header_field():
    d = only(GOOD.replace("microbatches 2", "microbatches 2\n  recompute 1"), "E110")
    assert d.message == "unknown header field 'recompute'"


def test_a_malformed_section_is_a_syntax_error():
    (d,) = diagnostics(GOOD.replace("stage 1: full", "stage 1 full"))
    assert (d.code, d.message) == ("E101", "unexpected 'full'; expected ':'")
    (d,) = diagnostics(GOOD.replace("stage 1: full", "device 1: full"))
    assert (d.code, d.message) == ("E101", "unexpected 'device'; expected '}' or 'stage'")


# -- golden: a good plan (tests/lang/test_fmt.py lays it out) and lint's words for bad ones -----


@pytest.mark.parametrize("name", ["recompute-bad", "zero-no-dp", "dp-negative", "tp-bad"])
def test_golden_lint(name):
    path = GOLDEN / f"{name}.octo"
    src = path.read_text()
    shown = f"golden/{name}.octo"
    _, diags = lint_source(src, shown)
    check_golden(GOLDEN / f"{name}.lint.txt", "".join(d.render(shown, src) + "\n" for d in diags))


def test_golden_good_plan_lints_clean():
    src = (GOLDEN / "recompute.octo").read_text()
    plan, diags = lint_source(src, "recompute.octo")
    assert diags == []
    assert plan is not None and (plan.header.zero, plan.header.dp) == (1, 4)
    assert plan.recompute() == [Recompute.NONE, Recompute.FULL, Recompute.SELECTIVE, Recompute.NONE]


def test_the_diagnostics_doc_shows_what_lint_prints():
    from ..conftest import REPO

    doc = (REPO / "docs" / "diagnostics.md").read_text()
    block = doc.split("lint prints\n\n```\n", 1)[1].split("...\n```", 1)[0]
    assert block and (GOLDEN / "recompute-bad.lint.txt").read_text().startswith(block)
