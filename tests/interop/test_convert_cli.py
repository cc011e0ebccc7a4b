"""`octodsl convert --to`: the command's outputs, exit codes and messages, hostile inputs included."""

from __future__ import annotations

import pytest

from octodsl.cli import main

from .test_megatron import GOLDEN

NEMOTRON = GOLDEN / "nemotron-h-8b-interleaved-p4-m8.octo"


def test_prints_megatron_arguments(capsys):
    assert main(["convert", str(NEMOTRON), "--to", "megatron"]) == 0
    out = capsys.readouterr()
    assert out.out == NEMOTRON.with_suffix(".megatron.sh").read_text()
    assert out.err == ""


@pytest.mark.parametrize(
    ("target", "name", "golden"),
    [
        ("megatron", "args.sh", ".megatron.sh"),
        ("megatron", "args.txt", ".megatron.sh"),
        ("deepspeed", "ds.py", ".deepspeed.py"),
    ],
)
def test_writes_the_file_asked_for(tmp_path, target, name, golden):
    plan = GOLDEN / "llama3-8b-1f1b-p4-m8.octo"
    assert main(["convert", str(plan), "--to", target, "-o", str(tmp_path / name)]) == 0
    assert (tmp_path / name).read_text() == plan.with_suffix(golden).read_text()


def test_to_torch_is_the_csv(tmp_path, capsys):
    plan = GOLDEN / "llama3-8b-1f1b-p4-m8.octo"
    assert main(["convert", str(plan), "--to", "torch"]) == 0
    printed = capsys.readouterr().out
    assert main(["convert", str(plan), "-o", str(tmp_path / "p.csv")]) == 0
    assert printed == (tmp_path / "p.csv").read_text() and printed.startswith("0F0,0F1,0F2,")


def test_warnings_go_to_stderr(tmp_path, capsys):
    plan = tmp_path / "zb.octo"
    assert (
        main(["gen", "zb-h1", "-p", "4", "-m", "8", "--model", "nemotron-h-8b", "-o", str(plan)])
        == 0
    )
    capsys.readouterr()
    assert main(["convert", str(plan), "--to", "megatron"]) == 0
    out = capsys.readouterr()
    assert f"{plan}: warning: the plan's order (it splits backwards into B and W)" in out.err
    assert "# WARNING: the plan's order" in out.out


def test_unknown_target(capsys):
    assert main(["convert", str(NEMOTRON), "--to", "titan"]) == 2
    err = capsys.readouterr().err
    assert "--to: invalid choice: 'titan'" in err and "megatron" in err


def test_output_of_the_wrong_kind_is_refused_before_any_work(tmp_path, capsys):
    assert main(["convert", str(NEMOTRON), "--to", "megatron", "-o", str(tmp_path / "a.py")]) == 2
    assert "must end in .txt or .sh" in capsys.readouterr().err
    assert not (tmp_path / "a.py").exists()


def test_to_takes_a_plan_not_a_csv(tmp_path, capsys):
    csv = tmp_path / "p.csv"
    csv.write_text("0F0,0B0\n")
    assert main(["convert", str(csv), "--to", "megatron"]) == 2
    assert "--to megatron converts a .octo plan" in capsys.readouterr().err


def test_abstract_plan_is_refused_exit_1(tmp_path, capsys):
    plan = tmp_path / "abstract.octo"
    assert main(["gen", "1f1b", "-p", "4", "-m", "8", "-o", str(plan)]) == 0
    for target in ("megatron", "deepspeed"):
        assert main(["convert", str(plan), "--to", target]) == 1
        err = capsys.readouterr().err
        assert "octodsl: error: the plan names no model" in err and "Traceback" not in err


def test_v_placement_is_refused_exit_1(tmp_path, capsys):
    plan = tmp_path / "v.octo"
    assert (
        main(["gen", "zb-v", "-p", "4", "-m", "8", "--model", "nemotron-h-8b", "-o", str(plan)])
        == 0
    )
    capsys.readouterr()
    assert main(["convert", str(plan), "--to", "megatron", "-o", str(tmp_path / "v.sh")]) == 1
    assert "its placement is a V" in capsys.readouterr().err
    assert not (tmp_path / "v.sh").exists()


def test_a_plan_that_does_not_lint_is_refused(tmp_path, capsys):
    broken = tmp_path / "broken.octo"
    broken.write_text(
        'plan "b" { devices 1 microbatches 1 model "llama3-8b" }\nstages 1\n'
        "placement loop\nschedule { device 0 { F0:0 } }\n"
    )
    assert main(["convert", str(broken), "--to", "megatron"]) == 1
    out = capsys.readouterr()
    assert out.err == f"octodsl: error: {broken}: 1 error; run `octodsl lint {broken}` to see it\n"
    assert out.out == ""
