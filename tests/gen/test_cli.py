"""`octodsl gen`: the text on standard output or in a file; clear errors, no tracebacks."""

from __future__ import annotations

import pytest

from octodsl.cli import main
from octodsl.gen import ScheduleError, generate_text
from octodsl.lang import parse_plan
from octodsl.lint import lint_source


def test_gen_prints_the_plan(capsys):
    assert main(["gen", "1f1b", "--devices", "4", "--microbatches", "8"]) == 0
    assert capsys.readouterr().out == generate_text("1f1b", 4, 8)


def test_gen_writes_a_file(tmp_path, capsys):
    out = tmp_path / "i.octo"
    assert main(["gen", "interleaved", "-p", "2", "-m", "4", "--chunks", "3", "-o", str(out)]) == 0
    assert out.read_text() == generate_text("interleaved", 2, 4, 3)
    assert capsys.readouterr().out == ""


def test_gen_errors_say_what_is_needed(capsys):
    assert main(["gen", "dualpipev", "-p", "4", "-m", "6"]) == 2
    err = capsys.readouterr().err
    assert err == "octodsl: error: dualpipev needs at least 2 x devices = 8 micro-batches, got 6\n"
    assert main(["gen", "zb-v", "-p", "0", "-m", "6"]) == 2
    assert "at least 1" in capsys.readouterr().err
    assert main(["gen", "1f1b", "-p", "2", "-m", "2", "-o", "/nonexistent/dir/x.octo"]) == 2
    assert "cannot write" in capsys.readouterr().err


def test_gen_places_zb_v_weight_gradients_for_the_given_times(capsys):
    # below 2P-1 micro-batches zb-v's order depends on the op times: --costs gives them
    assert main(["gen", "zb-v", "-p", "8", "-m", "8", "--costs", "F=1,B=2,W=1"]) == 0
    assert capsys.readouterr().out == generate_text("zb-v", 8, 8, times=(1.0, 2.0, 1.0))
    assert generate_text("zb-v", 8, 8, times=(1.0, 2.0, 1.0)) != generate_text("zb-v", 8, 8)
    assert main(["gen", "zb-v", "-p", "8", "-m", "8", "--costs", "F=0,B=2,W=1"]) == 2
    assert "--costs: F, B and W must each be more than 0" in capsys.readouterr().err


def test_gen_writes_the_mesh_into_the_header(capsys):
    assert (
        main(
            [
                "gen",
                "1f1b",
                "-p",
                "2",
                "-m",
                "4",
                "--tp",
                "4",
                "--sequence-parallel",
                "false",
                "--gpus-per-node",
                "4",
            ]
        )
        == 0
    )
    out = capsys.readouterr().out
    assert out == generate_text(
        "1f1b", 2, 4, mesh={"tp": 4, "sequence_parallel": False, "gpus_per_node": 4}
    )
    assert "  tp 4\n  sequence_parallel false\n  gpus_per_node 4\n}" in out
    plan = parse_plan(out)
    assert (plan.header.tp, plan.header.sp, plan.header.gpus_per_node) == (4, False, 4)
    # given and at its default, a field is not written (as the plan's header is written)
    assert main(["gen", "1f1b", "-p", "2", "-m", "4", "--tp", "1", "--gpus-per-node", "8"]) == 0
    assert capsys.readouterr().out == generate_text("1f1b", 2, 4)
    assert (
        main(["gen", "1f1b", "-p", "2", "-m", "4", "--tp", "2", "--sequence-parallel", "true"]) == 0
    )
    assert "  tp 2\n  sequence_parallel true\n" in capsys.readouterr().out


def test_gen_with_a_model_and_tp_lints_clean(capsys):
    assert main(["gen", "1f1b", "-p", "4", "-m", "8", "--model", "nemotron-h-8b", "--tp", "8"]) == 0
    plan, diags = lint_source(capsys.readouterr().out)
    assert diags == [] and plan is not None and (plan.header.tp, plan.header.sp) == (8, True)


@pytest.mark.parametrize(
    "args, message",
    [
        (["--tp", "0"], "--tp: must be at least 1"),
        (["--tp", "1025"], "--tp: must be at most 1,024 (octodsl's limit)"),
        (["--tp", "-2"], "--tp: must be at least 1"),
        (["--tp", "2.5"], "--tp: '2.5' is not a whole number"),
        (["--tp", "99999999999999999999999"], "--tp: must be at most 1,024 (octodsl's limit)"),
        (["--gpus-per-node", "0"], "--gpus-per-node: must be at least 1"),
        (["--gpus-per-node", "4096"], "--gpus-per-node: must be at most 1,024 (octodsl's limit)"),
        (["--sequence-parallel", "yes"], "--sequence-parallel: 'yes' is not true or false"),
        (
            ["--sequence-parallel", "true"],
            "--sequence-parallel true splits the sequence over the tp group: give --tp 2 or more",
        ),
        (
            ["--tp", "1", "--sequence-parallel", "true"],
            "--sequence-parallel true splits the sequence over the tp group: give --tp 2 or more",
        ),
    ],
)
def test_gen_refuses_bad_mesh_options(args, message, capsys):
    assert main(["gen", "1f1b", "-p", "2", "-m", "4", *args]) == 2
    assert capsys.readouterr().err == f"octodsl: error: {message}\n"


def test_generate_text_refuses_fields_that_are_no_mesh_fields():
    with pytest.raises(
        ScheduleError,
        match="mesh fields are tp, sequence_parallel, gpus_per_node, dp, zero, ep, "
        "overlap_tp_comm, .*, not memory",
    ):
        generate_text("1f1b", 2, 4, mesh={"memory": 2})
    with pytest.raises(ScheduleError, match="cannot write the header: tp"):
        generate_text("1f1b", 2, 4, mesh={"tp": 0})
