"""docs/tutorial.md cannot rot: its files are written and its commands run, in order, in a
fresh folder, and every output it shows is the one printed (`...` stands for any lines).

The training run (the `deepspeed` launch and what reads its trace) is the slow test; the fast
one runs everything before it."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from .conftest import REPO, free_port

TUTORIAL = REPO / "docs" / "tutorial.md"
LAUNCH = "deepspeed --num_gpus"
"""What marks the training run; it and every step after it are the slow test's."""


@dataclass(frozen=True)
class File:
    name: str
    text: str


@dataclass(frozen=True)
class Command:
    line: str
    shown: tuple[str, ...]  # the output the tutorial shows, `...` for any lines


def steps(text: str) -> list[File | Command]:
    """The files ("... as `NAME`:" before an octo block) and the console commands, in order."""
    found: list[File | Command] = []
    for m in re.finditer(r"(?:\bas\s+`([^`]+)`:\n\n)?```(\w+)\n(.*?)^```", text, re.S | re.M):
        name, kind, body = m.groups()
        if name:
            found.append(File(name, body))
        elif kind == "console":
            for chunk in re.split(r"^\$ ", body, flags=re.M)[1:]:
                line, *shown = chunk.rstrip("\n").split("\n")
                found.append(Command(line, tuple(shown)))
    return found


def matches(shown: tuple[str, ...], printed: list[str]) -> bool:
    """Whether `printed` is `shown`, each `...` line standing for any lines (none included)."""
    if not shown:
        return True
    if shown[0] == "...":
        return any(matches(shown[1:], printed[i:]) for i in range(len(printed) + 1))
    return bool(printed) and printed[0] == shown[0] and matches(shown[1:], printed[1:])


def test_finds_files_commands_and_outputs():
    text = (
        "Save it as `a.octo`:\n\n```octo\nplan\n```\n\n```console\n$ octodsl lint a.octo\n"
        "a.octo: ok\n$ true\n...\n```\n```sh\necho not run\n```\n"
    )
    assert steps(text) == [
        File("a.octo", "plan\n"),
        Command("octodsl lint a.octo", ("a.octo: ok",)),
        Command("true", ("...",)),
    ]
    assert matches(("a", "...", "z"), ["a", "b", "c", "z"]) and matches(("a", "..."), ["a"])
    assert not matches(("a", "z"), ["a", "b", "z"]) and not matches(("a",), ["b"])


def _run(tmp_path: Path, upto_launch: bool) -> None:
    (tmp_path / "examples").symlink_to(REPO / "examples")  # the tutorial works in the clone's root
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    ran = 0
    for step in steps(TUTORIAL.read_text()):
        if isinstance(step, File):
            (tmp_path / step.name).write_text(step.text)
            continue
        if upto_launch and LAUNCH in step.line:
            break
        # the launch as shown, on a port of its own (parallel workers, other test runs)
        command = step.line.replace(LAUNCH, f"deepspeed --master_port {free_port()} --num_gpus")
        done = subprocess.run(
            ["bash", "-c", command],
            cwd=tmp_path,
            env=env,
            text=True,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            timeout=540,
        )
        printed = [line.rstrip() for line in done.stdout.splitlines()]
        failing = any("error" in line for line in step.shown)  # a step that shows an error
        assert (done.returncode != 0) == failing, f"$ {step.line}\n{done.stdout}"
        assert matches(step.shown, printed), f"$ {step.line}\n{done.stdout}"
        ran += 1
    assert ran >= 5
    trace = json.loads((tmp_path / "first.trace.json").read_text())  # what Perfetto opens
    assert trace["traceEvents"]


def test_tutorial_up_to_the_training_run(tmp_path):
    _run(tmp_path, upto_launch=True)


@pytest.mark.slow
def test_tutorial_whole_with_the_deepspeed_run(tmp_path):
    _run(tmp_path, upto_launch=False)
    measured = json.loads((tmp_path / "measured.json").read_text())
    assert measured["traceEvents"]
