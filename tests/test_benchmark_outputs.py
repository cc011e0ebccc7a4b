"""Every benchmark that takes -o refuses an output it cannot write before it does any work
(benchmarks/machine.py: check_outputs), in one line naming the path, with status 2: a run of up
to half an hour must not find out at its end that its table has nowhere to go.

The scripts are found from their files (an `add_argument("-o", ...)`, or tuner_gap.py's
`add_levers_arguments`, which adds it), so a new benchmark is checked without being listed here. That a script did no work is told by what it left: nothing
printed but the one line (each prints its progress as it goes) and nothing written."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"
SCRIPTS = sorted(
    p.name
    for p in BENCHMARKS.glob("*.py")
    # -o of its own, or tuner_gap.py's (`add_levers_arguments`) for the scripts that read tuner.py's
    if re.search(
        r"""add_argument\(\s*["']-o["']|^ +add_levers_arguments\(ap""", p.read_text(), re.M
    )
)


def test_the_scripts_are_found():
    # A pattern that matched nothing would leave every test below without a case.
    assert {"tuner.py", "cluster.py", "published.py", "tuner_memory.py"} <= set(SCRIPTS), SCRIPTS


def refused(script: str, output: Path, cwd: Path) -> str:
    """Run `script -o output` in `cwd`; its one line of standard error, after checking that it
    exited with status 2 and printed nothing else. Skips a script that cannot start here."""
    done = subprocess.run(
        [sys.executable, str(BENCHMARKS / script), "-o", str(output)],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=300,  # a hang, not a measure: a refusal takes a second or two
    )
    if done.returncode != 2 and "ModuleNotFoundError" in done.stderr:
        pytest.skip(f"{script} cannot start here: {done.stderr.strip().splitlines()[-1]}")
    assert (done.returncode, done.stdout) == (2, ""), (done.returncode, done.stdout, done.stderr)
    lines = done.stderr.splitlines()
    assert len(lines) == 1, done.stderr
    return lines[0]


@pytest.mark.parametrize("script", SCRIPTS)
def test_a_missing_folder_is_refused_before_any_work(script, tmp_path):
    output = tmp_path / "missing" / "out.md"
    line = refused(script, output, tmp_path)
    assert line == f"{script}: cannot write {output}: there is no folder {output.parent}"
    assert list(tmp_path.iterdir()) == []  # no folder made, nothing written


@pytest.mark.parametrize("script", SCRIPTS)
def test_a_folder_as_the_output_is_refused_before_any_work(script, tmp_path):
    output = tmp_path / "out.md"
    output.mkdir()
    assert refused(script, output, tmp_path) == f"{script}: cannot write {output}: it is a folder"
    assert list(tmp_path.iterdir()) == [output] and list(output.iterdir()) == []


@pytest.mark.parametrize(
    "script,given",
    [
        ("tuner_gap.py", lambda p: ["--levers", str(p.with_suffix(".json"))]),  # beside the md
        ("tuner_memory.py", lambda p: ["--levers", str(p.with_suffix(".json"))]),
        ("cluster.py", lambda p: ["--from-json", str(p)]),
    ],
)
def test_an_output_that_is_an_input_is_refused_before_any_work(script, given, tmp_path):
    output = tmp_path / "out.md"
    source = output.with_suffix(".json") if script != "cluster.py" else output
    source.write_text("[]")
    done = subprocess.run(
        [sys.executable, str(BENCHMARKS / script), *given(output), "-o", str(output)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert (done.returncode, done.stdout) == (2, ""), done.stderr
    assert done.stderr.strip() == f"{script}: cannot write {source}: it is an input of this run"
    assert source.read_text() == "[]"  # untouched


LEVERS_READERS = ("tuner_gap.py", "tuner_memory.py", "order_gap_levers.py")
"""The scripts that pick their cases from tuner.py's results (`--levers`)."""


@pytest.mark.parametrize("script", LEVERS_READERS)
@pytest.mark.parametrize(
    "content,why",
    [
        (None, "No such file or directory"),
        ("nope", "Expecting value: line 1 column 1 (char 0)"),
        ('{"a": 1}', "not a list of tuner.py's results"),
        ("[1, 2]", "not a list of tuner.py's results"),
    ],
)
def test_unreadable_cases_are_refused_before_any_work(script, content, why, tmp_path):
    levers = tmp_path / "levers.json"
    if content is not None:
        levers.write_text(content)
    output = tmp_path / "out.md"
    done = subprocess.run(
        [sys.executable, str(BENCHMARKS / script), "--levers", str(levers), "-o", str(output)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert (done.returncode, done.stdout) == (2, ""), done.stderr
    assert done.stderr.strip() == f"{script}: cannot read {levers}: {why}"
    assert not output.exists()


@pytest.mark.parametrize(
    "script",
    sorted(
        p.name
        for p in BENCHMARKS.glob("*.py")
        if re.search(r"^ +add_jobs\(ap", p.read_text(), re.M)
    ),
)
@pytest.mark.parametrize("jobs", ["0", "65", "two"])
def test_jobs_out_of_range_are_refused_before_any_work(script, jobs, tmp_path):
    output = tmp_path / "out.md"
    done = subprocess.run(
        [sys.executable, str(BENCHMARKS / script), "--jobs", jobs, "-o", str(output)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert (done.returncode, done.stdout) == (2, ""), done.stderr
    assert done.stderr.splitlines()[-1].startswith(f"{script}: error: argument --jobs: ")
    assert list(tmp_path.iterdir()) == []


def test_the_command_a_table_records_runs_again(monkeypatch):
    """The command line a table says made it reads back as the same arguments: an empty one
    (`--others ''`, the tuner benchmark's "no other methods") and one with a space survive."""
    import shlex

    sys.path.insert(0, str(BENCHMARKS))
    from machine import command_line

    argv = ["--others", "", "--models", "a b", "--budget", "60"]
    monkeypatch.setattr(sys, "argv", ["tuner.py", *argv])
    line = command_line("python benchmarks/tuner.py")
    assert line == "python benchmarks/tuner.py --others '' --models 'a b' --budget 60"
    assert shlex.split(line)[2:] == argv
