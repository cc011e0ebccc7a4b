"""`octodsl fmt FILE... [--check] [--expand]`: rewrite plans in canonical layout."""

from __future__ import annotations

import sys

from ..lang import PlanSyntaxError, analyze, parse_syntax
from ..lang.fmt import format_file
from .common import read_text, write_output


def register(sub) -> None:
    p = sub.add_parser("fmt", help="lay out .octo plans canonically (in place)")
    p.add_argument(
        "files", nargs="+", metavar="FILE", help=".octo files ('-': standard input to output)"
    )
    p.add_argument(
        "--check",
        action="store_true",
        help="change nothing; exit 1 and name the files that would change",
    )
    p.add_argument(
        "--expand", action="store_true", help="write every op explicitly (unroll ranges and loops)"
    )
    p.set_defaults(func=run)


def run(args) -> int:
    status = 0
    for path in args.files:
        source = read_text(path)
        try:
            text = format_source(source, path, args.expand)
        except PlanSyntaxError as e:
            print(e.render(), file=sys.stderr)
            status = 1
            continue
        if path == "-":
            sys.stdout.write(text)
        elif text != source:
            if args.check:
                print(f"{path}: would reformat")
                status = 1
            else:
                write_output(path, text)  # atomic: a full disk leaves the plan as it was
                print(f"{path}: reformatted")
    return status


def format_source(source: str, path: str = "<string>", expand: bool = False) -> str:
    """The canonical text of a plan; raises PlanSyntaxError on syntax errors (and, with
    `expand`, on errors that stop the plan from being built)."""
    file = parse_syntax(source, path)
    plan = None
    if expand:
        plan, diags = analyze(source, path)
        errors = [d for d in diags if d.is_error]
        if plan is None or errors:
            raise PlanSyntaxError(errors, path, source)
    return format_file(file, plan)
