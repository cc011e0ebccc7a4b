"""Every benchmark that takes -o refuses an output it cannot write before it does any work
(benchmarks/machine.py: check_outputs), in one line naming the path, with status 2: a run of up
to half an hour must not find out at its end that its table has nowhere to go. So do those that
read tuner.py's results refuse a file they cannot take cases from, and those that run cases side
by side a number of jobs they cannot run.

The scripts are found from their files (an `add_argument("-o", ...)`, or tuner_gap.py's
`add_levers_arguments`, which adds it; machine.py's `add_jobs`), so a new benchmark is checked
without being listed here. That a script did no work is told by what it left: nothing printed
but the one line (each prints its progress as it goes) and nothing written."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


def calling(pattern: str) -> list[str]:
    """The benchmark scripts with a line matching the regular expression `pattern`."""
    return sorted(
        p.name for p in BENCHMARKS.glob("*.py") if re.search(pattern, p.read_text(), re.M)
    )


LEVERS_READERS = calling(r"^ +add_levers_arguments\(ap")
"""The scripts that pick their cases from tuner.py's results (`--levers`)."""
SCRIPTS = sorted({*calling(r"""add_argument\(\s*["']-o["']"""), *LEVERS_READERS})
"""The scripts that take -o, of their own or with `add_levers_arguments`."""


def run(script: str, *args: str, cwd: Path) -> subprocess.CompletedProcess:
    """`script args` run in `cwd`, what it prints captured as text."""
    return subprocess.run(
        [sys.executable, str(BENCHMARKS / script), *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=300,  # a hang, not a measure: a refusal takes a second or two
    )


def test_the_scripts_are_found():
    # A pattern that matched nothing would leave every test below without a case.
    assert {"tuner.py", "cluster.py", "published.py", "tuner_memory.py"} <= set(SCRIPTS), SCRIPTS
    assert set(LEVERS_READERS) == {"tuner_gap.py", "tuner_memory.py", "order_gap_levers.py"}


def refused(script: str, output: Path, cwd: Path) -> str:
    """Run `script -o output` in `cwd`; its one line of standard error, after checking that it
    exited with status 2 and printed nothing else. Skips a script that cannot start here."""
    done = run(script, "-o", str(output), cwd=cwd)
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
        *((s, lambda p: ["--levers", str(p.with_suffix(".json"))]) for s in LEVERS_READERS),
        ("cluster.py", lambda p: ["--from-json", str(p)]),
    ],
)
def test_an_output_that_is_an_input_is_refused_before_any_work(script, given, tmp_path):
    output = tmp_path / "out.md"
    # --levers names the .json written beside the md; cluster.py's --from-json the md itself
    source = output if script == "cluster.py" else output.with_suffix(".json")
    source.write_text("[]")
    done = run(script, *given(output), "-o", str(output), cwd=tmp_path)
    assert (done.returncode, done.stdout) == (2, ""), done.stderr
    assert done.stderr.strip() == f"{script}: cannot write {source}: it is an input of this run"
    assert source.read_text() == "[]"  # untouched


CASE = '"model": "jamba-v0.1", "devices": 4, "microbatches": 8'
"""A case the tuner takes, as tuner.py writes it."""
BELOW_BOUND = '"tuned": 2.0, "tight_bound": 1.0'
"""A tuned time and a tight bound that put a case below 0.90 of the bound."""


@pytest.mark.parametrize("script", LEVERS_READERS)
@pytest.mark.parametrize(
    "content,why",
    [
        (None, "no such tuner.py results file"),
        ("nope", "not valid JSON: Expecting value at line 1, column 1"),
        ("[" * 100_000 + "]" * 100_000, "not valid JSON: nested too deep"),
        (b"\xff[]", "not UTF-8 text (byte 0 is 0xff)"),
        ('{"a": 1}', "not a list of tuner.py's results"),
        ('"[]"', "not a list of tuner.py's results"),
        ("[1, 2]", "not a list of tuner.py's results"),
        ('[{"tuned": "fast", "tight_bound": 1}]', "not a list of tuner.py's results"),
        (
            '[{"tuned": 1.0, "tight_bound": 1.0}]',
            "no case below 0.9 of the tight bound: nothing to look at",
        ),
        (f"[{{{BELOW_BOUND}}}]", "a case without its model"),
        (
            f"[{{{BELOW_BOUND}, {CASE.replace('jamba-v0.1', 'nope')}}}]",
            "its case nope 4x8: no built-in model or spec file 'nope' ...",
        ),
        (
            f"[{{{BELOW_BOUND}, {CASE.replace(' 4,', ' -4,')}}}]",
            "its case jamba-v0.1 -4x8: devices: Input should be greater than or equal to 1 ...",
        ),
        (
            f"[{{{BELOW_BOUND}, {CASE.replace(' 8', ' 1e300')}}}]",
            "its case jamba-v0.1 4x1e+300: microbatches: ...",
        ),
    ],
    # short names: a test's id goes into the environment of what it runs (PYTEST_CURRENT_TEST)
    ids=lambda value: repr(value)[:40],
)
def test_unreadable_cases_are_refused_before_any_work(script, content, why, tmp_path):
    levers = tmp_path / "levers.json"
    if isinstance(content, bytes):
        levers.write_bytes(content)
    elif content is not None:
        levers.write_text(content)
    output = tmp_path / "out.md"
    done = run(script, "--levers", str(levers), "-o", str(output), cwd=tmp_path)
    assert (done.returncode, done.stdout) == (2, ""), done.stderr
    lines = done.stderr.splitlines()
    assert len(lines) == 1, done.stderr
    line, expected = lines[0], f"{script}: cannot read {levers}: {why}"
    # a `why` ending in " ..." is the start of its line (the built-in models, pydantic's words)
    if why.endswith(" ..."):
        assert line.startswith(expected.removesuffix(" ...")), line
    else:
        assert line == expected
    assert not output.exists()


@pytest.mark.parametrize("script", LEVERS_READERS)
def test_a_fifo_of_cases_is_refused_without_a_hang(script, tmp_path):
    levers = tmp_path / "levers.json"
    os.mkfifo(levers)  # opened for reading, it would wait for a writer forever
    done = run(script, "--levers", str(levers), "-o", str(tmp_path / "out.md"), cwd=tmp_path)
    assert (done.returncode, done.stdout) == (2, ""), done.stderr
    assert done.stderr.strip() == (
        f"{script}: cannot read {levers}: is not a regular file (a FIFO or a device cannot be "
        "read as a tuner.py results file)"
    )


@pytest.mark.parametrize("script", calling(r"^ +add_jobs\(ap"))
@pytest.mark.parametrize("jobs", ["0", "65", "two"])
def test_jobs_out_of_range_are_refused_before_any_work(script, jobs, tmp_path):
    output = tmp_path / "out.md"
    done = run(script, "--jobs", jobs, "-o", str(output), cwd=tmp_path)
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


@pytest.mark.parametrize(
    "rev, why",
    [
        ("no-such-commit", "not a commit of this repository"),
        ("HEAD~100000", "not a commit of this repository"),
        ("", "not a commit of this repository"),  # once taken as no --before: a whole run
    ],
)
def test_a_before_commit_that_cannot_run_is_refused_before_any_work(rev, why, tmp_path):
    output = tmp_path / "out.md"
    done = run("tuner_cold.py", "--before", rev, "-o", str(output), cwd=tmp_path)
    assert (done.returncode, done.stdout) == (2, ""), done.stderr
    assert done.stderr.strip() == f"tuner_cold.py: --before {shlex.quote(rev)}: {why}"
    assert list(tmp_path.iterdir()) == []


def test_a_before_commit_with_another_grammar_is_refused(tmp_path):
    first = subprocess.run(
        ["git", "rev-list", "--max-parents=0", "HEAD"],
        cwd=BENCHMARKS,
        capture_output=True,
        text=True,
    ).stdout.split()
    if not first:
        pytest.skip("not a git checkout with its history")
    done = run("tuner_cold.py", "--before", first[0], "-o", str(tmp_path / "o.md"), cwd=tmp_path)
    assert done.returncode == 2 and "differ from this checkout's" in done.stderr, done.stderr
