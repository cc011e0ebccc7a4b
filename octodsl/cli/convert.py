"""`octodsl convert IN -o OUT`: .octo <-> the action CSV of torch.distributed.pipelining, by the
files' extensions. A .octo input must lint without errors (the CSV could not carry what is
wrong), and what the CSV drops that changes how the plan runs (zero, recompute) is named in a
warning; a CSV input is checked as it is read (see octodsl/interop/torch_csv.py)."""

from __future__ import annotations

import sys
from pathlib import Path

from ..gen import render_plan
from ..interop import export_warnings, read_csv, write_csv
from ..lang import PlanSyntaxError
from ..lint import lint_source
from ..version import made_by
from .common import UserError, check_output, read_text, write_output


def register(sub) -> None:
    p = sub.add_parser("convert", help="convert a plan between .octo and PyTorch's pipeline "
                       "schedule CSV (torch.distributed.pipelining)")
    p.add_argument("input", metavar="IN", help="a .octo or .csv file")
    p.add_argument("-o", "--output", metavar="OUT", required=True, help="a .csv or .octo file")
    p.set_defaults(func=run)


def run(args) -> int:
    kinds = (Path(args.input).suffix.lower(), Path(args.output).suffix.lower())
    if kinds not in ((".octo", ".csv"), (".csv", ".octo")):
        raise UserError(f"convert turns .octo into .csv or .csv into .octo, not "
                        f"{kinds[0] or 'no extension'} into {kinds[1] or 'no extension'}")
    check_output(args.output, (kinds[1],), "-o/--output")
    source = read_text(args.input)
    if kinds[0] == ".octo":
        plan, diags = lint_source(source, args.input)
        if plan is None or any(d.is_error for d in diags):
            _report([d.render(args.input, source) for d in diags])
            return 1
        _report([d.render(args.input, source) for d in diags + export_warnings(plan)])
        write_output(args.output, write_csv(plan))
        return 0
    try:
        plan, warnings = read_csv(source, args.input)
    except PlanSyntaxError as e:
        _report([e.render()])
        return 1
    _report([w.render(args.input, source) for w in warnings])
    title = (f"Imported from {Path(args.input).name} (torch.distributed.pipelining action CSV) "
             f"by {made_by('convert')}.")
    write_output(args.output, render_plan(plan, title=title))
    return 0


def _report(lines: list[str]) -> None:
    for line in lines:
        print(line, file=sys.stderr)
