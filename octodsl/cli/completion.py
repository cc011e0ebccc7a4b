"""`octodsl completion bash|zsh`: print a shell completion script for the commands and options,
generated from the parser itself (so it cannot fall behind it).

A static script rather than argcomplete: nothing to install, and a TAB does not start Python
(argcomplete builds the whole parser on each, which imports every command's module: over a
second, numba included). It completes the commands, each command's options, the
values of options with a fixed set (`--partition`, ...) and of positionals with one (`gen
NAME`), the built-in names of options that take a name or a file (`--device`, `--link`: when no
name matches, files), and files elsewhere (the shell's own file completion, `complete -o default`).
zsh runs the same script through its bash emulation (`bashcompinit`, which calls it in sh
emulation: arrays from 0, as in bash; zsh's own matching then filters the words offered).
"""

from __future__ import annotations

import argparse
import shlex

SHELLS = ("bash", "zsh")


def register(sub) -> None:
    p = sub.add_parser(
        "completion",
        help="print a shell completion script (bash or zsh)",
        description="Print a completion script for octodsl's commands and options. "
        'Enable it with `eval "$(octodsl completion bash)"` in ~/.bashrc, or '
        '`eval "$(octodsl completion zsh)"` in ~/.zshrc.',
    )
    p.add_argument("shell", choices=SHELLS, metavar="SHELL", help="bash or zsh")
    p.set_defaults(func=run)


def run(args) -> int:
    from . import build_parser

    print(script(build_parser(), args.shell), end="")
    return 0


def commands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    """The parser's commands by name, in the order `--help` lists them."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def _words(items) -> str:
    """A word list for `compgen -W` (which splits it at spaces: octodsl's names have none)."""
    return " ".join(str(w) for w in items)


def fixed_values(action: argparse.Action):
    """The values an option takes when they are a fixed set: its argparse `choices`, else its
    type's (`choices`: common.switch, common.integer's short ranges, --overlap's names;
    `names`: the built-ins of a NameOrFile). None for an option that takes any value."""
    if action.choices is not None:
        return action.choices
    return getattr(action.type, "choices", None) or getattr(action.type, "names", None)


def _options(parser: argparse.ArgumentParser) -> list[str]:
    return [s for a in parser._actions for s in a.option_strings]


def _command_case(name: str, p: argparse.ArgumentParser) -> str:
    """The `case` branch of one command: its options with a fixed set of values, the options
    that take any value (a file, a number: the shell's default completion), its options, and
    the fixed values of its positionals."""
    cases: list[str] = []
    takes_value: list[str] = []
    for a in p._actions:
        if not a.option_strings or a.nargs == 0:
            continue
        names = fixed_values(a)
        if names is not None:
            # a fixed set, or a built-in's name or a file (NameOrFile): the names that match,
            # else (none matching) the shell's file completion
            cases.append(
                f"                {'|'.join(a.option_strings)}) "
                f'COMPREPLY=($(compgen -W {shlex.quote(_words(names))} -- "$cur")); '
                "return ;;"
            )
        else:
            takes_value += a.option_strings
    if takes_value:
        cases.append(f"                {'|'.join(takes_value)}) return ;;")
    lines = [f"        {shlex.quote(name)})"]
    if cases:
        lines += ['            case "$prev" in', *cases, "            esac"]
    positional = [w for a in p._actions if not a.option_strings and a.choices for w in a.choices]
    lines.append(f"            opts={shlex.quote(_words(_options(p)))}")
    lines.append(f"            values={shlex.quote(_words(positional))}")
    lines.append("            ;;")
    return "\n".join(lines)


def script(parser: argparse.ArgumentParser, shell: str) -> str:
    """The completion script for `shell` (one of SHELLS)."""
    from ..version import version

    prog = parser.prog
    cmds = commands(parser)
    cases = "\n".join(_command_case(name, p) for name, p in cmds.items())
    body = f"""\
_octodsl_complete() {{
    local cur="${{COMP_WORDS[COMP_CWORD]}}" prev="${{COMP_WORDS[COMP_CWORD-1]}}"
    local cmd="" opts values i
    # --opt=VALUE: bash splits at '=', the option is the word before it
    if [[ "$cur" == "=" ]]; then cur=""; fi
    if [[ "$prev" == "=" ]]; then prev="${{COMP_WORDS[COMP_CWORD-2]}}"; fi
    # the command: the first word after the program that is not an option (the program's own
    # options take no value)
    for ((i = 1; i < COMP_CWORD; i++)); do
        if [[ "${{COMP_WORDS[i]}}" != -* ]]; then cmd="${{COMP_WORDS[i]}}"; break; fi
    done
    COMPREPLY=()
    case "$cmd" in
        "")
            opts={shlex.quote(_words(_options(parser)))}
            values={shlex.quote(_words(cmds))}
            ;;
{cases}
        *) return ;;
    esac
    if [[ "$cur" == -* ]]; then
        COMPREPLY=($(compgen -W "$opts" -- "$cur"))
    elif [[ -n "$values" ]]; then
        COMPREPLY=($(compgen -W "$values" -- "$cur"))
    fi
    # nothing matched: `-o default` completes file names
}}
complete -o default -F _octodsl_complete {prog}
"""
    head = f"# {shell} completion for {prog} {version()}, printed by `{prog} completion {shell}`\n"
    if shell == "zsh":
        head += "autoload -U +X bashcompinit && bashcompinit\n"
    return head + body
