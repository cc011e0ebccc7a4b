"""fmt: golden layout, idempotence, meaning preserved, comments kept."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from octodsl.cli.fmt import format_source
from octodsl.lang import parse_plan
from octodsl.lint import lint_source

from ..conftest import check_golden

GOLDEN = Path(__file__).parent / "golden"


CASES = ["messy", "recompute", "mesh"]
"""Golden plans: NAME.octo laid out carelessly, NAME.fmt.octo its layout, NAME.expanded.octo its
expanded layout. recompute.octo has `zero` and a recompute section with comments inside;
mesh.octo the mesh fields (tp, sequence_parallel, gpus_per_node)."""


@pytest.mark.parametrize("name", CASES)
def test_golden_layout(name):
    src = (GOLDEN / f"{name}.octo").read_text()
    check_golden(GOLDEN / f"{name}.fmt.octo", format_source(src))


@pytest.mark.parametrize("name", CASES)
def test_golden_expanded(name):
    src = (GOLDEN / f"{name}.octo").read_text()
    check_golden(GOLDEN / f"{name}.expanded.octo", format_source(src, expand=True))


@pytest.mark.parametrize("name", CASES)
def test_idempotent_and_same_plan(name):
    src = (GOLDEN / f"{name}.octo").read_text()
    once = format_source(src)
    assert format_source(once) == once
    assert parse_plan(once).same_as(parse_plan(src))
    expanded = format_source(src, expand=True)
    assert parse_plan(expanded).same_as(parse_plan(src))
    assert format_source(expanded) == expanded


@pytest.mark.parametrize("name", CASES)
def test_every_comment_survives(name):
    src = (GOLDEN / f"{name}.octo").read_text()
    out = format_source(src)
    comments = [line[line.index("#") :].strip() for line in src.splitlines() if "#" in line]
    for c in comments:
        assert c in out


def test_recompute_section_is_kept_in_place_in_canonical_form():
    src = (GOLDEN / "recompute.octo").read_text()
    for out in (format_source(src), format_source(src, expand=True)):
        section = out[out.index("recompute {") : out.index("schedule {")]
        assert section == (
            "recompute {\n  stage 1: full\n  stage 2: selective\n"
            "  # stage 3 keeps everything, and says so\n  stage 3: none\n}\n\n"
        )
        assert out.index("placement loop") < out.index("recompute {")
        assert "  dp 4\n  zero 1  # shard the optimizer state\n" in out


def test_one_line_blocks_keep_their_suppression_comments_working():
    # Split, each block's warnings would point at lines its comment is not on.
    src = (
        'plan "x" { devices 3 microbatches 2 }  # octodsl: ignore[W402]\n'
        "partition { stage 0: layers 0..1 stage 1: layers 2..3 }\n"
        "placement { device 0: stages 0 device 1: stages 1 }  # octodsl: ignore[W401]\n"
        "schedule {\n"
        "  device 0 { (F0:0 & F0:1) BW0:0 BW0:1 }  # octodsl: ignore[W403]\n"
        "  device 1 { F1:0 BW1:0 F1:1 BW1:1 }\n"
        "  device 2 { }  # why device 2 is empty\n"
        "}\n"
    )
    assert lint_source(src)[1] == []
    out = format_source(src)
    assert lint_source(out)[1] == []
    assert format_source(out) == out
    assert "  device 0 { (F0:0 & F0:1) BW0:0 BW0:1 }  # octodsl: ignore[W403]\n" in out
    assert "  device 1 {\n    F1:0 BW1:0 F1:1 BW1:1\n  }\n" in out  # no comment: split
    assert "  device 2 {\n  }  # why device 2 is empty\n" in out  # not a suppression: split
    one_line = "schedule { device 0 { (F0:0 & F0:1) BW0:0 BW0:1 } device 1 { } }"
    src = (
        'plan "x" { devices 2 microbatches 2 }\nstages 2\n'
        + one_line
        + "  # octodsl: ignore[W403]\n"
    )
    assert one_line + "  # octodsl: ignore[W403]\n" in format_source(src)


# -- property tests: random plans in random layouts ---------------------------------------------

ops = st.tuples(st.sampled_from(["F", "B", "W", "BW"]), st.integers(0, 3), st.integers(0, 7))
sep = st.sampled_from([" ", "  ", "\n", "\n\n", " \n   ", "\t"])
# Comments may hold anything but a line feed: line separators of other kinds, a form feed, NUL,
# a byte-order mark, a lone surrogate.
comment = st.text(
    alphabet=list("abc xyz-#\u2028\u2029\f\v\x1c\x1d\x1e\x85\r\x00\ufeff\u200b\ud800é"), max_size=12
).map(lambda t: f"# {t}\n")


@st.composite
def items(draw, depth=0):
    kind = draw(st.integers(0, 3 if depth < 2 else 2))
    if kind == 0:
        k, s, m = draw(ops)
        return f"{k}{s}:{m}"
    if kind == 1:
        k, s, m = draw(ops)
        return f"{k}{s}:{m}..{m + draw(st.integers(0, 3))}"
    if kind == 2:
        (k1, s1, m1), (k2, s2, m2) = draw(ops), draw(ops)
        return f"({k1}{s1}:{m1}{draw(sep)}&{draw(sep)}{k2}{s2}:{m2})"
    var = "ijk"[depth]
    body = draw(st.lists(items(depth + 1), min_size=1, max_size=3))
    body.append(f"F{var}:{var}+1")
    joined = draw(sep).join(body)
    return f"for {var} in 0..{draw(st.integers(0, 2))} {{{draw(sep)}{joined}{draw(sep)}}}"


gap = st.one_of(sep, comment)


@st.composite
def recompute_section(draw) -> str:
    """A recompute section naming some of stages 0..1 (every partition form has them), in any
    order, each entry's tokens apart by any whitespace or comment."""
    stages = draw(st.permutations([0, 1]).flatmap(lambda p: st.integers(0, 2).map(lambda n: p[:n])))
    entries = [
        f"stage{draw(gap)}{s}{draw(gap)}:{draw(gap)}"
        f"{draw(st.sampled_from(['none', 'full', 'selective']))}"
        for s in stages
    ]
    return f"recompute {{{draw(gap)}{draw(gap).join(entries)}{draw(gap)}}}"


@st.composite
def plans(draw):
    header = (
        ["devices 2", "microbatches 8"]
        + draw(st.sampled_from([[], ["zero 0"], ["dp 4", "zero 1"], ["zero 2", "dp 8"]]))
        + draw(
            st.permutations(
                draw(
                    st.sampled_from(
                        [
                            [],
                            ["tp 1"],
                            ["tp 8"],
                            ["tp 2", "sequence_parallel false"],
                            ["sequence_parallel true", "tp 4", "gpus_per_node 4"],
                            ["gpus_per_node 16"],
                            ["runtime megatron"],
                            ["runtime deepspeed", "overlap_p2p_comm false"],
                            ["grad_accum_dtype fp32", "runtime megatron"],
                        ]
                    )
                )
            )
        )
    )
    parts = [
        draw(st.one_of(st.just(""), comment)),
        'plan "p" {',
        draw(sep),
        draw(gap).join(header),
        draw(sep),
        "}",
        draw(sep),
        draw(
            st.sampled_from(
                [
                    "stages 4",
                    'partition "[M-|M*|-M|-]"',
                    "partition { stage 0: layers 0..1 stage 1: layers 2..3 }",
                ]
            )
        ),
        draw(sep),
        draw(st.sampled_from(["placement loop", "placement { device 0: stages 0, 1 }"])),
        draw(sep),
        draw(st.one_of(st.just(""), recompute_section())),
        draw(sep),
        "schedule {",
        draw(sep),
    ]
    for d in range(draw(st.integers(1, 2))):
        body = draw(st.lists(st.one_of(items(), comment), max_size=6))
        parts += [
            f"device {d} {{",
            draw(sep),
            draw(sep).join(body),
            "\n" if body and body[-1].startswith("#") else "",
            draw(sep),
            "}",
            draw(sep),
        ]
    parts.append("}\n")
    return "".join(parts)


@given(plans())
def test_fmt_round_trip(src):
    out = format_source(src)
    assert format_source(out) == out
    plan = parse_plan(src)
    assert parse_plan(out).same_as(plan)
    assert src.count("#") == out.count("#")
    expanded = format_source(src, expand=True)
    assert parse_plan(expanded).same_as(plan)
    assert ("recompute {" in out) == ("recompute {" in expanded) == ("recompute" in src)


# -- line ends: only \n ends a line, whatever a comment holds -----------------------------------

LINE_SEPARATORS = ["\u2028", "\u2029", "\f", "\v", "\x1c", "\x1d", "\x1e", "\x85", "\r"]
"""What str.splitlines() takes for a line end, and the parser (lark) does not."""


@pytest.mark.parametrize("sep", LINE_SEPARATORS, ids=ascii)
def test_line_separators_in_comments_keep_fmt_idempotent(sep):
    src = (
        f'plan "t" {{  # a{sep}b\n  devices 1\n\n  # c{sep}d{sep}e\n  microbatches 1\n}}\n\n'
        f"stages 1\n\n\nplacement loop  # f{sep}\n\nschedule {{\n  device 0 {{\n    F0:0 BW0:0\n  }}\n}}\n"
    )
    once = format_source(src)
    assert format_source(once) == once
    assert parse_plan(once).same_as(parse_plan(src))
    # Comments keep their text (less trailing whitespace); blank lines are those of the source.
    assert f"# a{sep}b" in once and f"# c{sep}d{sep}e" in once
    assert "\n\n  # c" in once and "stages 1\n\nplacement loop  # f\n" in once


@pytest.mark.parametrize("sep", LINE_SEPARATORS, ids=ascii)
def test_excerpt_shows_the_line_the_parser_counted(sep):
    src = (
        f'plan "t" {{ devices 1 microbatches 1 }}  # a{sep}b\nstages 1\n# c{sep}\nplacement loop\n'
        "schedule { device 0 { F0:0 BW0:0 BW0:0 } }\n"
    )
    _, diags = lint_source(src, "t.octo")
    (d,) = diags
    assert d.render("t.octo", src).splitlines()[:3] == [
        "t.octo:5:34: error[E302]: BW0:0 appears twice",
        "  5 | schedule { device 0 { F0:0 BW0:0 BW0:0 } }",
        "    |                                  ^^^^^",
    ]


def test_excerpt_shows_unprintable_characters_as_one_column():
    src = 'plan "t" { devices 1 microbatches 1 }\nstages 1 # \f\x85\nplacement loop\x1c\n'
    _, diags = lint_source(src, "t.octo")
    text = diags[0].render("t.octo", src)
    assert text.splitlines()[:3] == [
        "t.octo:3:15: error[E101]: unexpected character '\\x1c'",
        "  3 | placement loop?",
        "    |               ^",
    ]


def test_excerpt_of_a_long_line_is_cut_around_the_span():
    from octodsl.lang.errors import EXCERPT_LEAD, EXCERPT_WIDTH

    pad = "F0:0 F0:1" + " " * 291  # 300 characters before the duplicate
    src = (
        f'plan "t" {{ devices 1 microbatches 2 }}\nstages 1\nplacement loop\n'
        f"schedule {{ device 0 {{ {pad}BW0:0 BW0:0 {'W0:1 ' * 60}}} }}\n"
    )
    _, diags = lint_source(src, "t.octo")
    d = next(d for d in diags if d.code == "E302" and "BW0:0" in d.message)
    _, line, caret = d.render("t.octo", src).splitlines()[:3]
    col = d.span.col - 1
    shown = src.splitlines()[3][col - EXCERPT_LEAD : col - EXCERPT_LEAD + EXCERPT_WIDTH]
    assert line == f"  4 | ...{shown}..."
    assert caret == "    | " + " " * (3 + EXCERPT_LEAD) + "^" * len("BW0:0")


def test_mesh_fields_keep_their_values_through_fmt():
    src = (GOLDEN / "mesh.octo").read_text()
    for out in (format_source(src), format_source(src, expand=True)):
        h = parse_plan(out).header
        assert (h.tp, h.sequence_parallel, h.dp, h.gpus_per_node) == (4, False, 2, 4)
        assert (
            "  tp 4  # each pipeline device is a tp group of 4 GPUs\n  sequence_parallel false\n"
            in out
        )
