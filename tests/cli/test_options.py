"""Option values: every number a user can type is bounded and refused in one line that names
the option; no pydantic dump, no traceback, no internal error. Output paths are checked before
the work, and exactly the path given is written."""

from __future__ import annotations

import argparse
import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from octodsl import limits
from octodsl.cli import main
from octodsl.cli.common import (
    DEVICES,
    check_output,
    duration,
    integer,
    memory_size,
    op_costs,
    output,
    seconds_value,
)
from octodsl.gen import generate_text

TUNE = ["tune", "--model", "nemotron-h-tiny", "-p", "4", "-m", "8", "--budget", "1s"]


@pytest.fixture
def plan(tmp_path):
    path = tmp_path / "p.octo"
    path.write_text(generate_text("1f1b", 2, 4))
    return str(path)


def one_error_line(err: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("octodsl: error: "), err
    for leak in ("Traceback", "pydantic", "validation error", "internal error"):
        assert leak not in err
    return lines[0].removeprefix("octodsl: error: ")


@pytest.mark.parametrize(
    "argv, message",
    [
        (TUNE + ["--memory", "0"], "--memory: must be at least 1 byte (e.g. 80GiB)"),
        (TUNE + ["--memory", "nanGiB"], "--memory: cannot read 'nanGiB' as a size"),
        (TUNE + ["--memory", "2000TiB"], "--memory: must be at most 1024TiB"),
        (TUNE + ["--microbatch-size", "0"], "--microbatch-size: must be at least 1"),
        (TUNE + ["--seq-len=-1"], "--seq-len: must be at least 1"),
        (TUNE + ["--seq-len", "99999999999"], "--seq-len: must be at most 16,777,216"),
        (TUNE + ["--budget", "nan"], "--budget: 'nan' is not a finite number of seconds"),
        (TUNE + ["--budget", "1e400s"], "--budget: '1e400s' is not a finite number"),
        (TUNE + ["--budget", "0s"], "--budget: must be more than 0 seconds"),
        (TUNE + ["--budget", "20000m"], "--budget: must be at most 1e+06 seconds"),
        (TUNE + ["--seed", "x"], "--seed: 'x' is not a whole number"),
        (TUNE + ["-p", "100000"], "--devices/-p: must be at most 4,096"),
        (TUNE + ["-m", "0"], "--microbatches/-m: must be at least 1"),
        (TUNE + ["-o", "plan.txt"], "-o/--output: plan.txt must end in .octo"),
        (["gen", "1f1b", "-p", "2", "-m", "2.5"], "--microbatches/-m: '2.5' is not a whole number"),
        (
            ["gen", "interleaved", "-p", "2", "-m", "4", "-v", "0"],
            "--chunks/-v: must be at least 1",
        ),
        (
            ["gen", "1f1b", "-p", "4096", "-m", "65536"],
            "make at least 536,870,912 ops, more than octodsl's limit of 1,000,000 per plan",
        ),
        (["models", "nemotron-h-tiny", "--seq-len", "0"], "--seq-len: must be at least 1"),
        (
            ["profile", "--model", "nemotron-h-tiny", "--repeats", "0"],
            "--repeats: must be at least 1",
        ),
        (
            ["profile", "--model", "nemotron-h-tiny", "--threads", "100000"],
            "--threads: must be at most",
        ),
        (
            ["profile", "--model", "nemotron-h-tiny", "-o", "x.csv"],
            "-o/--output: x.csv must end in .json",
        ),
        (["compare", "p.octo", "--trace", "t.json", "--warmup=-1"], "--warmup: must be at least 0"),
        (
            ["calibrate", "--model", "nemotron-h-tiny", "-o", "calibrated"],
            "-o/--output: calibrated must end in .json",
        ),
        (
            ["tune"],
            "the following arguments are required: -o/--output (`octodsl tune --help` lists",
        ),
    ],
)
def test_bad_option_values_name_the_option(capsys, argv, message):
    assert main(argv) == 2
    assert message in one_error_line(capsys.readouterr().err)


def test_a_bad_value_is_refused_before_any_work(monkeypatch, capsys, plan, tmp_path):
    import octodsl.tune.reference.compare

    def must_not_run(*args, **kwargs):
        raise AssertionError("the work started")

    monkeypatch.setattr(octodsl.tune.reference.compare, "tune_and_compare", must_not_run)
    monkeypatch.setattr("octodsl.cli.simulate.simulate", must_not_run)
    for argv in (
        TUNE + ["-o", str(tmp_path / "no" / "such" / "t.octo")],
        TUNE + ["-o", str(tmp_path)],
        ["simulate", plan, "--png", str(tmp_path / "gantt.txt")],
        ["simulate", plan, "--png", str(tmp_path)],
        ["simulate", plan, "--trace", str(tmp_path / "missing" / "t.json")],
    ):
        assert main(argv) == 2
        one_error_line(capsys.readouterr().err)


def test_png_is_written_at_exactly_the_path_given(capsys, plan, tmp_path):
    pytest.importorskip("matplotlib")
    (tmp_path / "chart.png").mkdir()
    assert main(["simulate", plan, "--png", str(tmp_path / "chart.png")]) == 2
    assert "is a folder" in capsys.readouterr().err
    out = tmp_path / "Chart.PNG"
    assert main(["simulate", plan, "--png", str(out)]) == 0
    assert out.read_bytes()[:4] == b"\x89PNG"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["Chart.PNG", "chart.png", "p.octo"]


@pytest.mark.parametrize(
    "argv, message",
    [
        (
            ["-p", "1"],
            "tune needs at least 2 devices (a pipeline), not 1; a single device runs every "
            "layer in one stage: `octodsl gen 1f1b -p 1 -m 8 --model nemotron-h-tiny` writes "
            "that plan",
        ),
        (
            ["-p", "25"],
            "nemotron-h-tiny has 24 layers: tune takes 2 to 24 devices (each device holds "
            "at least one layer), not 25",
        ),
    ],
)
def test_tune_device_counts_it_cannot_pipeline(capsys, tmp_path, argv, message):
    args = [
        "tune",
        "--model",
        "nemotron-h-tiny",
        "-m",
        "8",
        "--budget",
        "1s",
        *argv,
        "-o",
        str(tmp_path / "t.octo"),
    ]
    assert main(args) == 2
    assert one_error_line(capsys.readouterr().err) == message


def test_tune_on_as_many_devices_as_layers(capsys, tmp_path):
    out = tmp_path / "t.octo"
    assert (
        main(
            [
                "tune",
                "--model",
                "jamba-tiny",
                "-p",
                "18",
                "-m",
                "18",
                "--budget",
                "2s",
                "-o",
                str(out),
                "--json",
            ]
        )
        == 0
    )
    assert "devices 18" in out.read_text()


# --- The parsers themselves, against anything typed -------------------------------------------


def _refused_or_bounded(parse, text, check):
    try:
        value = parse(text)
    except argparse.ArgumentTypeError as e:
        assert str(e) and "\n" not in str(e)
        return
    check(value)


@given(
    st.one_of(
        st.text(max_size=30),
        st.integers().map(str),
        st.floats(allow_nan=True, allow_infinity=True).map(repr),
    )
)
def test_integer_options(text):
    _refused_or_bounded(DEVICES, text, lambda v: 1 <= v <= limits.MAX_DEVICES)


@given(
    st.one_of(
        st.text(max_size=30),
        st.tuples(
            st.floats(allow_nan=True, allow_infinity=True),
            st.sampled_from(["", "s", "m", "h", "S", "x"]),
        ).map(lambda t: f"{t[0]!r}{t[1]}"),
    )
)
def test_durations(text):
    _refused_or_bounded(duration, text, lambda v: math.isfinite(v) and 0 < v <= limits.MAX_SECONDS)


@given(
    st.one_of(
        st.text(max_size=30),
        st.tuples(
            st.floats(allow_nan=True, allow_infinity=True),
            st.sampled_from(["", "B", "KiB", "GiB", "TB", "PiB"]),
        ).map(lambda t: f"{t[0]!r}{t[1]}"),
    )
)
def test_memory_sizes(text):
    _refused_or_bounded(
        memory_size, text, lambda v: isinstance(v, int) and 1 <= v <= limits.MAX_MEMORY
    )


@given(
    st.lists(
        st.tuples(
            st.sampled_from(["F", "B", "W", "comm", "f", "X", ""]),
            st.one_of(
                st.floats(allow_nan=True, allow_infinity=True).map(repr), st.text(max_size=5)
            ),
        ),
        max_size=5,
    )
)
def test_costs(parts):
    def bounded(values):
        assert set(values) == {"F", "B", "W", "comm"}
        assert all(math.isfinite(v) and 0 <= v <= limits.MAX_SECONDS for v in values.values())

    _refused_or_bounded(op_costs, ",".join(f"{k}={v}" for k, v in parts), bounded)


def test_small_parsers():
    assert integer(0, 3)(" 2 ") == 2 and seconds_value("0", zero=True) == 0.0
    assert duration("2m") == 120.0 and duration("1.5H") == 5400.0
    assert memory_size("80GiB") == 80 * 2**30 and memory_size("0.5KiB") == 512
    with pytest.raises(argparse.ArgumentTypeError, match="must be at most 3"):
        integer(0, 3)("4")
    assert output(".json")("x.json") == "x.json"


def test_check_output(tmp_path):
    assert check_output(str(tmp_path / "a.json"), (".json",), "-o") == str(tmp_path / "a.json")
    for path, why in (
        (str(tmp_path), "is a folder"),
        ("", "no file name given"),
        (str(tmp_path / "a.txt"), "must end in .json"),
        (str(tmp_path / "x" / "a.json"), "there is no folder"),
    ):
        with pytest.raises(Exception, match=f"-o: .*{why}"):
            check_output(path, (".json",), "-o")
