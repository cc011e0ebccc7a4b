"""The header's `ep` (issue 29): hostile values refused in one line each, ep against dp (E705)
and the model's expert counts (E706), a model without experts (W704), each at the `ep` line
with a hint; plans without `ep` read and print as before."""

from __future__ import annotations

import pytest

from octodsl.cli import main
from octodsl.lang import parse_plan

from .header_plans import lint


def only(*entries: str):
    diags, src = lint(*entries)
    assert len(diags) == 1, [d.message for d in diags]
    return diags[0], src


@pytest.mark.parametrize(
    ("value", "code", "says"),
    [
        ("0", "E114", "'ep' must be at least 1"),
        ("-2", "E103", "'-2' is not a number"),
        ("2.5", "E103", "'2.5' is not a number"),
        ("99999999999", "E114", "'ep' must be at most 1,048,576"),
        ('"4"', "E111", "'ep' must be a whole number"),
        ("true", "E111", "'ep' must be a whole number"),
    ],
)
def test_hostile_values_are_refused_in_one_line(value, code, says):
    d, src = only("dp 4", f"ep {value}")
    assert d.code == code and d.message.startswith(says), d.message
    assert d.span.line == 5
    assert "\n" not in d.message


def test_ep_must_divide_dp():
    d, _ = only('model "jamba-v0.1"', "dp 6", "ep 4")
    assert d.code == "E705"
    assert d.message == ("ep 4 does not divide dp 6: the ep group is carved out of the dp copies")
    assert d.hint == "with dp 6, ep 2 divides dp and every expert count"  # not 3 or 6: 16 experts
    d, _ = only("ep 4")  # no dp: 1
    assert d.code == "E705" and d.hint.startswith("with dp 1, only ep 1 fits: give a dp")


def test_ep_must_divide_the_experts():
    d, src = only('model "jamba-v0.1"', "dp 24", "ep 3")
    assert d.code == "E706"
    assert d.message.startswith("ep 3 does not divide the 16 experts of jamba-v0.1")
    assert d.hint == "with dp 24, ep 2, 4 or 8 divide dp and every expert count"
    assert d.span.line == src[: src.index("ep 3")].count("\n") + 1


def test_ep_on_a_model_without_experts_is_a_warning_with_a_hint():
    d, _ = only('model "llama3-8b"', "dp 4", "ep 2")
    assert d.code == "W704" and not d.is_error
    assert "llama3-8b, which has no MoE layers" in d.message
    assert d.hint == "drop 'ep', or name a model with MoE layers"


def test_a_good_ep_lints_clean_and_ep_1_is_not_printed():
    assert lint('model "qwen3-next-80b"', "dp 8", "ep 8")[0] == []
    assert lint("dp 8", "ep 8")[0] == []  # abstract: only dp is checked
    assert lint('model "jamba-v0.1"', "dp 4", "ep 1")[0] == []
    plan = parse_plan(lint("dp 4")[1], "t.octo")
    assert plan.header.ep == 1


def test_gen_writes_ep_only_when_given(capsys):
    assert main(["gen", "1f1b", "-p", "2", "-m", "4", "--dp", "4"]) == 0
    assert "ep" not in capsys.readouterr().out.split("schedule")[0].replace("steady", "")
    assert main(["gen", "1f1b", "-p", "2", "-m", "4", "--dp", "4", "--ep", "2"]) == 0
    header = capsys.readouterr().out.split("}")[0]
    assert "  dp 4\n  ep 2\n" in header


def test_gen_refuses_an_ep_that_does_not_divide_dp(capsys):
    assert main(["gen", "1f1b", "-p", "2", "-m", "4", "--dp", "4", "--ep", "3"]) == 2
    err = capsys.readouterr().err
    assert "error[E705]: ep 3 does not divide dp 4" in err and len(err.strip().splitlines()) == 1
