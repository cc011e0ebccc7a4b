"""The lint and fmt commands: exit codes, output, no tracebacks."""

from __future__ import annotations

import pytest

from octodsl.cli import main

GOOD = """plan "t" {
  devices 1
  microbatches 1
}

stages 1

placement loop

schedule {
  device 0 {
    F0:0 BW0:0
  }
}
"""


def test_lint_ok(tmp_path, capsys):
    f = tmp_path / "good.octo"
    f.write_text(GOOD)
    assert main(["lint", str(f)]) == 0
    assert capsys.readouterr().out.strip() == f"{f}: ok"


def test_lint_errors_exit_1(tmp_path, capsys):
    f = tmp_path / "bad.octo"
    f.write_text(GOOD.replace("BW0:0", "BW0:0 BW0:0"))
    assert main(["lint", str(f)]) == 1
    err = capsys.readouterr().err
    assert f"{f}:12:16: error[E302]: BW0:0 appears twice" in err
    assert "1 error, 0 warnings" in err


def test_lint_strict_warnings(tmp_path, capsys):
    f = tmp_path / "warn.octo"
    f.write_text(GOOD.replace("devices 1", "devices 2"))
    assert main(["lint", str(f)]) == 0
    assert main(["lint", "--strict", str(f)]) == 1


def test_lint_usage_errors_exit_2(tmp_path, capsys):
    assert main(["lint", str(tmp_path / "missing.octo")]) == 2
    assert "no such file" in capsys.readouterr().err
    assert main(["lint", str(tmp_path)]) == 2
    binary = tmp_path / "bin.octo"
    binary.write_bytes(b"\xff\xfe\x00")
    assert main(["lint", str(binary)]) == 2


def test_fmt_rewrites_and_check(tmp_path, capsys):
    f = tmp_path / "p.octo"
    f.write_text(GOOD.replace("  devices 1\n", "devices    1\n"))
    assert main(["fmt", "--check", str(f)]) == 1
    assert "would reformat" in capsys.readouterr().out
    assert main(["fmt", str(f)]) == 0
    assert f.read_text() == GOOD
    assert main(["fmt", "--check", str(f)]) == 0


def test_fmt_syntax_error(tmp_path, capsys):
    f = tmp_path / "p.octo"
    f.write_text("plan {")
    assert main(["fmt", str(f)]) == 1
    assert "error[E101]" in capsys.readouterr().err
    assert f.read_text() == "plan {"


def test_fmt_of_odd_line_separators_in_comments_is_stable(tmp_path, capsys):
    f = tmp_path / "odd.octo"
    f.write_text(
        GOOD.replace("  devices 1\n", "  devices 1  # a\u2028b\x0cc\n\n"), encoding="utf-8"
    )
    assert main(["fmt", str(f)]) == 0
    once = f.read_text(encoding="utf-8")
    assert "# a\u2028b\x0cc\n\n  microbatches 1" in once
    assert main(["fmt", "--check", str(f)]) == 0
    assert main(["lint", str(f)]) == 0


def test_lint_of_hostile_files_never_an_internal_error(tmp_path, capsys):
    hostile = {
        "bom": "\ufeff" + GOOD,
        "nul": GOOD.replace("F0:0", "F0:\x000"),
        "digits": GOOD.replace("F0:0", "F0:\u0663"),
        "huge": GOOD.replace("F0:0", "F0:" + "9" * 5000),
    }
    for name, text in hostile.items():
        f = tmp_path / f"{name}.octo"
        f.write_text(text, encoding="utf-8")
        status = main(["lint", str(f)])
        err = capsys.readouterr().err
        assert status == (0 if name == "bom" else 1), err
        assert "internal error" not in err


# -- a plan with errors: lint lists them, the other commands name their count ------------------

PLACEMENT_BACKWARDS = (
    'plan "first" {\n  devices 2\n  microbatches 2\n}\nstages 2\nplacement {\n'
    "  stage 0: device 0\n  stage 1: device 1\n}\n"
    "schedule {\n  device 0 { F0:0..1 F9:0 F9:1 }\n  device 1 { F1:0..1 BW1:0..1 }\n}\n"
)


@pytest.mark.parametrize(
    "command",
    [["simulate"], ["tune", "--model", "nemotron-h-8b", "--from"], ["convert", "--to", "megatron"]],
)
def test_a_plan_with_errors_is_refused_in_one_line(tmp_path, capsys, command):
    plan = tmp_path / "place.octo"
    plan.write_text(
        PLACEMENT_BACKWARDS.replace(
            "placement {\n  stage 0: device 0\n  stage 1: device 1\n}", "placement loop"
        )
    )
    args = (
        command[:-1] + [command[-1], str(plan)] if command[0] == "tune" else command + [str(plan)]
    )
    if command[0] == "tune":
        args += ["-o", str(tmp_path / "out.octo")]
    assert main(args) == 1
    out = capsys.readouterr()
    # F9:0 and F9:1 (stage 9 does not exist), and stage 0 has no BW: three errors
    assert out.err == f"octodsl: error: {plan}: 3 errors; run `octodsl lint {plan}` to see them\n"
    assert out.out == ""


def test_lint_counts_what_its_cap_leaves_out(tmp_path, capsys):
    plan = tmp_path / "many.octo"
    ops = " ".join(f"F9:{m}" for m in range(100))
    plan.write_text(
        PLACEMENT_BACKWARDS.replace(
            "placement {\n  stage 0: device 0\n  stage 1: device 1\n}", "placement loop"
        ).replace("F9:0 F9:1", ops)
    )
    assert main(["lint", str(plan)]) == 1
    err = capsys.readouterr().err
    assert err.count("error[E303]") == 8  # MAX_PER_LINE
    assert "  and 92 more like this on this line\n" in err
    assert err.endswith("101 errors, 0 warnings (92 not shown)\n")
