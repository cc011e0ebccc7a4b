"""Every number a plan can hold, and every nesting, is bounded by octodsl.limits: past a limit
the plan is refused at once with a diagnostic at the offending text that names the limit,
instead of a hang, a traceback or an exhausted memory. Values one past each limit are used where
that is cheap, so that without the bound the test fails (a wrong diagnostic) rather than hangs."""

from __future__ import annotations

import pytest

from octodsl import limits
from octodsl.cli import main
from octodsl.cli.fmt import format_source
from octodsl.lang import PlanSyntaxError, analyze
from octodsl.lint import lint_source

HEAD = 'plan "t" {\n  devices 2\n  microbatches 2\n}\n'
GOOD = (
    HEAD
    + """stages 2
placement loop
schedule {
  device 0 { F0:0 F0:1 BW0:0 BW0:1 }
  device 1 { F1:0 BW1:0 F1:1 BW1:1 }
}
"""
)
HUGE = "9" * 5000
DOC = "(docs/language.md#limits)"


def diagnostics(src: str) -> list:
    plan, diags = lint_source(src, "t.octo")
    return diags


def only(src: str, code: str):
    """The one diagnostic of `src`, which has `code`; its rendering names the limits doc."""
    diags = diagnostics(src)
    assert [d.code for d in diags] == [code], "\n".join(d.render("t.octo", src) for d in diags)
    return diags[0]


def position(src: str, needle: str) -> tuple[int, int]:
    """1-based line and column of the first `needle` in `src`."""
    i = src.index(needle)
    return src.count("\n", 0, i) + 1, i - (src.rfind("\n", 0, i) + 1) + 1


def at(d, src: str, needle: str, width: int | None = None) -> None:
    """`d` marks the first `needle` of `src` (its first `width` characters)."""
    assert (d.span.line, d.span.col) == position(src, needle)
    assert (d.span.end_line, d.span.end_col - d.span.col) == (d.span.line, width or len(needle))


# -- numbers ------------------------------------------------------------------------------------

NUMBER_PLACES = [
    ("devices 2", "devices N"),
    ("stages 2", "stages N"),
    ("F0:1 ", "F0:N "),
    ("F1:0 ", "FN:0 "),
    ("device 1 {", "device N {"),
    ("F0:0 F0:1", "F0:0..N"),
]


@pytest.mark.parametrize("old,new", NUMBER_PLACES)
def test_a_5000_digit_number_is_refused_where_it_stands(old, new):
    src = GOOD.replace(old, new.replace("N", HUGE), 1)
    d = only(src, "E104")
    at(d, src, HUGE)
    assert (
        d.message
        == f"a 5000-digit number is too large: a number is at most 1,000,000,000,000 {DOC}"
    )


def test_one_past_max_int_is_refused_and_max_int_is_not():
    src = GOOD.replace("F0:1 ", f"F0:{limits.MAX_INT + 1} ", 1)
    d = only(src, "E104")
    assert d.message.startswith(f"{limits.MAX_INT + 1} is too large")
    # MAX_INT itself is a number; lint then says the micro-batch does not exist.
    assert "E104" not in [
        d.code for d in diagnostics(src.replace(str(limits.MAX_INT + 1), str(limits.MAX_INT)))
    ]


def test_sizes_and_every_other_number_place():
    src = HEAD.replace("}", f"  memory {HUGE}GiB\n}}") + GOOD[len(HEAD) :]
    at(only(src, "E104"), src, HUGE + "GiB")
    for text in (
        f"partition {{ stage 0: layers 0..{HUGE} }}",
        f"placement {{ device 0: stages {HUGE} }}",
    ):
        diags = diagnostics(HEAD + text)
        assert [d.code for d in diags] == ["E104"]


@pytest.mark.parametrize("written", ["1e8", "1.5", "80Gib", "2x", "1_000"])
def test_malformed_numbers_say_what_a_number_looks_like(written):
    # On lines of their own, as people write them: one diagnostic, not one per piece.
    src = GOOD.replace("devices 2", f"devices {written}")
    d = only(src, "E103")
    at(d, src, written)
    assert d.message == f"'{written}' is not a number"
    assert "decimal digits only" in d.hint and "80GiB" in d.hint


def test_header_values_name_their_limit():
    src = GOOD.replace("devices 2", f"devices {limits.MAX_DEVICES + 1}")
    d = only(src, "E114")
    assert d.message == f"'devices' must be at most 4096 {DOC}"
    at(d, src, str(limits.MAX_DEVICES + 1))
    src = GOOD.replace("microbatches 2", f"microbatches {limits.MAX_MICROBATCHES + 1}")
    assert only(src, "E114").message == f"'microbatches' must be at most 65,536 {DOC}"
    src = GOOD.replace("devices 2", "devices 0")
    assert only(src, "E114").message == "'devices' must be at least 1"


def test_a_range_is_counted_before_it_is_unrolled():
    for last in (limits.MAX_OPS, 10**12):  # MAX_OPS + 1 ops; the issue's example
        src = GOOD.replace("F0:0 F0:1", f"F0:0..{last}")
        d = only(src, "E157")
        at(d, src, f"F0:0..{last}")
        assert (
            d.message
            == f"F0:0..{last} takes the plan past the limit: a plan has at most 1,000,000 ops {DOC}"
        )


def test_ops_count_over_the_whole_plan():
    half = limits.MAX_OPS // 2
    src = GOOD.replace("F0:0 F0:1", f"F0:0..{half}").replace(
        "F1:0 BW1:0", f"F1:0..{half - 1} BW1:0"
    )
    assert "E157" in [d.code for d in diagnostics(src)]


def test_a_loop_bodys_repeated_op_is_counted_on_every_iteration():
    # The second iteration reuses the first one's slots (lower._Unroller.constant): still counted.
    src = GOOD.replace("F0:0 F0:1", "for i in 0..1 { F0:0..600000 } F0:0 F0:1")
    d = only(src, "E157")
    at(d, src, "F0:0..600000")
    assert analyze(src)[0] is None


def test_loop_iterations_are_counted_before_unrolling():
    src = GOOD.replace("F0:0 F0:1", "for i in 0..1000000000000 {} F0:0 F0:1")
    d = only(src, "E158")
    at(d, src, "for i in 0..1000000000000 {}")
    assert d.message == (
        "the loop over 0..1000000000000 takes the plan's loops past the limit: loops "
        f"iterate at most 1,000,000 times in all {DOC}"
    )


def test_nested_loops_count_every_iteration():
    # 1000 outer iterations and 1000 x 999 inner ones are exactly the limit; one more is not.
    ok = "for i in 0..999 { for j in 0..998 { } }"
    assert "E158" not in [d.code for d in diagnostics(GOOD.replace("F0:0 F0:1", ok + " F0:0 F0:1"))]
    over = "for i in 0..999 { for j in 0..999 { } }"
    src = GOOD.replace("F0:0 F0:1", over + " F0:0 F0:1")
    at(only(src, "E158"), src, "for j in 0..999 { }")


def test_an_index_expression_beyond_max_int_stops_unrolling():
    src = GOOD.replace("F0:1 ", "F0:1000000*1000001 ")
    d = only(src, "E159")
    at(d, src, "1000000*1000001")
    assert (
        d.message
        == f"the value of 1000000*1000001 is too large: an index is at most 1,000,000,000,000 {DOC}"
    )
    # Evaluated once per iteration, reported once.
    src = GOOD.replace("F0:1 ", "for i in 0..999 { F0:i*1000000000000 } ")
    assert [d.code for d in diagnostics(src)] == ["E159"]


def test_stage_and_layer_counts():
    src = GOOD.replace("stages 2", f"stages {limits.MAX_STAGES + 1}")
    d = only(src, "E207")
    assert d.message == f"65,537 stages: a plan has at most 65,536 stages {DOC}"
    src = GOOD.replace(
        "stages 2", f"partition {{ stage 0: layers 0..9 stage 1: layers 10..{limits.MAX_LAYERS} }}"
    )
    d = only(src, "E207")
    at(d, src, f"stage 1: layers 10..{limits.MAX_LAYERS}")
    assert d.message == f"layer 65,536: a model has at most 65,536 layers {DOC}"
    src = GOOD.replace("stages 2", 'partition "' + "M" * (limits.MAX_LAYERS + 1) + '"')
    assert (
        only(src, "E207").message
        == f"a pattern of 65,537 layers: a model has at most 65,536 layers {DOC}"
    )


def test_stages_times_microbatches_bounded_before_lint_walks_them():
    # 10 stages x 50,000 micro-batches need exactly MAX_OPS ops: linted (every op missing);
    # one more micro-batch and the plan cannot be written within MAX_OPS at all.
    head = HEAD.replace("devices 2", "devices 10")
    ok = (
        head.replace("microbatches 2", "microbatches 50000")
        + "stages 10 placement loop schedule { }"
    )
    assert {d.code for d in diagnostics(ok)} == {"E301"}
    src = (
        head.replace("microbatches 2", "microbatches 50001")
        + "stages 10 placement loop schedule { }"
    )
    d = only(src, "E157")
    assert d.message == (
        "10 stages and 50,001 micro-batches need 1,000,020 ops or more: "
        f"a plan has at most 1,000,000 ops {DOC}"
    )
    at(d, src, "stages 10")


# -- nesting -------------------------------------------------------------------------------------


def nested_loops(depth: int) -> str:
    loops = "".join(f"for v{k} in 0..0 {{ " for k in range(depth))
    return GOOD.replace("F0:0 F0:1", loops + "}" * depth + " F0:0 F0:1")


def test_loops_nest_at_most_max_nesting_deep():
    assert diagnostics(nested_loops(limits.MAX_NESTING)) == []
    for depth in (limits.MAX_NESTING + 1, 500):
        src = nested_loops(depth)
        d = only(src, "E105")
        at(d, src, f"for v{limits.MAX_NESTING} ", width=3)  # its keyword
        assert d.message == f"loops nested 65 deep: loops nest at most 64 deep {DOC}"


def test_an_expression_has_at_most_max_nesting_operators():
    def plan(terms: int) -> str:
        return GOOD.replace("F0:1 ", "F0:" + "+".join(["0"] * (terms - 1) + ["1"]) + " ")

    assert diagnostics(plan(limits.MAX_NESTING + 1)) == []  # 64 operators
    for terms in (limits.MAX_NESTING + 2, 500):
        src = plan(terms)
        d = only(src, "E105")
        at(d, src, "+".join(["0"] * (terms - 1) + ["1"]))
        assert (
            d.message
            == f"an expression of {terms - 1} operators: an expression has at most 64 operators {DOC}"
        )


def test_parentheses_nest_at_most_max_nesting_deep():
    def plan(depth: int) -> str:
        return GOOD.replace("F0:1 ", "F0:" + "(" * depth + "1" + ")" * depth + " ")

    assert diagnostics(plan(limits.MAX_NESTING)) == []
    src = plan(limits.MAX_NESTING + 1)
    d = only(src, "E105")
    assert (d.span.line, d.span.col) == (8, position(src, "(")[1] + limits.MAX_NESTING)
    assert d.message == f"parentheses nested 65 deep: parentheses nest at most 64 deep {DOC}"
    assert [d.code for d in diagnostics(plan(10_000))] == ["E105"]


@pytest.mark.parametrize(
    "src", [nested_loops(500), GOOD.replace("F0:1 ", "F0:" + "+".join(["1"] * 3000) + " ")]
)
def test_fmt_refuses_what_lint_refuses(src):
    with pytest.raises(PlanSyntaxError) as e:
        format_source(src)
    assert [d.code for d in e.value.diagnostics] == ["E105"]


# -- fmt --expand --------------------------------------------------------------------------------


def test_fmt_expand_of_a_huge_loop_is_refused(tmp_path, capsys):
    src = GOOD.replace("F0:0 F0:1", "for i in 0..1000000000000 { F0:0 } F0:0 F0:1")
    with pytest.raises(PlanSyntaxError) as e:
        format_source(src, expand=True)
    assert [d.code for d in e.value.diagnostics] == ["E158"]
    assert format_source(src) != ""  # unexpanded, the loop is just text
    f = tmp_path / "loop.octo"
    f.write_text(src)
    assert main(["fmt", "--expand", str(f)]) == 1
    assert f"{f}:8:14: error[E158]" in capsys.readouterr().err
    assert f.read_text() == src


def test_cli_lint_of_each_example_of_the_issue(tmp_path, capsys):
    for name, src in {
        "digits": GOOD.replace("devices 2", "devices " + HUGE),
        "devices": GOOD.replace("devices 2", "devices 1e8"),
        "microbatches": GOOD.replace("microbatches 2", "microbatches 1e9"),
        "range": GOOD.replace("F0:0 F0:1", "F0:0..1000000000000"),
        "loop": GOOD.replace("F0:0 F0:1", "for i in 0..1000000000000 {} F0:0 F0:1"),
        "nest": nested_loops(500),
        "sum": GOOD.replace("F0:1 ", "F0:" + "+".join(["1"] * 500) + " "),
    }.items():
        f = tmp_path / f"{name}.octo"
        f.write_text(src)
        assert main(["lint", str(f)]) == 1, name
        err = capsys.readouterr().err
        assert "internal error" not in err and "Traceback" not in err
        assert f"{f}:" in err and "1 error" in err, err


def test_lower_builds_no_plan_past_a_limit():
    plan, diags = analyze(GOOD.replace("F0:0 F0:1", "F0:0..1000000000000"))
    assert plan is None and [d.code for d in diags] == ["E157"]
