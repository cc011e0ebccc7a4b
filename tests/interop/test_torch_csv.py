"""The torch.distributed.pipelining action CSV: exports load in torch's own loader, every
generated plan survives the round trip, torch's own schedules import, bad files are reported
cell by cell."""

from __future__ import annotations

import csv
import io
import types

import pytest

from octodsl.cli import main
from octodsl.dag import build_graph, execution_order
from octodsl.gen import SCHEDULES, generate, render_plan
from octodsl.interop import export_warnings, read_csv, write_csv
from octodsl.lang import PlanSyntaxError, parse_plan
from octodsl.plan import Plan, Recompute, Stage

SIZES = [(2, 4), (3, 6), (4, 8), (4, 11), (5, 16)]


def imported_form(plan: Plan, name: str) -> Plan:
    """What a CSV can carry of a plan: devices, micro-batches, stage count, placement and
    orders. The name comes from the file; model, layers and the other header fields have no
    place in the format."""
    out = parse_plan(render_plan(plan))
    out.header = out.header.model_copy(
        update={
            "name": name,
            "model": None,
            "microbatch_size": None,
            "seq_len": None,
            "dp": 1,
            "zero": 0,
            "memory": None,
            "tp": 1,
            "sequence_parallel": None,
            "gpus_per_node": 8,
        }
    )
    out.stages = [Stage() for _ in plan.stages]
    return out


@pytest.mark.parametrize("name", SCHEDULES)
def test_round_trip_of_generated_plans(name):
    for p, m in SIZES:
        if name == "dualpipev" and m < 2 * p:
            continue
        plan = generate(name, p, m)
        back, warnings = read_csv(write_csv(plan), f"runs/{name}.csv")
        assert warnings == []
        assert back.same_as(imported_form(plan, name)), (p, m)


def test_round_trip_drops_what_csv_cannot_carry():
    plan = generate("1f1b", 2, 2)
    plan.header = plan.header.model_copy(
        update={
            "model": "x",
            "seq_len": 4096,
            "dp": 2,
            "zero": 1,
            "tp": 4,
            "sequence_parallel": False,
            "gpus_per_node": 4,
        }
    )
    plan.stages = [Stage(0, 4, recompute=Recompute.FULL), Stage(5, 9)]
    back, _ = read_csv(write_csv(plan), "x.csv")
    assert back.header.model is None and back.header.seq_len is None and back.header.dp == 1
    assert back.header.zero == 0 and back.recompute() == [Recompute.NONE] * 2
    assert (back.header.tp, back.header.sequence_parallel, back.header.gpus_per_node) == (
        1,
        None,
        8,
    )
    assert all(s.abstract for s in back.stages)
    assert back.same_as(imported_form(plan, "x"))


ZERO_AND_RECOMPUTE = """plan "z" {
  devices 2
  microbatches 2
  dp 4
  zero 2
}
stages 4
placement loop
recompute {
  stage 0: none
  stage 2: selective
  stage 1: full
}
schedule {
  device 0 { F0:0..1 F2:0..1 BW2:0..1 BW0:0..1 }
  device 1 { F1:0..1 F3:0 BW3:0 F3:1 BW3:1 BW1:0..1 }
}
"""


def test_export_warns_of_zero_and_recompute_where_the_plan_states_them():
    plan = parse_plan(ZERO_AND_RECOMPUTE)
    zero, recompute = export_warnings(plan)
    assert (zero.code, zero.severity.value, recompute.code) == ("W603", "warning", "W603")
    assert zero.message == "'zero 2' is dropped: the CSV has no place for ZeRO sharding"
    assert (zero.span.line, zero.span.col) == (5, 8)
    assert recompute.message == (
        "the recompute section (stage 1: full, stage 2: selective) is "
        "dropped: the CSV has no place for it"
    )
    assert (recompute.span.line, recompute.span.col) == (12, 3)  # stage 1's line, the first stage
    # nothing that changes how the plan runs is lost: no warning (`none` is what the CSV means)
    plain = (
        ZERO_AND_RECOMPUTE.replace("zero 2", "zero 0")
        .replace("selective", "none")
        .replace("full", "none")
    )
    assert export_warnings(parse_plan(plain)) == []


MESH = ZERO_AND_RECOMPUTE.replace(
    "  zero 2\n", "  tp 8\n  sequence_parallel false\n  gpus_per_node 16\n"
)


def test_export_warns_of_each_mesh_field_where_the_plan_states_it():
    plan = parse_plan(MESH)
    tp, sp, gpus, recompute = export_warnings(plan)
    assert {w.code for w in (tp, sp, gpus, recompute)} == {"W603"} and not tp.is_error
    assert tp.message == "'tp 8' is dropped: the CSV has no place for tensor parallelism"
    assert (
        sp.message
        == "'sequence_parallel false' is dropped: the CSV has no place for sequence parallelism"
    )
    assert (
        gpus.message
        == "'gpus_per_node 16' is dropped: the CSV has no place for the cluster's shape"
    )
    assert [(w.span.line, w.span.col) for w in (tp, sp, gpus)] == [(5, 6), (6, 21), (7, 17)]
    # the defaults lose nothing, written or not
    defaults = (
        MESH.replace("tp 8", "tp 1")
        .replace("  sequence_parallel false\n", "")
        .replace("gpus_per_node 16", "gpus_per_node 8")
    )
    assert [w.message for w in export_warnings(parse_plan(defaults))] == [recompute.message]


def test_a_csv_read_back_states_tp_1(tmp_path, capsys):
    octo, out, back = tmp_path / "t.octo", tmp_path / "t.csv", tmp_path / "back.octo"
    octo.write_text(MESH)
    assert main(["convert", str(octo), "-o", str(out)]) == 0
    err = capsys.readouterr().err
    assert f"{octo}:5:6: warning[W603]: 'tp 8' is dropped" in err
    assert f"{octo}:6:21: warning[W603]: 'sequence_parallel false' is dropped" in err
    assert main(["convert", str(out), "-o", str(back)]) == 0
    h = parse_plan(back.read_text()).header
    assert (h.tp, h.sequence_parallel, h.gpus_per_node) == (1, None, 8)
    assert "tp" not in back.read_text().split("}")[0].split("{")[1]


def test_convert_names_what_it_drops_on_stderr(tmp_path, capsys):
    octo, out = tmp_path / "z.octo", tmp_path / "z.csv"
    octo.write_text(ZERO_AND_RECOMPUTE)
    assert main(["convert", str(octo), "-o", str(out)]) == 0
    err = capsys.readouterr().err
    assert f"{octo}:5:8: warning[W603]: 'zero 2' is dropped" in err
    assert (
        f"{octo}:12:3: warning[W603]: the recompute section (stage 1: full, stage 2: selective)"
        in err
    )
    assert "  12 |   stage 1: full\n" in err  # with the line and a caret
    assert out.read_text() == write_csv(parse_plan(ZERO_AND_RECOMPUTE))
    # the way back states neither
    back = tmp_path / "back.octo"
    assert main(["convert", str(out), "-o", str(back)]) == 0
    text = back.read_text()
    assert "zero" not in text and "recompute" not in text


def _stub(plan: Plan):
    """What torch's schedule constructor reads from its stages."""
    return types.SimpleNamespace(num_stages=plan.num_stages, group_size=plan.devices, group_rank=0)


@pytest.mark.parametrize("name", SCHEDULES)
def test_torch_loads_the_export(name, tmp_path):
    S = pytest.importorskip("torch.distributed.pipelining.schedules")
    plan = generate(name, 4, 8)
    path = tmp_path / f"{name}.csv"
    path.write_text(write_csv(plan))
    runtime = S._PipelineScheduleRuntime([_stub(plan)], n_microbatches=plan.microbatches)
    runtime._load_csv(str(path))  # validates, then lowers to a schedule with communication
    assert runtime.stage_index_to_group_rank == dict(enumerate(plan.stage_device()))
    assert [[str(a) for a in runtime.pipeline_order[d]] for d in range(plan.devices)] == [
        row.split(",") for row in write_csv(plan).splitlines()
    ]
    assert runtime.pipeline_order_with_comms


def _torch_csv(order: dict) -> str:
    """A pipeline_order written as torch's _dump_csv writes it (None: an empty cell)."""
    buf = io.StringIO()
    writer = csv.writer(buf)
    for rank in sorted(order):
        writer.writerow(order[rank])
    return buf.getvalue()


def test_torch_zbv_csv_imports_as_our_zb_v():
    S = pytest.importorskip("torch.distributed.pipelining.schedules")
    p, m = 4, 8
    me = types.SimpleNamespace(pp_group_size=p, _n_microbatches=m, num_stages=2 * p)
    order = {r: S.ScheduleZBVZeroBubble._calculate_single_rank_operations(me, r) for r in range(p)}
    assert any(a is None for a in order[1])  # idle cells, skipped on import
    plan, warnings = read_csv(_torch_csv(order), "zb-v.csv")
    assert warnings == []
    assert plan.same_as(imported_form(generate("zb-v", p, m), "zb-v"))


def test_torch_dualpipev_csv_imports_with_its_mixed_backwards_split():
    S = pytest.importorskip("torch.distributed.pipelining.schedules")
    p, m = 3, 8
    me = types.SimpleNamespace(pp_group_size=p, _n_microbatches=m, num_stages=2 * p)
    order = {r: S.ScheduleDualPipeV._calculate_single_rank_operations(me, r) for r in range(p)}
    plan, warnings = read_csv(_torch_csv(order), "dualpipev.csv")
    assert [w.code for w in warnings] == ["W602"]
    assert all(plan.split_stages())
    text = render_plan(plan)
    assert "(F" in text  # the overlap groups survive
    assert isinstance(execution_order(build_graph(parse_plan(text)))[0], int)


def test_reduce_grad_is_dropped_and_communication_warned_once():
    text = "0F0,1F0,1B0,0B0,0REDUCE_GRAD,1REDUCE_GRAD,0UNSHARD\n"
    plan, warnings = read_csv(text, "a.csv")
    assert warnings == []
    assert [str(s) for s in plan.schedule[0]] == ["F0:0", "F1:0", "BW1:0", "BW0:0"]
    text = "0F0,0SEND_F0,0RECV_B0,0B0\n1RECV_F0,1F0,1B0,1SEND_B0\n"
    plan, warnings = read_csv(text, "c.csv")
    assert [(w.code, w.span.line, w.span.col) for w in warnings] == [("W601", 1, 5)]
    assert [str(s) for s in plan.schedule[1]] == ["F1:0", "BW1:0"]


def test_quoted_cells_and_spaces():
    plan, _ = read_csv('"0F0", 0B0 ,\n', "q.csv")
    assert [str(s) for s in plan.schedule[0]] == ["F0:0", "BW0:0"]


@pytest.mark.parametrize(
    "text, expected",
    [
        ("0F0,0X1,0B0\n", [("E601", 1, 5)]),
        ("0F0, 0F ,0B0\n", [("E602", 1, 6)]),
        ("0F0,(0F1;1B)OVERLAP_F_B\n", [("E602", 1, 10)]),
        ("0F0,(0F1;1B0)OVERLAP\n", [("E601", 1, 5)]),
        ("0F0,0B0\n1F0,0F1\n", [("E603", 2, 5)]),
        ("0F0,0B0,0F0\n", [("E604", 1, 9)]),
        ("0F0,0F1,0B0\n", [("E605", 1, 1)]),
        ("0F0,0B0\n\n2F0,2B0\n", [("E605", None, None)]),
        ("\n", [("E606", None, None)]),
    ],
)
def test_malformed_files_are_reported_where_they_go_wrong(text, expected):
    with pytest.raises(PlanSyntaxError) as e:
        read_csv(text, "bad.csv")
    got = [
        (d.code, d.span.line if d.span else None, d.span.col if d.span else None)
        for d in e.value.diagnostics
    ]
    assert got == expected, e.value.render()
    assert "bad.csv" in e.value.render()


def test_convert_cli_both_ways(tmp_path, capsys):
    octo, out_csv, back = tmp_path / "p.octo", tmp_path / "p.csv", tmp_path / "back.octo"
    assert main(["gen", "zb-h1", "-p", "3", "-m", "5", "-o", str(octo)]) == 0
    assert main(["convert", str(octo), "-o", str(out_csv)]) == 0
    assert main(["convert", str(out_csv), "-o", str(back)]) == 0
    plan = parse_plan(octo.read_text())
    assert parse_plan(back.read_text()).same_as(imported_form(plan, "p"))


def test_convert_cli_errors(tmp_path, capsys):
    bad = tmp_path / "bad.csv"
    bad.write_text("0F0,0Q\n")
    assert main(["convert", str(bad), "-o", str(tmp_path / "x.octo")]) == 1
    err = capsys.readouterr().err
    assert "bad.csv:1:5: error[E601]" in err and "Traceback" not in err
    assert main(["convert", str(bad), "-o", str(tmp_path / "x.txt")]) == 2
    assert "convert turns .octo into .csv or .csv into .octo" in capsys.readouterr().err
    broken = tmp_path / "broken.octo"
    broken.write_text(
        'plan "b" { devices 1 microbatches 1 }\nstages 1\nplacement loop\n'
        "schedule { device 0 { F0:0 } }\n"
    )
    assert main(["convert", str(broken), "-o", str(tmp_path / "b.csv")]) == 1
    assert f"{broken}: 1 error; run `octodsl lint {broken}`" in capsys.readouterr().err
    assert not (tmp_path / "b.csv").exists()


# -- hostile files -------------------------------------------------------------------------------


def errors_of(text: str) -> list:
    with pytest.raises(PlanSyntaxError) as e:
        read_csv(text, "bad.csv")
    return e.value.diagnostics


def test_byte_order_mark_is_ignored():
    plan, warnings = read_csv("\ufeff0F0,0B0\n1F0,1B0\n", "bom.csv")
    assert warnings == [] and [str(s) for s in plan.schedule[0]] == ["F0:0", "BW0:0"]
    (d,) = errors_of("\ufeff0F0,0X0\n")  # positions count from after the mark
    assert (d.code, d.span.line, d.span.col) == ("E601", 1, 5)


@pytest.mark.parametrize("cell", ["0F\u0663", "\u0660F0", "0F\u00b9", "0F\uff11"])
def test_only_ascii_digits_are_numbers(cell):
    # Arabic-Indic three, zero, a superscript one, a full-width one: int() reads the first three.
    (d,) = errors_of(f"0F0,{cell},0B0\n")
    assert (d.code, d.span.col, d.message) == ("E601", 5, f"'{cell}' is not an action")


def test_invisible_characters_are_shown_escaped():
    (d,) = errors_of("0F0,\u200b0B0\n")
    assert d.message == "'\\u200b0B0' is not an action"


@pytest.mark.parametrize(
    "text, col, message",
    [
        (
            "0F0,0B0,0F99999999999999\n",
            11,
            "99999999999999 is too large: a micro-batch number is at most 65,535 (docs/language.md#limits)",
        ),
        (
            "0F0,0B0,0F65536\n",
            11,
            "65536 is too large: a micro-batch number is at most 65,535 (docs/language.md#limits)",
        ),
        (
            "0F0,0B0,65536F0\n",
            9,
            "65536 is too large: a stage number is at most 65,535 (docs/language.md#limits)",
        ),
        (
            "0F0,0B0,(1F0;0F" + "9" * 5000 + ")OVERLAP_F_B\n",
            16,
            "a 5000-digit number is too large: a micro-batch number is at most 65,535 (docs/language.md#limits)",
        ),
    ],
)
def test_stage_and_microbatch_numbers_are_bounded(text, col, message):
    (d,) = errors_of(text)
    assert (d.code, d.span.line, d.span.col, d.message) == ("E607", 1, col, message)
    digits = message.split(" ")[0] if message[0].isdigit() else "9" * 5000
    assert d.span.end_col - d.span.col == len(digits)  # the number, not the whole action


def test_stages_times_microbatches_bounded_before_completeness_is_checked():
    (d,) = errors_of("0F0,0B0,0F999\n1F0,999F0\n")
    assert d.code == "E607" and d.message == (
        "1,000 stages and 1,000 micro-batches need 2,000,000 ops "
        "or more: a plan has at most 1,000,000 ops (docs/language.md#limits)"
    )


def test_rows_are_bounded_by_max_devices():
    (d,) = errors_of("0F0,0B0\n" * 4097)
    assert (d.code, d.span.line) == ("E607", 4097)
    assert (
        d.message
        == "4,097 rows, one device each: a plan has at most 4096 devices (docs/language.md#limits)"
    )
    plan, _ = read_csv("0F0,0B0\n" + "\n" * 4095, "wide.csv")  # 4096 rows, most idle
    assert plan.devices == 4096


def test_rows_end_at_line_feeds_only():
    plan, _ = read_csv("0F0,0B0\r\n1F0,1B0\r\n", "crlf.csv")
    assert plan.devices == 2
    (d,) = errors_of("0F0,0B0\u20281F0,1B0\n")  # not a row end: part of a cell
    assert (d.code, d.span.col, d.message) == ("E601", 5, "'0B0\\u20281F0' is not an action")


def test_a_stray_microbatch_is_named_as_such():
    # PyTorch's 1F1B export with a stray 1F4: micro-batch 4 is the odd one out, not stage 0.
    text = "0F0,0F1,0F2,0F3,0B0,0B1,0B2,0B3\n1F0,1F1,1F2,1F3,1F4,1B0,1B1,1B2,1B3\n"
    (d,) = errors_of(text)
    assert (d.code, d.message) == ("E605", "micro-batch 4 appears only on stage 1")
    assert (d.span.line, d.span.col, d.span.end_col) == (2, 17, 20)  # the stray 1F4
    assert d.hint.startswith("stage 0 has none of its actions")


def test_a_stage_that_lacks_a_microbatch_others_have():
    text = "".join(f"{s}F0,{s}F1,{s}B0,{s}B1\n" for s in range(3)).replace("0F1,0B0,0B1", "0B0")
    (d,) = errors_of(text)
    assert (d.code, d.message, d.hint) == (
        "E605",
        "stage 0 has no action of micro-batch 1",
        "stages 1..2 have it",
    )
    assert (d.span.line, d.span.col) == (1, 1)


def test_a_gap_in_the_microbatch_numbers():
    (d,) = errors_of("0F0,0F2,0B0,0B2\n1F0,1F2,1B0,1B2\n")
    assert (d.code, d.message) == ("E605", "no action names micro-batch 1")


def test_partly_missing_actions_are_still_listed_by_stage():
    (d,) = errors_of("0F0,0F1,0B0\n")
    assert d.message == "stage 0 lacks 1 action(s): 0B1"


def test_stages_in_no_row_are_reported_together():
    (d,) = errors_of("0F0,0B0\n5000F0,5000B0\n")
    assert (d.code, d.message) == ("E605", "stages 1..4999 appear in no row")


DEADLOCK = "0F0,0B0,0F1,0B1\n1F1,1B1,1F0,1B0\n"
"""Rank 0 runs 0B0 before 0F1; rank 1 runs 1F1 (which needs 0F1) before 1B0 (which 0B0 needs)."""


def test_a_deadlocking_file_is_refused_as_lint_refuses_it():
    (d,) = errors_of(DEADLOCK)
    assert (
        d.code == "E310"
        and d.message == "the schedule deadlocks: devices 0, 1 wait on each other in a cycle"
    )
    assert (d.span.line, d.span.col) == (1, 5)  # 0B0
    assert d.notes == (
        "BW0:0 on device 0 waits for BW1:0 on device 1, queued behind F1:1",
        "F1:1 on device 1 waits for F0:1 on device 0, queued behind BW0:0",
    )
    assert "device 0 is row 1" in d.hint


def test_convert_refuses_a_deadlocking_file(tmp_path, capsys):
    src, out = tmp_path / "dead.csv", tmp_path / "dead.octo"
    src.write_text(DEADLOCK)
    assert main(["convert", str(src), "-o", str(out)]) == 1
    err = capsys.readouterr().err
    assert f"{src}:1:5: error[E310]: the schedule deadlocks" in err
    assert "  1 | 0F0,0B0,0F1,0B1" in err
    assert not out.exists()
