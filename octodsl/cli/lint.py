"""`octodsl lint FILE... [--strict]`: check plans; exit 0 clean, 1 on errors, 2 on usage errors."""

from __future__ import annotations

import sys

from ..lint import lint_source
from .common import read_text


def register(sub) -> None:
    p = sub.add_parser("lint", help="check .octo plans and report every problem with its position")
    p.add_argument("files", nargs="+", metavar="FILE", help=".octo files ('-' reads standard input)")
    p.add_argument("--strict", action="store_true", help="treat warnings as errors (exit 1)")
    p.add_argument("-q", "--quiet", action="store_true", help="print nothing for clean files")
    p.set_defaults(func=run)


def run(args) -> int:
    errors = warnings = 0
    for path in args.files:
        source = read_text(path)
        _, diags = lint_source(source, path)
        for d in diags:
            print(d.render(path, source), file=sys.stderr if d.is_error else sys.stdout)
        e = sum(d.is_error for d in diags)
        errors += e
        warnings += len(diags) - e
        if not diags and not args.quiet:
            print(f"{path}: ok")
    if errors or warnings:
        print(f"{errors} error{'s' * (errors != 1)}, {warnings} warning{'s' * (warnings != 1)}",
              file=sys.stderr)
    return 1 if errors or (args.strict and warnings) else 0
