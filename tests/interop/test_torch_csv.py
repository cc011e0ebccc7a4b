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
from octodsl.interop import read_csv, write_csv
from octodsl.lang import PlanSyntaxError, parse_plan
from octodsl.plan import Plan, Stage

SIZES = [(2, 4), (3, 6), (4, 8), (4, 11), (5, 16)]


def imported_form(plan: Plan, name: str) -> Plan:
    """What a CSV can carry of a plan: devices, micro-batches, stage count, placement and
    orders. The name comes from the file; model, layers and the other header fields have no
    place in the format."""
    out = parse_plan(render_plan(plan))
    out.header = out.header.model_copy(update={
        "name": name, "model": None, "microbatch_size": None, "seq_len": None, "dp": 1,
        "memory": None})
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
    plan.header = plan.header.model_copy(update={"model": "x", "seq_len": 4096, "dp": 2})
    plan.stages = [Stage(0, 4), Stage(5, 9)]
    back, _ = read_csv(write_csv(plan), "x.csv")
    assert back.header.model is None and back.header.seq_len is None and back.header.dp == 1
    assert all(s.abstract for s in back.stages)
    assert back.same_as(imported_form(plan, "x"))


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
    assert [[str(a) for a in runtime.pipeline_order[d]] for d in range(plan.devices)] == \
        [row.split(",") for row in write_csv(plan).splitlines()]
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


@pytest.mark.parametrize("text, expected", [
    ("0F0,0X1,0B0\n", [("E601", 1, 5)]),
    ("0F0, 0F ,0B0\n", [("E602", 1, 6)]),
    ("0F0,(0F1;1B)OVERLAP_F_B\n", [("E602", 1, 10)]),
    ("0F0,(0F1;1B0)OVERLAP\n", [("E601", 1, 5)]),
    ("0F0,0B0\n1F0,0F1\n", [("E603", 2, 5)]),
    ("0F0,0B0,0F0\n", [("E604", 1, 9)]),
    ("0F0,0F1,0B0\n", [("E605", 1, 1)]),
    ("0F0,0B0\n\n2F0,2B0\n", [("E605", None, None)]),
    ("\n", [("E606", None, None)]),
])
def test_malformed_files_are_reported_where_they_go_wrong(text, expected):
    with pytest.raises(PlanSyntaxError) as e:
        read_csv(text, "bad.csv")
    got = [(d.code, d.span.line if d.span else None, d.span.col if d.span else None)
           for d in e.value.diagnostics]
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
    broken.write_text('plan "b" { devices 1 microbatches 1 }\nstages 1\nplacement loop\n'
                      "schedule { device 0 { F0:0 } }\n")
    assert main(["convert", str(broken), "-o", str(tmp_path / "b.csv")]) == 1
    assert "E301" in capsys.readouterr().err
    assert not (tmp_path / "b.csv").exists()
