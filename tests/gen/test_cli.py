"""`octodsl gen`: the text on standard output or in a file; clear errors, no tracebacks."""

from __future__ import annotations

from octodsl.cli import main
from octodsl.gen import generate_text


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
