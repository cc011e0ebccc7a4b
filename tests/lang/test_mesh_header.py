"""The header's mesh fields `tp`, `sequence_parallel` and `gpus_per_node`: what they lower to,
and each bad value's code, position, message and hint (huge, zero, negative, fractional,
quoted, of the wrong kind, given twice)."""

from __future__ import annotations

import pytest

from octodsl.lang import analyze, parse_plan
from octodsl.limits import MAX_GPUS_PER_NODE, MAX_TP

HEAD = 'plan "t" {\n  devices 2\n  microbatches 2\n  ENTRY\n}\n'
BODY = """stages 2
placement loop
schedule {
  device 0 { F0:0 F0:1 BW0:0 BW0:1 }
  device 1 { F1:0 BW1:0 F1:1 BW1:1 }
}
"""


def plan_with(entry: str) -> str:
    return HEAD.replace("ENTRY", entry) + BODY


def only(src: str):
    """The one diagnostic of `src`."""
    _, diags = analyze(src, "t.octo")
    assert len(diags) == 1, [d.render("t.octo", src) for d in diags]
    return diags[0]


def at(d, src: str, needle: str) -> None:
    """`d` marks exactly the first `needle` of `src`."""
    i = src.index(needle)
    line, col = src.count("\n", 0, i) + 1, i - (src.rfind("\n", 0, i) + 1) + 1
    assert (d.span.line, d.span.col, d.span.end_line, d.span.end_col) == (
        line,
        col,
        line,
        col + len(needle),
    )


def test_defaults_when_not_given():
    h = parse_plan(plan_with("")).header
    assert (h.tp, h.sequence_parallel, h.sp, h.gpus_per_node) == (1, None, False, 8)


@pytest.mark.parametrize(
    "entry, tp, sp, written_sp, gpus",
    [
        ("tp 8", 8, True, None, 8),
        ("tp 4 sequence_parallel false", 4, False, False, 8),
        ("tp 2\n  sequence_parallel true\n  gpus_per_node 4", 2, True, True, 4),
        (f"tp {MAX_TP} gpus_per_node {MAX_GPUS_PER_NODE}", MAX_TP, True, None, MAX_GPUS_PER_NODE),
        ("gpus_per_node 1", 1, False, None, 1),
    ],
)
def test_mesh_fields_lower(entry, tp, sp, written_sp, gpus):
    h = parse_plan(plan_with(entry)).header
    assert (h.tp, h.sp, h.sequence_parallel, h.gpus_per_node) == (tp, sp, written_sp, gpus)
    assert set(h.spans) >= {k for k in ("tp", "sequence_parallel", "gpus_per_node") if k in entry}


@pytest.mark.parametrize(
    "entry, needle, code, message, hint",
    [
        ("tp 0", "0", "E114", "'tp' must be at least 1", None),
        (
            f"tp {MAX_TP + 1}",
            str(MAX_TP + 1),
            "E114",
            f"'tp' must be at most {MAX_TP} (docs/language.md#limits)",
            None,
        ),
        ("gpus_per_node 0", "0", "E114", "'gpus_per_node' must be at least 1", None),
        (
            f"gpus_per_node {MAX_GPUS_PER_NODE + 1}",
            str(MAX_GPUS_PER_NODE + 1),
            "E114",
            f"'gpus_per_node' must be at most {MAX_GPUS_PER_NODE} (docs/language.md#limits)",
            None,
        ),
        (
            "tp 99999999999999999999",
            "99999999999999999999",
            "E104",
            "99999999999999999999 is too large: a number is at most 1,000,000,000,000 "
            "(docs/language.md#limits)",
            None,
        ),
        (
            "tp -2",
            "-2",
            "E103",
            "'-2' is not a number: a plan's numbers have no sign",
            "'tp' is at least 1",
        ),
        (
            "gpus_per_node -8",
            "-8",
            "E103",
            "'-8' is not a number: a plan's numbers have no sign",
            "'gpus_per_node' is at least 1",
        ),
        ("tp 2.5", "2.5", "E103", "'2.5' is not a number", None),
        ('tp "2"', '"2"', "E111", "'tp' must be a whole number, not \"2\"", None),
        ("tp eight", "eight", "E111", "'tp' must be a whole number, not eight", None),
        (
            "gpus_per_node 8GiB",
            "8GiB",
            "E111",
            "'gpus_per_node' must be a whole number, not 8GiB",
            None,
        ),
        (
            "sequence_parallel yes",
            "yes",
            "E111",
            "'sequence_parallel' must be true or false, not yes",
            None,
        ),
        (
            "sequence_parallel 1",
            "1",
            "E111",
            "'sequence_parallel' must be true or false, not 1",
            None,
        ),
        (
            'sequence_parallel "true"',
            '"true"',
            "E111",
            "'sequence_parallel' must be true or false, not \"true\"",
            None,
        ),
        (
            "sequence_parallel 1GiB",
            "1GiB",
            "E111",
            "'sequence_parallel' must be true or false, not 1GiB",
            None,
        ),
    ],
)
def test_bad_values(entry, needle, code, message, hint):
    src = plan_with(entry)
    d = only(src)
    assert (d.code, d.message) == (code, message)
    if hint is not None:
        assert d.hint == hint
    at(d, src, needle)


def test_a_field_given_twice_is_refused_and_the_first_kept():
    src = plan_with("tp 2\n  sequence_parallel false\n  tp 4\n  sequence_parallel true")
    _, diags = analyze(src, "t.octo")
    assert [(d.code, d.message, d.hint) for d in diags] == [
        ("E113", "'tp' is given twice", "first given at line 4"),
        ("E113", "'sequence_parallel' is given twice", "first given at line 5"),
    ]
    plan, _ = analyze(src)
    assert plan is not None and (plan.header.tp, plan.header.sequence_parallel) == (2, False)


def test_a_misspelt_field_gets_a_did_you_mean():
    d = only(plan_with("gpus_per_nod 8"))
    assert (d.code, d.hint) == ("E110", "did you mean 'gpus_per_node'?")
    d = only(plan_with("sequence_paralel true"))
    assert (d.code, d.hint) == ("E110", "did you mean 'sequence_parallel'?")


def test_true_and_false_stay_names_elsewhere():
    # `model true` names a model called true: only sequence_parallel reads a boolean
    assert parse_plan(plan_with("model true")).header.model == "true"
