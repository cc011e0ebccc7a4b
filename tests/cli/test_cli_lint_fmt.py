"""The lint and fmt commands: exit codes, output, no tracebacks."""

from __future__ import annotations

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
    f.write_text(GOOD.replace("  devices 1\n", "  devices 1  # a\u2028b\x0cc\n\n"), encoding="utf-8")
    assert main(["fmt", str(f)]) == 0
    once = f.read_text(encoding="utf-8")
    assert "# a\u2028b\x0cc\n\n  microbatches 1" in once
    assert main(["fmt", "--check", str(f)]) == 0
    assert main(["lint", str(f)]) == 0


def test_lint_of_hostile_files_never_an_internal_error(tmp_path, capsys):
    hostile = {"bom": "\ufeff" + GOOD, "nul": GOOD.replace("F0:0", "F0:\x000"),
               "digits": GOOD.replace("F0:0", "F0:\u0663"), "huge": GOOD.replace("F0:0", "F0:" + "9" * 5000)}
    for name, text in hostile.items():
        f = tmp_path / f"{name}.octo"
        f.write_text(text, encoding="utf-8")
        status = main(["lint", str(f)])
        err = capsys.readouterr().err
        assert status == (0 if name == "bom" else 1), err
        assert "internal error" not in err
