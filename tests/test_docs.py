"""The examples the docs show are real: they lint clean."""

from __future__ import annotations

import re

from octodsl.lint import lint_source

from .conftest import REPO


def test_readme_plan_lints_clean():
    blocks = re.findall(r"```octo\n(.*?)```", (REPO / "README.md").read_text(), re.S)
    assert blocks
    for block in blocks:
        _, diags = lint_source(block, "README.md")
        assert diags == [], "\n".join(d.render("README.md", block) for d in diags)


DOCS_WITH_COMMANDS = ("README.md", "docs/cli.md", "docs/tutorial.md")
"""The docs whose every `octodsl COMMAND ... --option` is checked against the parser."""


def _segments(text: str):
    """The shell lines of the code blocks (continuations joined, prompts dropped) and the
    inline code spans of the prose."""
    parts = re.split(r"^```[^\n]*\n(.*?)^```", text, flags=re.S | re.M)
    for i, part in enumerate(parts):
        if i % 2:  # a code block
            yield from re.sub(r"\\\n\s*", " ", part).splitlines()
        else:
            yield from re.findall(r"`([^`\n]+)`", part)


def documented_options(text: str) -> list[tuple[str, str, str]]:
    """(command, option, the command line) for every option given after `octodsl COMMAND`."""
    from octodsl.cli import COMMANDS

    found = []
    for seg in _segments(text):
        for m in re.finditer(
            r"\boctodsl\s+(?:--debug\s+)?([a-z]+)\b(.*?)(?=$|\boctodsl\b| \| |&&|;| #)", seg
        ):
            if m.group(1) in COMMANDS:
                for opt in re.findall(r"(?<![\w-])(--?[A-Za-z][\w-]*)", m.group(2)):
                    found.append((m.group(1), opt, m.group(0)))
    return found


def test_finds_the_options_of_every_form():
    text = (
        "`octodsl tune --model M -p 4` and\n```sh\n$ octodsl simulate a.octo \\\n  --trace t.json "
        "| tee x --no  # --not\nocto lint --x\n```\n| `octodsl convert IN [--to torch\\|megatron]` |"
    )
    assert [(c, o) for c, o, _ in documented_options(text)] == [
        ("tune", "--model"),
        ("tune", "-p"),
        ("simulate", "--trace"),
        ("convert", "--to"),
    ]


def test_every_option_the_docs_give_a_command_is_accepted_by_it():
    from octodsl.cli import build_parser

    (sub,) = [a for a in build_parser()._actions if a.dest == "command"]
    options = {name: set(p._option_string_actions) for name, p in sub.choices.items()}
    seen = 0
    for doc in DOCS_WITH_COMMANDS:
        for command, opt, line in documented_options((REPO / doc).read_text()):
            assert opt in options[command], f"{doc}: `{line}`: octodsl {command} has no {opt}"
            seen += 1
    assert seen > 50
