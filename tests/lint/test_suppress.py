"""Suppression comments (`# octodsl: ignore[W401]`, `# octodsl: ignore-file[W402]`): what they
silence, what they never silence, what is reported of them, and that fmt keeps them working."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from octodsl.cli import main
from octodsl.cli.fmt import format_source
from octodsl.lang.errors import MAX_PER_LINE, Diagnostic
from octodsl.lint import lint_source
from octodsl.lint.suppress import apply_suppressions

from ..conftest import REPO, check_golden

GOLDEN = Path(__file__).parent / "golden"
NAMES = ["suppress", "suppress-bad", "suppress-errors"]

PLAN = """plan "t" {{
  devices 4
  microbatches 2{mb}
  zero 1{zero}
}}
stages 2
placement loop{placement}
schedule {{
  device 0 {{ F0:0 F0:1 BW0:0 BW0:1 }}
  device 1 {{ F1:0 BW1:0 F1:1 BW1:1 }}
}}
"""
LINES = {"mb": 3, "zero": 4, "placement": 7}
"""Where PLAN takes a trailing comment: the line of each place."""
WARNINGS = [("W402", 3), ("W404", 4), ("W401", 7), ("W401", 7)]
"""What PLAN reports without suppressions: (code, line)."""


def plan(head: str = "", **comments: str) -> str:
    """PLAN with `head` above it and `comments` ('mb', 'zero', 'placement') ending those lines."""
    return head + PLAN.format(**{place: comments.get(place, "") for place in LINES})


def lint(src: str) -> list[Diagnostic]:
    return lint_source(src, "t.octo")[1]


def found(src: str) -> list[tuple[str, int | None]]:
    return [(d.code, d.span.line if d.span else None) for d in lint(src) for _ in range(d.count)]


def test_the_plan_reports_what_the_tests_say_it_does():
    assert sorted(found(plan())) == sorted(WARNINGS)


@pytest.mark.parametrize("name", NAMES)
def test_golden(name):
    src = (GOLDEN / f"{name}.octo").read_text()
    shown = f"golden/{name}.octo"
    check_golden(
        GOLDEN / f"{name}.lint.txt", "".join(d.render(shown, src) + "\n" for d in lint(src))
    )


@pytest.mark.parametrize("name", NAMES)
def test_fmt_keeps_every_suppression_where_it_works(name):
    src = (GOLDEN / f"{name}.octo").read_text()
    assert format_source(src) == src  # the golden files are laid out as fmt lays them out
    assert format_source(src, expand=True).count("# octodsl:") == src.count("# octodsl:")


def test_fmt_of_an_unformatted_plan_keeps_its_suppressions_working():
    src = plan(mb="  # octodsl: ignore[W402]", placement="  # octodsl: ignore[W401]")
    formatted = format_source(src)
    assert formatted != src and found(formatted) == found(src) == [("W404", 4)]


def test_a_line_suppression_silences_its_codes_on_its_line_only():
    assert found(plan(mb="  # octodsl: ignore[W402, W404]")) == [
        ("W803", 3),
        ("W404", 4),
        ("W401", 7),
        ("W401", 7),
    ]  # W404 is on line 4, not 3
    assert found(plan(placement="  # octodsl: ignore[W401] both devices")) == [
        ("W402", 3),
        ("W404", 4),
    ]


def test_a_file_suppression_silences_its_codes_everywhere():
    head = "# a plan for a quick test\n\n# octodsl: ignore-file[W401,W402]\n"
    assert found(plan(head)) == [("W404", 7)]


def test_a_file_suppression_silences_a_warning_without_a_position_a_line_one_does_not():
    bare = Diagnostic("W401", "device 3 holds no stage")
    line_only = "plan 'x' {  # octodsl: ignore[W401]\n"
    assert apply_suppressions("# octodsl: ignore-file[W401]\nplan", [bare]) == []
    assert apply_suppressions(line_only, [bare])[0] is bare


def test_a_line_suppression_is_used_before_the_file_one():
    head = "# octodsl: ignore-file[W402]\n"
    assert found(plan(head, mb="  # octodsl: ignore[W402]")) == [
        ("W803", 1),
        ("W404", 5),
        ("W401", 8),
        ("W401", 8),
    ]


def test_errors_are_never_silenced():
    src = plan("# octodsl: ignore-file[E302]\n").replace(
        "BW0:1 }", "BW0:1 BW0:1 }  # octodsl: ignore[E302]"
    )
    codes = found(src)
    assert ("E302", 10) in codes and [w for w in codes if w[0] == "W802"] == [
        ("W802", 1),
        ("W802", 10),
    ]


def test_a_plan_with_errors_is_still_refused_by_the_commands_that_run_it(tmp_path, capsys):
    f = tmp_path / "p.octo"
    f.write_text(plan("# octodsl: ignore-file[E302]\n").replace("BW0:1 }", "BW0:1 BW0:1 }"))
    assert main(["simulate", str(f)]) == 1
    assert "1 error" in capsys.readouterr().err


def test_unused_suppressions_wait_until_the_file_has_no_error():
    clean = plan(placement="  # octodsl: ignore[W401, W403]")
    assert ("W803", 7) in found(clean)
    broken = clean.replace("BW1:1 }", "BW1:1 BW1:1 }")
    assert "W803" not in [c for c, _ in found(broken)]


def test_silenced_warnings_are_not_counted_and_do_not_fail_strict(tmp_path, capsys):
    f = tmp_path / "p.octo"
    f.write_text(plan("# octodsl: ignore-file[W401, W402, W404]\n"))
    assert main(["lint", "--strict", str(f)]) == 0
    assert capsys.readouterr().out.strip() == f"{f}: ok"
    f.write_text(plan("# octodsl: ignore-file[W401, W402]\n"))
    assert main(["lint", "--strict", str(f)]) == 1
    assert "0 errors, 1 warning" in capsys.readouterr().err


def test_only_a_comment_that_starts_so_is_a_suppression_comment():
    for text in (
        'plan "# octodsl: ignore[W402]" {',
        '# made by octodsl gen\nplan "t" {',
        '# see octodsl: docs\nplan "t" {',
    ):
        assert [c for c, _ in found(plan().replace('plan "t" {', text, 1))] == [
            c for c, _ in WARNINGS
        ]
    src = plan().replace('plan "t" {', '#octodsl:generated\nplan "t" {', 1)
    assert [c for c, _ in found(src)][:2] == ["W804", "W402"]


def test_positions_count_as_the_parser_does_with_a_bom_crlf_and_tabs():
    src = "\ufeff" + plan(mb="\t# octodsl: ignore[W402, W999]").replace("\n", "\r\n")
    (d,) = [d for d in lint(src) if d.code == "W801"]
    line = "  microbatches 2\t# octodsl: ignore[W402, W999]"
    assert (d.span.line, d.span.col, d.span.end_col) == (
        3,
        line.index("W999") + 1,
        line.index("W999") + 5,
    )
    shown, caret = d.render("t.octo", src).splitlines()[1:3]
    assert caret.index("^") == shown.index("W999")  # the excerpt shows the tab as one space


def test_the_docs_example_lints_clean_and_without_its_suppressions_warns():
    doc = (REPO / "docs" / "language.md").read_text()
    section = doc.split("## Suppression comments\n", 1)[1]
    example = re.search(r"```octo\n(.*?)```", section, re.S).group(1)
    assert lint(example) == [] and format_source(example) == example
    bare = re.sub(r"  # octodsl:.*|# octodsl:.*\n", "", example)
    assert found(bare) == [("W402", 4), ("W401", 9), ("W401", 9)]


# -- hostile comments: every one bounded in output (and, at this size, in time: a pass quadratic
# in the codes would run for hours, which the suite's own time shows; no clock in a unit test) ---

N = 100_000


@pytest.mark.parametrize(
    "codes, code, count",
    [
        (", ".join(["W999"] * N), "W801", N),  # unknown
        (
            ", ".join(["W401"] * N),
            "W803",
            N - 1,
        ),  # the first silences the W401s, the rest repeat it
        ("," * N, "W804", N + 1),  # empty codes
        (", ".join(["E302"] * N), "W802", N),  # errors
    ],
)
def test_a_comment_of_a_hundred_thousand_codes(codes, code, count):
    diags = lint(plan(placement=f"  # octodsl: ignore[{codes}]"))
    of_code = [d for d in diags if d.code == code]
    assert len(of_code) == MAX_PER_LINE and sum(d.count for d in of_code) == count
    assert all(len(d.render("t.octo", "x")) < 400 for d in diags)


def test_a_hundred_thousand_suppression_comments():
    # apply_suppressions alone: the parser's own reading of so many comments is the parser's cost
    head = "# octodsl: ignore-file[W402]\n" * N + "# octodsl: ignore[W401]\n" * N
    diags = apply_suppressions(plan(head), [])
    assert sorted({d.code for d in diags}) == ["W803", "W804"]
    assert [sum(d.code == c for d in diags) for c in ("W803", "W804")] == [
        N,
        N,
    ]  # N - 1 twice, 1 unused
    assert sum(d.code == "W803" and d.span.line == 1 for d in diags) == 1


@pytest.mark.parametrize(
    "comment, code",
    [
        ("# octodsl: ignore[W401", "W804"),  # no closing bracket
        ("# octodsl: ignore W401", "W804"),
        ("# octodsl:", "W804"),
        ("# octodsl: ignore[]", "W804"),
        ("# octodsl: ignore[ ,  ]", "W804"),
        ("# octodsl: ignore[[W401]]", "W801"),  # '[W401' is no code; the ']' after is free text
        ("# octodsl: ignore[W401 W402]", "W801"),  # codes are separated by commas
        ("# octodsl: ignore[\x00\u2028W401]", "W801"),
    ],
)
def test_a_malformed_comment_is_reported_and_silences_nothing(comment, code):
    codes = [c for c, _ in found(plan(placement="  " + comment))]
    assert code in codes and codes.count("W401") == 2


# -- the rule, as a property: a warning is shown unless its line or the file names its code ------

SILENCEABLE = ["W401", "W402", "W403", "W404"]


@given(
    st.dictionaries(
        st.sampled_from(sorted(LINES)), st.sets(st.sampled_from(SILENCEABLE), min_size=1)
    ),
    st.sets(st.sampled_from(SILENCEABLE)),
)
def test_shown_are_the_warnings_neither_their_line_nor_the_file_names(on_line, whole_file):
    head = f"# octodsl: ignore-file[{', '.join(sorted(whole_file))}]\n" if whole_file else ""
    shift = 1 if head else 0
    warnings = [(c, n + shift) for c, n in WARNINGS]
    named = {LINES[place] + shift: codes for place, codes in on_line.items()}
    by_line = [(c, n) for c, n in warnings if c in named.get(n, set())]
    by_file = [(c, n) for c, n in warnings if (c, n) not in by_line and c in whole_file]
    unused = sorted(
        [n for n, codes in named.items() for c in codes if (c, n) not in by_line]
        + [1 for c in whole_file if c not in {c for c, _ in by_file}]
    )

    got = found(
        plan(
            head,
            **{
                place: f"  # octodsl: ignore[{', '.join(sorted(codes))}]"
                for place, codes in on_line.items()
            },
        )
    )
    assert [w for w in got if w[0] != "W803"] == [w for w in warnings if w not in by_line + by_file]
    assert sorted(n for c, n in got if c == "W803") == unused
