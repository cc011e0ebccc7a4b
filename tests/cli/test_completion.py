"""`octodsl completion bash|zsh`: the script, run in a real bash, completes every command, each
command's options and the values of the options that have a fixed set."""

from __future__ import annotations

import shutil
import subprocess

import pytest

from octodsl.cli import COMMANDS, build_parser, main
from octodsl.cli.completion import commands, script

BASH = shutil.which("bash")
ZSH = shutil.which("zsh")


@pytest.fixture(scope="module")
def bash_script(tmp_path_factory) -> str:
    path = tmp_path_factory.mktemp("completion") / "octodsl.bash"
    path.write_text(script(build_parser(), "bash"))
    return str(path)


def complete(bash_script: str, *words: str) -> list[str]:
    """What a TAB after `octodsl WORDS...` offers (the last word is the one being completed)."""
    line = ["octodsl", *words]
    program = (
        f"source {bash_script}\n"
        f"COMP_WORDS=({' '.join(repr(w) for w in line)}); COMP_CWORD={len(line) - 1}\n"
        "_octodsl_complete\n"
        "printf '%s\\n' \"${COMPREPLY[@]}\"\n"
    )
    done = subprocess.run(
        [BASH, "--norc", "--noprofile", "-c", program], capture_output=True, text=True, timeout=30
    )
    assert done.returncode == 0 and not done.stderr, done.stderr
    return [w for w in done.stdout.splitlines() if w]


def test_the_command_prints_the_script(capsys):
    assert main(["completion", "bash"]) == 0
    bash = capsys.readouterr().out
    assert bash == script(build_parser(), "bash")
    assert "complete -o default -F _octodsl_complete octodsl" in bash
    assert main(["completion", "zsh"]) == 0
    zsh = capsys.readouterr().out
    # zsh runs the bash script through its bash emulation
    assert "autoload -U +X bashcompinit && bashcompinit" in zsh
    assert zsh.endswith(bash.split("\n", 1)[1])


needs_bash = pytest.mark.skipif(BASH is None, reason="bash is not installed")


@needs_bash
def test_every_command(bash_script):
    assert complete(bash_script, "") == list(COMMANDS)
    assert complete(bash_script, "si") == ["simulate"]
    assert complete(bash_script, "c") == ["convert", "compare", "calibrate", "completion"]
    assert set(complete(bash_script, "--")) == {"--help", "--debug", "--version"}
    # after the program's own options, still the commands
    assert complete(bash_script, "--debug", "ge") == ["gen"]


@needs_bash
def test_every_option_of_every_command(bash_script):
    for name, parser in commands(build_parser()).items():
        long = [s for a in parser._actions for s in a.option_strings if s.startswith("--")]
        assert complete(bash_script, name, "--") == long, name
    simulate = complete(bash_script, "simulate", "--")
    assert {"--json", "--trace", "--png", "--model", "--recompute"} <= set(simulate)
    # after a plan and an option with its value
    assert complete(bash_script, "simulate", "a.octo", "--link", "nvlink", "--js") == ["--json"]
    assert complete(bash_script, "lint", "-") == ["-h", "--help", "--strict", "-q", "--quiet"]


@needs_bash
def test_values(bash_script):
    assert complete(bash_script, "gen", "--partition", "") == [
        "time",
        "parameters",
        "equal",
        "megatron",
        "megatron-ends",
    ]
    assert complete(bash_script, "gen", "--partition", "=", "p") == ["parameters"]
    assert complete(bash_script, "gen", "zb-") == ["zb-h1", "zb-h2", "zb-v"]
    assert complete(bash_script, "profile", "--device", "c") == ["cpu", "cuda"]
    assert complete(bash_script, "completion", "") == ["bash", "zsh"]
    # a file, a number: nothing offered here, the shell's own (file name) completion runs
    assert complete(bash_script, "simulate", "--trace", "") == []
    assert complete(bash_script, "gen", "1f1b", "-p", "") == []
    assert complete(bash_script, "simulate", "") == []
    assert complete(bash_script, "no-such-command", "--") == []


@pytest.mark.skipif(ZSH is None, reason="zsh is not installed")
def test_zsh(tmp_path):
    """The zsh script, called as zsh's bashcompinit calls it (`_bash_complete` sets COMP_WORDS
    and COMP_CWORD and runs `compgen -F`, in sh emulation); zsh's own matching then keeps the
    words that start with the one typed, as the filter here does."""
    path = tmp_path / "octodsl.zsh"
    path.write_text(script(build_parser(), "zsh"))

    def zsh_complete(*words: str) -> list[str]:
        line = ["octodsl", *words]
        program = (
            f"autoload -U +X compinit && compinit -u -d {tmp_path}/zcompdump\n"
            f"source {path}\n"
            f"COMP_WORDS=({' '.join(repr(w) for w in line)}); COMP_CWORD={len(line) - 1}\n"
            f'words=("${{COMP_WORDS[@]}}"); CURRENT={len(line)}\n'
            f"compgen -F _octodsl_complete -- {line[-1]!r}\n"
        )
        done = subprocess.run(
            [ZSH, "-f", "-c", program], capture_output=True, text=True, timeout=30
        )
        assert done.returncode == 0 and not done.stderr, done.stderr
        return [w for w in done.stdout.splitlines() if w and w.startswith(line[-1])]

    assert zsh_complete("") == list(COMMANDS)
    assert zsh_complete("si") == ["simulate"]
    assert zsh_complete("gen", "--par") == ["--partition"]
    assert zsh_complete("gen", "--partition", "") == ["time", "parameters", "equal"]
    assert zsh_complete("gen", "zb-") == ["zb-h1", "zb-h2", "zb-v"]
    assert zsh_complete("simulate", "--trace", "") == []  # `-o default`: zsh's file completion
