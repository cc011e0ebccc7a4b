"""The .octo text gen writes: golden files, fmt-stable layout, and render_plan stating exactly
the plan it is given (any plan: the tuner writes its plans with it)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from octodsl.gen import generate_text, render_plan
from octodsl.gen.compact import compact
from octodsl.lang import parse_plan, parse_syntax
from octodsl.lang.fmt import format_file
from octodsl.lint import lint_source
from octodsl.plan import (
    DevicePlacement,
    Header,
    Op,
    OpKind,
    Plan,
    Recompute,
    Slot,
    Stage,
    placement_loop,
)

from ..conftest import REPO, check_golden, versionless

GOLDEN = REPO / "tests" / "gen" / "golden"
SMALL = [
    ("gpipe", 3, 4, None),
    ("1f1b", 4, 8, None),
    ("interleaved", 4, 8, 2),
    ("zb-h1", 4, 8, None),
    ("zb-h2", 4, 8, None),
    ("zb-v", 4, 8, None),
    ("dualpipev", 4, 8, None),
    # few micro-batches: M = P, M < P, P < M < 2P-1 (dualpipev needs 2P)
    ("1f1b", 4, 2, None),
    ("interleaved", 4, 4, 2),
    ("interleaved", 4, 6, 2),
    ("zb-h1", 4, 4, None),
    ("zb-h1", 4, 2, None),
    ("zb-h2", 4, 4, None),
    ("zb-h2", 4, 6, None),
    ("zb-v", 4, 4, None),
    ("zb-v", 4, 6, None),
    ("zb-v", 8, 8, None),
]


@pytest.mark.parametrize("name, p, m, v", SMALL)
def test_golden(name, p, m, v):
    text = generate_text(name, p, m, v)
    check_golden(GOLDEN / f"{name}-p{p}-m{m}.octo", text)


@pytest.mark.parametrize("name, p, m, v", SMALL)
def test_generated_text_is_fmt_stable_and_lints_clean(name, p, m, v):
    text = generate_text(name, p, m, v)
    assert format_file(parse_syntax(text)) == text
    _, diags = lint_source(text, "<gen>")
    # fewer micro-batches than devices: lint's warning that the pipeline is never full
    assert [d.code for d in diags] == (["W402"] if m < p else [])


def test_phases_are_comments():
    text = generate_text("1f1b", 4, 8)
    device0 = text.split("device 0 {\n")[1].split("\n  }")[0]
    assert device0.splitlines() == [
        "    # warm-up: forwards fill the pipeline",
        "    F0:0..2",
        "    # steady: one forward, one backward",
        "    for i in 0..4 { F0:i+3 BW0:i }",
        "    # cool-down: the backwards still in flight",
        "    BW0:5..7",
    ]


EXAMPLES = [("1f1b", 4, 8), ("zb-v", 4, 8), ("dualpipev", 4, 8)]


@pytest.mark.parametrize("name, p, m", EXAMPLES)
def test_examples_are_what_gen_writes(name, p, m):
    """examples/NAME-pP-mM.octo (regenerate with `octodsl gen NAME -p P -m M -o FILE`), but for
    the version that wrote it: an example stays true after a release."""
    path = REPO / "examples" / f"{name}-p{p}-m{m}.octo"
    assert versionless(path.read_text()) == versionless(generate_text(name, p, m))


def _plan(schedule, stages=None, placement=None, **header) -> Plan:
    devices = len(schedule)
    stages = stages or [Stage() for _ in range(devices)]
    return Plan(
        Header(name="t", devices=devices, microbatches=4, **header),
        stages,
        placement or placement_loop(len(stages), devices),
        schedule,
    )


def _slots(*items) -> list[Slot]:
    return [Slot(tuple(Op(OpKind(k), s, m) for k, s, m in it)) for it in items]


def test_render_states_header_partition_placement_and_groups():
    sched = [
        _slots([("F", 0, 0)], [("BW", 0, 0)]),
        _slots([("F", 1, 0)], [("F", 2, 0), ("BW", 1, 0)], [("BW", 2, 0)]),
    ]
    plan = _plan(
        sched,
        stages=[Stage(0, 3), Stage(4, 9), Stage(10, 12)],
        placement=[DevicePlacement(0, (0,)), DevicePlacement(1, (1, 2))],
        model="m.yaml",
        microbatch_size=2,
        seq_len=4096,
        dp=4,
        memory=80 << 30,
    )
    text = render_plan(plan, {1: {1: "steady"}}, title="a title")
    assert text.startswith("# a title\n")
    assert "memory 80GiB" in text and 'model "m.yaml"' in text
    assert "device 1: stages 1, 2" in text and "stage 2: layers 10..12" in text
    assert "# steady\n    (F2:0 & BW1:0)" in text
    assert parse_plan(text).same_as(plan)


@pytest.mark.parametrize(
    "nbytes, spelled",
    [(80 << 30, "80GiB"), (80 * 10**9, "80GB"), (3 << 20, "3MiB"), (1500, "1500")],
)
def test_render_spells_memory_exactly_and_shortest(nbytes, spelled):
    plan = _plan([_slots([("F", 0, 0)]), _slots([("F", 1, 0)])], memory=nbytes)
    text = render_plan(plan)
    assert f"memory {spelled}\n" in text
    assert parse_plan(text).header.memory == nbytes


def test_render_pattern_partition():
    plan = _plan(
        [_slots([("F", 0, 0)]), _slots([("F", 1, 0)])],
        stages=[Stage(0, 2, "[M-"), Stage(3, 5, "M*]")],
    )
    text = render_plan(plan)
    assert 'partition "[M-|M*]"' in text
    assert parse_plan(text).same_as(plan)


def test_render_states_zero_and_recompute():
    sched = [_slots([("F", 0, 0)], [("BW", 0, 0)]), _slots([("F", 1, 0)], [("BW", 1, 0)])]
    stages = [
        Stage(0, 3),
        Stage(4, 9, recompute=Recompute.SELECTIVE),
        Stage(10, 12, recompute=Recompute.FULL),
    ]
    plan = _plan(sched, stages=stages, dp=8, zero=2)
    text = render_plan(plan)
    assert "  dp 8\n  zero 2\n" in text
    assert "\nrecompute {\n  stage 1: selective\n  stage 2: full\n}\n\nschedule {" in text
    back = parse_plan(text)
    assert back.same_as(plan) and back.recompute() == plan.recompute()
    assert format_file(parse_syntax(text)) == text  # fmt leaves it as written
    # what is the default is not written
    plain = render_plan(_plan(sched, stages=[Stage(0, 3), Stage(4, 9), Stage(10, 12)]))
    assert "zero" not in plain and "recompute" not in plain


ops = st.builds(Op, st.sampled_from(list(OpKind)), st.integers(0, 3), st.integers(0, 12))
slots = st.lists(
    st.builds(lambda o: Slot(tuple(o)), st.lists(ops, min_size=1, max_size=2)), max_size=40
)


def test_render_states_the_mesh_fields_that_are_not_defaults():
    sched = [_slots([("F", 0, 0)], [("BW", 0, 0)]), _slots([("F", 1, 0)], [("BW", 1, 0)])]
    plan = _plan(sched, tp=8, sequence_parallel=False, dp=2, gpus_per_node=4)
    text = render_plan(plan)
    assert "  tp 8\n  sequence_parallel false\n  dp 2\n  gpus_per_node 4\n}" in text
    assert parse_plan(text).same_as(plan)
    assert format_file(parse_syntax(text)) == text
    # sequence parallelism as set, even when it says what the default would
    assert "  tp 2\n  sequence_parallel true\n" in render_plan(
        _plan(sched, tp=2, sequence_parallel=True)
    )
    # the defaults are not written: tp 1, sequence_parallel unset, 8 GPUs per node
    plain = render_plan(_plan(sched, tp=1, gpus_per_node=8))
    assert "tp" not in plain.split("}")[0] and "sequence_parallel" not in plain
    assert "gpus_per_node" not in plain


MESHES = st.sampled_from(
    [
        {},
        {"tp": 8},
        {"tp": 4, "sequence_parallel": False},
        {"tp": 2, "sequence_parallel": True, "gpus_per_node": 2},
        {"sequence_parallel": False},
        {"gpus_per_node": 1024, "tp": 1024},
    ]
)
"""Mesh fields of a header, some defaults among them."""


@given(
    st.lists(slots, min_size=1, max_size=3),
    st.lists(st.sampled_from(list(Recompute)), min_size=4, max_size=4),
    st.sampled_from([(1, 0), (4, 0), (4, 1), (8, 2), (1, 2)]),
    MESHES,
)
def test_render_round_trips_any_schedule(schedule, recompute, dp_zero, mesh):
    dp, zero = dp_zero
    plan = _plan(
        schedule,
        stages=[Stage(recompute=r) for r in recompute],
        placement=[DevicePlacement(d, (d,)) for d in range(len(schedule))],
        dp=dp,
        zero=zero,
        **mesh,
    )
    text = render_plan(plan)
    assert parse_plan(text).same_as(plan)
    assert format_file(parse_syntax(text)) == text


@given(slots)
def test_compaction_is_no_longer_than_the_ops(seq):
    assert len(compact(seq)) <= len(seq)


def test_compaction_forms():
    run = _slots(*[[("F", 0, m)] for m in range(4)])
    assert compact(run) == ["F0:0..3"]
    steady = _slots(*[x for m in range(5) for x in ([("F", 1, m + 3)], [("BW", 1, m)])])
    assert compact(steady) == ["for i in 0..4 { F1:i+3 BW1:i }"]
    short = _slots([("F", 0, 4)], [("B", 0, 0)], [("F", 0, 5)], [("B", 0, 1)])
    assert compact(short) == ["F0:4", "B0:0", "F0:5", "B0:1"]
    groups = _slots(*[[("F", 0, m), ("BW", 7, m + 1)] for m in range(3)])
    assert compact(groups) == ["for i in 0..2 { (F0:i & BW7:i+1) }"]
