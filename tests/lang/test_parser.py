"""The front end: what parses into what, and how problems are worded and positioned."""

from __future__ import annotations

from pathlib import Path

import pytest

from octodsl.lang import PlanSyntaxError, analyze, parse_plan
from octodsl.plan import OpKind

HEAD = 'plan "t" { devices 2 microbatches 4 }\n'


def errors(src: str) -> list[str]:
    _, diags = analyze(src, "t.octo")
    return [d.render("t.octo", src) for d in diags]


def test_full_plan():
    plan = parse_plan("""
plan "t" {
  devices 2
  microbatches 4
  model "nemotron-h-8b"
  microbatch_size 2
  seq_len 4096
  dp 8
  memory 80GiB
}
partition "[M-M*|-M-]"
placement { device 0: stages 0 device 1: stages 1 }
schedule {
  device 0 { F0:0..3 for i in 0..3 { (F(3-0*i):i & BW0:i) } }
  device 1 { }
}""")
    h = plan.header
    assert (h.devices, h.microbatches, h.model, h.microbatch_size, h.seq_len, h.dp) == (
        2,
        4,
        "nemotron-h-8b",
        2,
        4096,
        8,
    )
    assert h.memory == 80 * 2**30
    assert [(s.first, s.last, s.symbols) for s in plan.stages] == [(0, 4, "[M-M*"), (5, 8, "-M-]")]
    assert plan.num_stages == 2
    slots = plan.schedule[0]
    assert [str(s) for s in slots[:4]] == ["F0:0", "F0:1", "F0:2", "F0:3"]
    assert slots[4].overlapped and slots[4].ops[0].kind is OpKind.F and slots[4].ops[0].stage == 3


def test_v_placement_needs_twice_the_devices():
    msgs = errors(HEAD + "stages 3 placement v schedule { }")
    assert any("E131" in m and "2 x devices = 4 stages" in m for m in msgs)


def test_syntax_error_names_expected_in_words():
    (msg,) = errors(HEAD + "stages 2 placement loop schedule { device 0 { F0 } }")
    assert "t.octo:2:50: error[E101]: unexpected '}'; expected ':'" in msg
    assert "^" in msg


def test_end_of_file_reported_as_such():
    (msg,) = errors('plan "t" { devices 2\n')
    assert "t.octo:1:21: error[E102]: unexpected end of file" in msg


def test_several_syntax_errors_reported():
    src = (
        HEAD
        + "stages 2\nplacement loop\nschedule {\n device 0 { F0:0 ? }\n device 1 { F1:0 B1: }\n}\n"
    )
    msgs = errors(src)
    assert len(msgs) == 2
    assert "5:18" in msgs[0] and "'?'" in msgs[0]
    assert "6:22" in msgs[1]


def test_header_problems():
    msgs = errors('plan "t" { devcies 2 microbatches 4 microbatches 5 memory "lots" }')
    text = "\n".join(msgs)
    assert "E110" in text and "did you mean 'devices'" in text
    assert "E113" in text and "'microbatches' is given twice" in text
    assert "E111" in text and "'memory' must be a size such as 80GiB" in text
    assert "E112" in text and "does not give 'devices'" in text


def test_zero_devices():
    msgs = errors('plan "t" { devices 0 microbatches 1 }')
    assert any("E114" in m and "'devices'" in m for m in msgs)


def test_missing_sections():
    msgs = "\n".join(errors(HEAD))
    for name in ("partition", "placement", "schedule"):
        assert f"the plan has no {name}" in msgs


def test_loop_problems():
    msgs = "\n".join(
        errors(HEAD + "stages 2 placement loop schedule { device 0 { for i in 3..1 { F0:j } } }")
    )
    assert "E151" in msgs and "3..1 is empty" in msgs


def test_undefined_variable_reported_once():
    msgs = errors(HEAD + "stages 2 placement loop schedule { device 0 { for i in 0..9 { F0:j } } }")
    assert sum("E150" in m for m in msgs) == 1


def test_pattern_symbol_positions():
    (msg,) = [
        m for m in errors(HEAD + 'partition "[M-X|-]" placement loop schedule {}') if "E140" in m
    ]
    assert "t.octo:2:15: error[E140]: 'X' is not a layer symbol" in msg


def test_device_blocks():
    msgs = "\n".join(
        errors(HEAD + "stages 2 placement loop schedule { device 0 {} device 0 {} device 5 {} }")
    )
    assert "E153" in msgs and "E154" in msgs


def test_parse_plan_raises_with_all_errors():
    with pytest.raises(PlanSyntaxError) as e:
        parse_plan('plan "t" { devcies 2 }', "x.octo")
    assert "x.octo:1:12: error[E110]" in str(e.value)


def test_error_recovery_is_bounded(monkeypatch):
    # A long line of garbage: the first error skips its block, so each costs one parse and
    # there are at most MAX_SYNTAX_ERRORS of them.
    from octodsl.lang import parser

    calls = []
    real = parser._syntax_diagnostic
    monkeypatch.setattr(
        parser, "_syntax_diagnostic", lambda e, src: calls.append(1) or real(e, src)
    )
    src = HEAD + "stages 2 placement loop schedule { device 0 { F0:0 " + ": " * 1000 + "} }"
    msgs = errors(src)
    assert msgs and "t.octo:2:52: error[E101]: unexpected ':'" in msgs[0]
    assert len(calls) <= parser.MAX_SYNTAX_ERRORS + 1


def test_byte_order_mark_is_ignored():
    src = "\ufeff" + HEAD + "stages 2 placement loop schedule { device 5 { } }"
    (msg,) = [m for m in errors(src) if "E154" in m]
    assert msg.startswith("t.octo:2:36: error[E154]")
    # Positions on line 1 and its excerpt are those of the text without the mark.
    msg = errors("\ufeff" + HEAD.replace("devices 2", "devices x2"))[0]
    assert msg.startswith("t.octo:1:20:") and '  1 | plan "t" { devices x2' in msg


# -- one test per code, with its position and message ------------------------------------------


def only(src: str, code: str):
    _, diags = analyze(src, "t.octo")
    found = [d for d in diags if d.code == code]
    assert len(found) == 1, [d.render("t.octo", src) for d in diags]
    return found[0]


def where(d) -> tuple[int, int, int, int]:
    s = d.span
    return s.line, s.col, s.end_line, s.end_col


SECTIONS = "stages 2\nplacement loop\nschedule { device 0 { } }\n"


def test_e120_a_section_given_twice():
    src = HEAD + SECTIONS + "placement { device 0: stages 0, 1 }\n"
    d = only(src, "E120")
    assert d.message == "a second placement section"
    assert where(d) == (5, 1, 5, 36)
    assert d.hint == "the first is at line 3"


def test_e121_a_section_missing():
    src = HEAD + "stages 2\nschedule { device 0 { } }\n"
    d = only(src, "E121")
    assert d.message == "the plan has no placement"
    assert where(d) == (1, 1, 1, 38)  # the plan block, for want of a better place
    assert d.hint == "add 'placement loop'"


def test_e130_an_unknown_placement():
    src = HEAD + SECTIONS.replace("placement loop", "placement zigzag")
    d = only(src, "E130")
    assert d.message == "unknown placement 'zigzag'"
    assert where(d) == (3, 1, 3, 17)
    assert "use 'loop', 'v'" in d.hint


def test_e155_a_range_in_an_overlap_group():
    src = HEAD + SECTIONS.replace("device 0 { }", "device 0 { (F0:0..1 & BW1:0) }")
    d = only(src, "E155")
    assert d.message == "an overlap group holds single ops, not ranges"
    assert where(d) == (4, 24, 4, 31)  # the range F0:0..1, not the group


def test_e156_a_loop_variable_hiding_an_outer_one():
    src = HEAD + SECTIONS.replace(
        "device 0 { }", "device 0 { for i in 0..1 { for i in 0..1 { F0:i } } }"
    )
    d = only(src, "E156")
    assert d.message == "loop variable 'i' hides an outer one"
    assert where(d) == (4, 39, 4, 61)  # the inner loop, reported once for both iterations


def test_e205_a_partition_without_stages():
    for partition, width in (("partition { }", 13), ("stages 0", 8)):
        src = HEAD + SECTIONS.replace("stages 2", partition)
        d = only(src, "E205")
        assert d.message == "the partition has no stages"
        assert where(d) == (2, 1, 2, 1 + width)


# -- golden: one error per block, with a hint for the constructs people confuse ----------------


@pytest.mark.parametrize(
    "name",
    [
        "hint-placement",
        "hint-backward",
        "hint-lowercase",
        "hint-torch-csv",
        "hint-partition-count",
        "hint-stages-block",
        "no-partition",
        "op-ranges",
    ],
)
def test_golden_diagnostics(name):
    from octodsl.lint import lint_source

    from ..conftest import check_golden

    golden = Path(__file__).parent / "golden"
    src = (golden / f"{name}.octo").read_text()
    shown = f"golden/{name}.octo"
    _, diags = lint_source(src, shown)
    check_golden(golden / f"{name}.lint.txt", "".join(d.render(shown, src) + "\n" for d in diags))


def test_an_error_skips_the_rest_of_its_block_only():
    src = (
        HEAD + "stages 2 placement { stage 0: device 0\n stage 1: device 1 }\n"
        "schedule { device 0 { F0:0 WB0:0 F0:1 }\n device 1 { F1:0 F1:1 bw1:0 } }"
    )
    msgs = errors(src)
    assert len(msgs) == 3, msgs  # one per block: the placement, device 0, device 1
    assert all("hint:" in m for m in msgs)
