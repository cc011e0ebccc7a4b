"""Hostile input to the command line, one test per class the last round's campaign found (model
specs and Hugging Face configs: tests/models/test_hostile_specs.py): every input file that is
not what it claims (a profile, a trace, a plan; a FIFO, /dev/zero, an empty path), every output
that would destroy an input or is no file name, standard output on a full disk, option values
in other scripts' digits. Each is one line, `octodsl: error: WHERE: what`, exit 2 (as every
bad input), never an internal error, a hang or a file half written. And one meaning
everywhere: gen writes no plan lint refuses, simulate and models warn as lint does, hints name
each value once, the completion offers every fixed set of values."""

from __future__ import annotations

import argparse
import errno
import io
import json
import os
import shutil
import subprocess
import sys

import pytest

from octodsl.cli import build_parser, main
from octodsl.cli.completion import commands, fixed_values, script
from octodsl.lint import lint_source
from octodsl.plan import zero_without_copies

from ..models.test_hostile_specs import deadline


@pytest.fixture
def plan(here, capsys) -> str:
    assert (
        main(["gen", "1f1b", "-p", "2", "-m", "4", "--model", "nemotron-h-tiny", "-o", "plan.octo"])
        == 0
    )
    capsys.readouterr()
    return "plan.octo"


def _error(capsys, *argv: str, code: int = 2) -> str:
    """The one line a refused command prints (nothing on standard output)."""
    assert main(list(argv)) == code
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.startswith("octodsl: error: ") and captured.err.count("\n") == 1, (
        captured.err
    )
    assert "internal error" not in captured.err and "Traceback" not in captured.err
    return captured.err.removeprefix("octodsl: error: ").rstrip("\n")


# --- Input files ------------------------------------------------------------------------------

BAD_FILES = {  # name: contents (bytes), each a class of file that is not what it claims
    "binary.json": b'{"a": "\xff"}',
    "deep.json": b"[" * 100_000 + b"]" * 100_000,
    "digits.json": b'{"a": ' + b"9" * 5000 + b"}",
    "syntax.json": b'{"a": 1,}',
}


@pytest.fixture
def bad_files(here):
    for name, data in BAD_FILES.items():
        (here / name).write_bytes(data)
    os.mkfifo(here / "fifo.json")
    (here / "folder.json").mkdir()
    with deadline(30):  # a reader that opened the FIFO would wait forever for a writer
        yield


@pytest.mark.parametrize(
    "name,message",
    [
        ("binary.json", "binary.json: not UTF-8 text (byte 7 is 0xff)"),
        (
            "fifo.json",
            "fifo.json: is not a regular file (a FIFO or a device cannot be read as a {what})",
        ),
        (
            "/dev/zero",
            "/dev/zero: is not a regular file (a FIFO or a device cannot be read as a {what})",
        ),
        ("folder.json", "folder.json: is a folder, not a {what}"),
        ("gone.json", "gone.json: no such {what}"),
        ("", "'': an empty path names no {what}"),
    ],
)
@pytest.mark.parametrize("what", ["profile", "trace"])
def test_an_unreadable_profile_or_trace_is_one_line(plan, bad_files, capsys, name, message, what):
    """A FIFO would hang the read and /dev/zero fill the memory: both are refused at the stat."""
    argv = (
        ["simulate", plan, "--profile", name]
        if what == "profile"
        else ["compare", plan, "--trace", name, "--model", "nemotron-h-tiny", "--no-files"]
    )
    assert _error(capsys, *argv) == message.format(what=what)


@pytest.mark.parametrize(
    "name,message",
    [
        ("deep.json", "deep.json: not valid JSON: nested too deep"),
        ("digits.json", "digits.json: not valid JSON: a number of 4,300 digits or more"),
        (
            "syntax.json",
            "syntax.json: not valid JSON: Expecting property name enclosed in double "
            "quotes at line 1, column 9",
        ),
    ],
)
def test_a_trace_that_is_not_json_is_one_line(plan, bad_files, capsys, name, message):
    assert (
        _error(capsys, "compare", plan, "--trace", name, "--model", "nemotron-h-tiny", "--no-files")
        == message
    )


def test_a_trace_field_of_the_wrong_type_is_named(plan, here, capsys):
    (here / "other.json").write_text(json.dumps({"traceEvents": [], "otherData": [1, 2]}))
    assert (
        _error(
            capsys,
            "compare",
            plan,
            "--trace",
            "other.json",
            "--model",
            "nemotron-h-tiny",
            "--no-files",
        )
        == "other.json: otherData must be an object, not a list"
    )


def test_a_profile_whose_spec_block_is_no_mapping_is_one_line(plan, here, capsys):
    spec = {"name": "x", "hidden": 8, "vocab": 8, "seq_len": 8, "pattern": "M", "mamba2": [1]}
    (here / "p.json").write_text(json.dumps({"model": spec}))
    line = _error(capsys, "simulate", plan, "--profile", "p.json")
    assert (
        line.startswith("p.json: not a valid profile (")
        and "mamba2: must be a mapping of the mamba2 layers' dimensions" in line
    ), line


@pytest.mark.parametrize("command", ["lint", "fmt", "simulate"])
def test_a_plan_that_is_not_a_file_is_one_line(bad_files, capsys, command):
    for name, message in (
        ("fifo.json", "fifo.json: is not a regular file"),
        ("/dev/zero", "/dev/zero: is not a regular file"),
        ("binary.json", "binary.json: not UTF-8 text"),
        ("", "'': an empty path names no file"),
    ):
        assert _error(capsys, command, name).startswith(message)


# --- Outputs ----------------------------------------------------------------------------------


@pytest.fixture
def spec(here, capsys) -> str:
    assert main(["models", "nemotron-h-tiny", "--yaml"]) == 0
    (here / "spec.json").write_text(
        json.dumps(__import__("yaml").safe_load(capsys.readouterr().out))
    )
    return "spec.json"


def _links(here, target: str) -> list[tuple[str, str]]:
    """(name, how it names `target`): the file itself, a symbolic and a hard link to it."""
    stem, suffix = os.path.splitext(target)
    os.symlink(target, here / f"{stem}-sym{suffix}")
    os.link(here / target, here / f"{stem}-hard{suffix}")
    return [
        (target, "is"),
        (f"{stem}-sym{suffix}", "links to"),
        (f"{stem}-hard{suffix}", "links to"),
    ]


def test_an_output_that_is_or_links_to_an_input_is_refused_before_it_is_written(
    plan, spec, here, capsys
):
    before = {p.name: p.read_bytes() for p in here.iterdir() if p.is_file()}
    for name, how in _links(here, spec):
        for argv, option in (
            (["simulate", plan, "--model", spec, "--trace", name], "--trace"),
            (
                [
                    "compare",
                    plan,
                    "--trace",
                    spec,
                    "--model",
                    "nemotron-h-tiny",
                    "--side-by-side",
                    name,
                ],
                "--side-by-side",
            ),
            (["calibrate", "--profile", spec, "-o", name], "-o/--output"),
        ):
            assert _error(capsys, *argv) == (
                f"{option}: {name} {how} the input {spec}: writing "
                "it would destroy it (give another file name)"
            )
    csv_link = here / "plan-sym.csv"
    os.symlink(plan, csv_link)
    assert _error(capsys, "convert", plan, "-o", "plan-sym.csv").startswith(
        "-o/--output: plan-sym.csv links to the input plan.octo"
    )
    assert {p.name: p.read_bytes() for p in here.iterdir() if p.name in before} == before


@pytest.mark.parametrize(
    "argv",
    [
        ["convert", "{plan}", "--to", "torch", "-o", "out.csv/"],
        ["simulate", "{plan}", "--trace", "out.json/"],
        ["gen", "1f1b", "-p", "2", "-m", "4", "-o", "out.octo/"],
    ],
)
def test_a_trailing_slash_is_no_file_name(plan, here, capsys, argv):
    line = _error(capsys, *[a.format(plan=plan) for a in argv])
    assert line.endswith("ends in '/': give a file's name, not a folder's"), line
    assert not (here / "out.csv").exists() and not (here / "out.json").exists()


def test_every_top_output_is_checked_before_the_search(here, capsys):
    (here / "best-3.octo").mkdir()
    assert (
        _error(
            capsys,
            "tune",
            "--model",
            "nemotron-h-tiny",
            "--gpus",
            "8",
            "--global-batch",
            "16",
            "--top",
            "3",
            "-o",
            "best.octo",
        )
        == "--top: cannot write best-3.octo: it is a folder"
    )
    assert not (here / "best.octo").exists()


class _FullDisk(io.TextIOBase):
    """Standard output on a full disk: every write fails with ENOSPC."""

    def write(self, text):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    def writable(self):
        return True


@pytest.mark.parametrize(
    "argv",
    [
        ["--version"],
        ["completion", "bash"],
        ["models", "nemotron-h-tiny", "--json"],
        ["devices", "--json"],
        ["--help"],
        ["lint", "--help"],
    ],
)
def test_standard_output_on_a_full_disk_is_one_line(capsys, monkeypatch, argv):
    monkeypatch.setattr(sys, "stdout", _FullDisk())
    assert main(argv) == 2
    assert capsys.readouterr().err == (
        "octodsl: error: standard output: cannot write: No space left on device\n"
    )


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="no /dev/full")
@pytest.mark.parametrize("argv", [["--version"], ["completion", "bash"], ["--help"]])
def test_dev_full_is_one_line_with_the_flush_at_exit(argv):
    """What a buffered print leaves is written at exit, past main's handlers: main flushes.
    argparse's help drops the write's OSError unless the parser lets it through."""
    with open("/dev/full", "w") as full:
        run = subprocess.run(
            [sys.executable, "-m", "octodsl", *argv],
            stdout=full,
            stderr=subprocess.PIPE,
            text=True,
            timeout=120,
        )
    assert (run.returncode, run.stderr) == (
        2,
        "octodsl: error: standard output: cannot write: No space left on device\n",
    )


# --- Option values ----------------------------------------------------------------------------


@pytest.mark.parametrize("value", ["1_0", "١٢", "٤", "1e1", "0x10", "²"])
def test_integer_options_take_ascii_digits_only(capsys, value):
    """int() reads 1_0 and the digits of other scripts; a plan does not, and nor do options."""
    assert (
        _error(capsys, "gen", "1f1b", "-p", value, "-m", "8")
        == f"--devices/-p: {value!r} is not a whole number"
    )
    assert _error(capsys, "models", "nemotron-h-tiny", "--zero", value).startswith("--zero: ")


@pytest.mark.parametrize("value", ["1_0s", "١٢", "1_0"])
def test_seconds_take_ascii_digits_only(capsys, value):
    assert _error(
        capsys,
        "tune",
        "--model",
        "nemotron-h-tiny",
        "-p",
        "2",
        "-m",
        "4",
        "--budget",
        value,
        "-o",
        "t.octo",
    ).startswith(f"--budget: {value!r} is not a number of seconds (digits 0-9)")


# --- One meaning everywhere -------------------------------------------------------------------


def test_gen_writes_no_plan_that_lint_refuses(here, capsys):
    assert _error(
        capsys,
        "gen",
        "1f1b",
        "-p",
        "2",
        "-m",
        "4",
        "--model",
        "nemotron-h-tiny",
        "--tp",
        "2",
        "--seq-len",
        "255",
        "-o",
        "g.octo",
    ) == (
        "the plan these options make does not lint: error[E703]: sequence parallelism splits "
        "the sequence over tp 2, but its length 255 is not a multiple of 2; hint: a seq_len of "
        "254 or 256, or 'sequence_parallel false'"
    )
    assert not (here / "g.octo").exists()


@pytest.mark.parametrize("zero", [1, 2])
def test_simulate_and_models_warn_of_zero_without_copies_as_lint_does(plan, capsys, zero):
    message = zero_without_copies(zero, 1)
    with open(plan) as f:  # the same plan with `zero N` in its header: lint's W404
        text = f.read().replace("{\n", f"{{\n  zero {zero}\n", 1)
    linted = lint_source(text, plan)[1]
    assert [d.message for d in linted if d.code == "W404"] == [message]
    assert main(["simulate", plan, "--zero", str(zero), "--json"]) == 0
    assert capsys.readouterr().err == (
        f"{plan}: warning[W404]: {message} (give --dp 2 or more, or --zero 0)\n"
    )
    assert main(["models", "nemotron-h-tiny", "--zero", str(zero), "--json"]) == 0
    assert capsys.readouterr().err == (
        f"--zero: warning[W404]: {message} (give --dp 2 or more, or --zero 0)\n"
    )
    assert main(["simulate", plan, "--zero", str(zero), "--dp", "2", "--json"]) == 0
    assert capsys.readouterr().err == ""


@pytest.mark.parametrize(
    "seq_len,tp,hint",
    [
        (1, 4, "a seq_len of 4, or 'sequence_parallel false'"),
        (6, 4, "a seq_len of 4 or 8, or 'sequence_parallel false'"),
        (16777215, 2, "a seq_len of 16777214 or 16777216, or 'sequence_parallel false'"),
    ],
)
def test_hints_name_each_value_once(seq_len, tp, hint):
    text = f'plan "p" {{\n  devices 2\n  microbatches 2\n  tp {tp}\n  seq_len {seq_len}\n}}\nstages 2\n'
    diags = [d for d in lint_source(text, "p.octo")[1] if d.code == "E703"]
    assert [d.hint for d in diags] == [hint]


BASH = shutil.which("bash")


def _offered(name: str, option: str, words: str) -> list[str]:
    """What the completion script offers after `octodsl NAME OPTION <TAB>` with `words` typed."""
    script_text = script(build_parser(), "bash")
    run = subprocess.run(
        [
            BASH,
            "-c",
            f"{script_text}\nCOMP_WORDS=(octodsl {name} {option} "
            f"'{words}'); COMP_CWORD=3; _octodsl_complete; "
            'printf "%s\\n" "${COMPREPLY[@]}"',
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    return run.stdout.split()


def _fixed_sets() -> list[tuple[str, str, list[str]]]:
    """(command, option, its values) of every option with a fixed set, from the parser."""
    found = []
    for name, p in commands(build_parser()).items():
        for a in p._actions:
            values = fixed_values(a)
            if a.option_strings and a.nargs != 0 and values is not None:
                found.append((name, a.option_strings[-1], [str(v) for v in values]))
    return found


def test_the_fixed_sets_include_the_typed_options():
    """switch (true/false), --zero's 0..2 and --overlap's names are sets too, not just the
    options argparse checks with `choices`."""
    sets = {(c, o): v for c, o, v in _fixed_sets()}
    assert sets[("simulate", "--zero")] == ["0", "1", "2"]
    assert sets[("models", "--sequence-parallel")] == ["true", "false"]
    assert sets[("gen", "--grad-accumulation-fusion")] == ["true", "false"]
    assert "p2p-comm" in sets[("simulate", "--overlap")]
    assert ("simulate", "--recompute") in sets and ("convert", "--to") in sets


@pytest.mark.skipif(BASH is None, reason="bash is not installed")
def test_the_completion_offers_the_values_of_every_option_with_a_fixed_set():
    for name, option, values in _fixed_sets():
        if values and all(" " not in v for v in values) and len(values) < 20:
            assert _offered(name, option, "") == values, (name, option)


def test_every_metavar_that_spells_a_set_is_a_fixed_set():
    """An option whose help spells its values (`true|false`) has them as a fixed set, so
    that the completion offers them."""
    sets = {(c, o) for c, o, _ in _fixed_sets()}
    spelled = [
        (name, a.option_strings[-1])
        for name, p in commands(build_parser()).items()
        for a in p._actions
        if a.option_strings
        and isinstance(a.metavar, str)
        and "|" in a.metavar
        and "[" not in a.metavar
    ]
    missing = [s for s in spelled if s not in sets]
    assert spelled and missing == []


def test_the_integer_type_is_a_fixed_set_only_when_short():
    from octodsl.cli.common import DEVICES, ZERO, integer

    assert ZERO.choices == ("0", "1", "2") and DEVICES.choices is None
    with pytest.raises(argparse.ArgumentTypeError, match="is not a whole number"):
        integer(0, 5)("٣")
