"""Lint rules on small hand-written plans."""

from __future__ import annotations

import pytest

from octodsl.lint import lint_source

HEAD = 'plan "t" { devices 2 microbatches 2 }\n'
ONE_F_ONE_B = """
stages 2
placement loop
schedule {
  device 0 { F0:0 F0:1 BW0:0 BW0:1 }
  device 1 { F1:0 BW1:0 F1:1 BW1:1 }
}
"""


def codes(src: str) -> list[str]:
    _, diags = lint_source(HEAD + src, "t.octo")
    return [d.code for d in diags]


def messages(src: str) -> str:
    full = HEAD + src
    _, diags = lint_source(full, "t.octo")
    return "\n".join(d.render("t.octo", full) for d in diags)


def test_clean():
    assert codes(ONE_F_ONE_B) == []


def test_partition_gap_overlap_empty():
    src = ONE_F_ONE_B.replace("stages 2", "partition { stage 0: layers 0..3 stage 1: layers 5..4 }")
    assert codes(src) == ["E202"]
    src = ONE_F_ONE_B.replace("stages 2", "partition { stage 0: layers 0..3 stage 1: layers 5..7 }")
    assert "layer 4 is in no stage" in messages(src)
    src = ONE_F_ONE_B.replace("stages 2", "partition { stage 0: layers 0..3 stage 1: layers 2..7 }")
    assert "layers 2..3 already belong to an earlier stage" in messages(src)


def test_stage_declared_out_of_order():
    src = ONE_F_ONE_B.replace("stages 2", "partition { stage 1: layers 0..3 stage 0: layers 4..7 }")
    assert codes(src).count("E203") == 2


def test_placement_errors():
    src = ONE_F_ONE_B.replace(
        "placement loop", "placement { device 0: stages 0, 1 device 1: stages 1 }"
    )
    assert "E210" in codes(src)
    src = ONE_F_ONE_B.replace("placement loop", "placement { device 0: stages 0 }")
    out = messages(src)
    assert "E211" in out and "stage 1 is on no device" in out
    src = ONE_F_ONE_B.replace(
        "placement loop", "placement { device 0: stages 0 device 3: stages 1, 4 }"
    )
    assert {"E212", "E213"} <= set(codes(src))


def test_missing_duplicate_out_of_range_ops():
    src = ONE_F_ONE_B.replace("F1:0 BW1:0", "F1:0 F1:0 BW1:0 BW1:7")
    out = messages(src)
    assert "F1:0 appears twice" in out
    assert "micro-batch 7 does not exist" in out
    src = ONE_F_ONE_B.replace("BW0:1 }", "}")
    assert "stage 0 has no BW for micro-batch 1" in messages(src)


def test_split_backward_needs_w():
    src = ONE_F_ONE_B.replace("BW1:0", "B1:0").replace("BW1:1", "B1:1 W1:0")
    out = messages(src)
    assert "stage 1 has no W for micro-batch 1" in out
    assert "E304" in messages(ONE_F_ONE_B.replace("BW1:1", "B1:1 W1:1"))


def test_op_on_wrong_device():
    src = ONE_F_ONE_B.replace("device 0 { F0:0", "device 0 { F1:9 F0:0").replace(
        "BW1:1 }", "BW1:1 F0:9 }"
    )
    assert codes(src).count("E303") == 2
    src = ONE_F_ONE_B.replace("F0:1 BW0:0", "BW0:0").replace("F1:1", "F0:1 F1:1")
    out = messages(src)
    assert "F0:1 runs on device 1, but stage 0 is on device 0" in out


def test_deadlock_cycle_is_named():
    # Device 0 runs both backwards before device 1's first forward can receive anything back.
    src = ONE_F_ONE_B.replace(
        "device 1 { F1:0 BW1:0 F1:1 BW1:1 }", "device 1 { F1:1 BW1:1 F1:0 BW1:0 }"
    ).replace("F0:0 F0:1 BW0:0 BW0:1", "F0:0 BW0:0 F0:1 BW0:1")
    out = messages(src)
    assert "E310" in out
    assert "F1:1 on device 1 waits for F0:1 on device 0, queued behind BW0:0" in out
    assert "BW0:0 on device 0 waits for BW1:0 on device 1, queued behind F1:1" in out


def test_self_deadlock_and_overlap_group():
    src = ONE_F_ONE_B.replace("F1:0 BW1:0", "BW1:0 F1:0")
    out = messages(src)
    assert "device 1 waits for an op it runs later" in out
    src = ONE_F_ONE_B.replace("F1:0 BW1:0", "(F1:0 & BW1:0)")
    assert "in the same overlap group" in messages(src)


def test_deadlock_not_searched_when_structure_is_broken():
    src = ONE_F_ONE_B.replace("F1:0 BW1:0", "BW1:0")
    assert "E310" not in codes(src)


def test_warnings():
    src = (
        ONE_F_ONE_B.replace("stages 2", "stages 1")
        .replace("F1:0 BW1:0 F1:1 BW1:1", "")
        .replace("placement loop", "placement { device 0: stages 0 }")
    )
    assert codes(src) == ["W401"]
    src = ONE_F_ONE_B.replace("F1:0 BW1:0 F1:1 BW1:1", "F1:0 (BW1:0 & F1:1) BW1:1")
    assert codes(src) == []
    src = ONE_F_ONE_B.replace("F1:0 BW1:0 F1:1 BW1:1", "(F1:0 & F1:1) BW1:0 BW1:1")
    assert codes(src) == ["W403"]
    few = 'plan "t" { devices 2 microbatches 1 }\nstages 2 placement loop schedule { device 0 { F0:0 BW0:0 } device 1 { F1:0 BW1:0 } }'
    _, diags = lint_source(few)
    assert [d.code for d in diags] == ["W402"]


def test_partition_checked_against_the_model():
    head = 'plan "t" { devices 2 microbatches 2 model "nemotron-h-8b" }\n'
    src = head + ONE_F_ONE_B.replace("stages 2", 'partition "[M-M*|-M-]"')
    _, diags = lint_source(src)
    text = "\n".join(d.render("t", src) for d in diags)
    assert "layers 9..53 are in no stage" in text and "the model has 54 layers" in text
    assert "E204" in text and "differs from the model's at layer 4" in text
    _, diags = lint_source(src.replace("nemotron-h-8b", "no-such-model"))
    assert [d.code for d in diags] == ["E206"]


def test_memory_limit_checked_by_simulation():
    from octodsl.gen import generate_text

    text = generate_text("1f1b", devices=4, microbatches=8, model="nemotron-h-8b")
    text = text.replace("  microbatches 8\n", "  microbatches 8\n  memory 20GiB\n")
    _, diags = lint_source(text, "m.octo")
    e501 = [d for d in diags if d.code == "E501"]
    assert e501 and all(d.span.line == text.splitlines().index("  memory 20GiB") + 1 for d in e501)
    assert "device 0 peaks at" in e501[0].message and "over the 20.00 GiB limit" in e501[0].message
    _, diags = lint_source(text.replace("memory 20GiB", "memory 80GiB"), "m.octo")
    assert diags == []


def test_e201_layers_left_out_or_given_twice():
    src = HEAD + ONE_F_ONE_B.replace(
        "stages 2", "partition {\n  stage 0: layers 0..3\n  stage 1: layers 5..7\n}"
    )
    _, diags = lint_source(src, "t.octo")
    (d,) = diags
    assert (d.code, d.message, d.hint) == (
        "E201",
        "layer 4 is in no stage",
        "stage 1 should start at layer 4",
    )
    assert (d.span.line, d.span.col, d.span.end_col) == (5, 3, 23)  # stage 1's declaration
    src = src.replace("layers 5..7", "layers 2..7")
    (d,) = lint_source(src, "t.octo")[1]
    assert (d.code, d.span.line) == ("E201", 5)
    assert (
        d.message == "stage 1 starts at layer 2, but layers 2..3 already belong to an earlier stage"
    )


def test_e201_layer_numbers_are_not_listed_one_by_one():
    # A Plan built in Python need not respect MAX_LAYERS: a gap of a trillion layers is worded as
    # a range (listing it would not end).
    from octodsl.lang import parse_plan
    from octodsl.lint import lint_plan
    from octodsl.plan import Stage

    plan = parse_plan(HEAD + ONE_F_ONE_B)
    plan.stages = [Stage(0, 3), Stage(10**12, 10**12 + 1)]
    (d,) = lint_plan(plan)
    assert d.message == "layers 4..999999999999 are in no stage"


def test_e201_partition_against_the_model_layers():
    head = HEAD.replace("microbatches 2", 'microbatches 2 model "nemotron-h-8b"')
    src = head + ONE_F_ONE_B.replace(
        "stages 2", "partition { stage 0: layers 0..9 stage 1: layers 10..23 }"
    )
    (d,) = lint_source(src, "t.octo")[1]
    assert (d.code, d.message) == ("E201", "layers 24..53 are in no stage")
    assert d.hint == "the model has 54 layers (0..53)"
    src = src.replace("10..23", "10..99")
    (d,) = lint_source(src, "t.octo")[1]
    assert d.message == "the partition names layers up to 99, but the model has 54 (0..53)"


def test_no_stages_is_an_error_not_an_empty_pipeline():
    for partition in ("partition { }", "stages 0"):
        src = HEAD + ONE_F_ONE_B.replace("stages 2", partition).replace(
            "F0:0 F0:1 BW0:0 BW0:1", ""
        ).replace("F1:0 BW1:0 F1:1 BW1:1", "")
        assert "E205" in codes(src[len(HEAD) :])


def test_more_abstract_stages_than_model_layers():
    head = 'plan "t" { devices 2 microbatches 2 model "nemotron-h-tiny" }\n'
    from octodsl.models import load_model

    layers = load_model("nemotron-h-tiny").num_layers
    src = head + f"stages {layers + 1} placement loop schedule {{ }}"
    _, diags = lint_source(src, "t.octo")
    (d,) = [d for d in diags if d.code == "E202"]
    assert (
        d.message == f"{layers + 1} stages for a model of {layers} layers: 1 of them would be empty"
    )
    assert (d.span.line, d.span.col) == (2, 1)
    src = head + f"stages {layers} placement loop schedule {{ }}"
    assert "E202" not in [d.code for d in lint_source(src, "t.octo")[1]]


def test_a_plan_without_stages_is_not_simulated(tmp_path, capsys):
    # It linted clean and simulated at "efficiency 100%".
    from octodsl.cli import main

    f = tmp_path / "empty.octo"
    f.write_text(HEAD + "partition { }\nplacement loop\nschedule { device 0 { } device 1 { } }\n")
    assert main(["simulate", str(f)]) == 1
    err = capsys.readouterr().err
    assert err == f"octodsl: error: {f}: 1 error; run `octodsl lint {f}` to see it\n"


def test_w404_zero_without_data_parallel_copies():
    for zero, what in ((1, "optimizer state"), (2, "optimizer state and gradients")):
        for dp in ("", " dp 1"):
            src = HEAD.replace("microbatches 2", f"microbatches 2{dp} zero {zero}") + ONE_F_ONE_B
            (d,) = lint_source(src, "t.octo")[1]
            assert (d.code, d.severity.value) == ("W404", "warning")
            assert d.message == (
                f"zero {zero} with dp 1: there is only one copy of the pipeline, "
                f"no other to shard the {what} over"
            )
            col = src.index(f"zero {zero}") + len("zero ") + 1
            assert (d.span.line, d.span.col, d.span.end_col) == (1, col, col + 1)
    for header in (
        "microbatches 2 dp 4 zero 1",
        "microbatches 2 dp 2 zero 2",
        "microbatches 2 zero 0",
    ):
        assert lint_source(HEAD.replace("microbatches 2", header) + ONE_F_ONE_B)[1] == []


@pytest.mark.slow
def test_a_million_duplicate_ops_are_one_diagnostic():
    from octodsl.limits import MAX_OPS

    src = (
        'plan "dups" { devices 1 microbatches 1 }\nstages 1\nplacement loop\n'
        f"schedule {{ device 0 {{ for i in 0..{MAX_OPS - 2} {{ F0:0 }} BW0:0 }} }}\n"
    )
    _, diags = lint_source(src, "dups.octo")
    (d,) = diags
    assert (d.code, d.message) == ("E302", f"F0:0 appears {MAX_OPS - 1:,} times")
