"""`octodsl lint FILE... [--strict]`: check plans; exit 0 clean, 1 on errors, 2 on usage errors."""

from __future__ import annotations

import sys

from ..lint import lint_source
from .common import read_text


def register(sub) -> None:
    p = sub.add_parser("lint", help="check .octo plans and report every problem with its position")
    p.add_argument(
        "files", nargs="+", metavar="FILE", help=".octo files ('-' reads standard input)"
    )
    p.add_argument("--strict", action="store_true", help="treat warnings as errors (exit 1)")
    p.add_argument("-q", "--quiet", action="store_true", help="print nothing for clean files")
    p.set_defaults(func=run)


def run(args) -> int:
    errors = warnings = hidden = 0
    for path in args.files:
        source = read_text(path)
        _, diags = lint_source(source, path)
        for d in diags:
            print(d.render(path, source), file=sys.stderr if d.is_error else sys.stdout)
        e = sum(d.count for d in diags if d.is_error)
        errors += e
        warnings += sum(d.count for d in diags) - e
        hidden += sum(d.more for d in diags)
        if not diags and not args.quiet:
            print(f"{path}: ok")
    if errors or warnings:
        print(
            f"{errors} error{'s' * (errors != 1)}, {warnings} warning{'s' * (warnings != 1)}"
            + (f" ({hidden} not shown)" if hidden else ""),
            file=sys.stderr,
        )
    return 1 if errors or (args.strict and warnings) else 0
