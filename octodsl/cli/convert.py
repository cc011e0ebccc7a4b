"""`octodsl convert IN [--to TARGET] [-o OUT]`: a plan to another system's terms.

Without --to, by the files' extensions: .octo <-> the action CSV of torch.distributed.pipelining
(-o required). With --to, from a .octo plan: `torch` the same CSV, `megatron` Megatron-LM's
arguments (octodsl/interop/megatron.py), `deepspeed` a PipelineModule with the plan's cuts and a
ds_config fragment (octodsl/interop/deepspeed_out.py), printed, or written to -o when given.

A .octo input must lint without errors (no output could carry what is wrong), and what an
output drops or runs otherwise is named in a warning; a plan the target cannot express is an
error (exit 1) saying why. A CSV input is checked as it is read (octodsl/interop/torch_csv.py)."""

from __future__ import annotations

import sys
from pathlib import Path

from ..gen import render_plan
from ..interop import export_warnings, read_csv, write_csv
from ..lang import PlanSyntaxError
from ..plan import Plan
from ..version import made_by
from .common import UserError, check_output, check_outputs, read_text, write_output
from .plans import checked_plan

TARGETS = {"torch": (".csv",), "megatron": (".txt", ".sh"), "deepspeed": (".py",)}
"""--to's targets and the files -o may write for each."""


def register(sub) -> None:
    p = sub.add_parser(
        "convert",
        help="convert a plan to PyTorch's pipeline schedule CSV, "
        "Megatron-LM's arguments or a DeepSpeed PipelineModule (and a CSV back)",
    )
    p.add_argument(
        "input", metavar="IN", help="a .octo plan (or, without --to, a .csv to read back)"
    )
    p.add_argument(
        "--to",
        choices=list(TARGETS),
        metavar="TARGET",
        help="torch (the action CSV of torch.distributed.pipelining), megatron "
        "(Megatron-LM arguments) or deepspeed (PipelineModule snippet and ds_config); "
        "default: by the extensions of IN and OUT",
    )
    p.add_argument(
        "-o",
        "--output",
        metavar="OUT",
        help="where to write: .csv or .octo without "
        "--to; with it .csv (torch), .txt or .sh (megatron), .py (deepspeed); "
        "printed when not given",
    )
    p.set_defaults(func=run)


def run(args) -> int:
    check_outputs(args, "output")
    if args.to is None:
        return _by_extension(args)
    if Path(args.input).suffix.lower() != ".octo":
        raise UserError(f"--to {args.to} converts a .octo plan, not {args.input}")
    if args.output is not None:
        check_output(args.output, TARGETS[args.to], "-o/--output")
    plan = _linted(args.input)
    if args.to == "torch":
        _report([d.render(args.input, read_text(args.input)) for d in export_warnings(plan)])
        text = write_csv(plan)
    else:
        from ..interop.deepspeed_out import deepspeed_snippet
        from ..interop.megatron import megatron_args

        convert = megatron_args if args.to == "megatron" else deepspeed_snippet
        export = convert(plan, Path(args.input).name)
        _report([f"{args.input}: warning: {w}" for w in export.warnings])
        text = export.text
    if args.output is None:
        sys.stdout.write(text)
    else:
        write_output(args.output, text)
    return 0


def _by_extension(args) -> int:
    """Today's form: .octo -> .csv or .csv -> .octo, as the extensions say."""
    out = args.output or ""
    kinds = (Path(args.input).suffix.lower(), Path(out).suffix.lower())
    if kinds not in ((".octo", ".csv"), (".csv", ".octo")):
        raise UserError(
            f"convert turns .octo into .csv or .csv into .octo, not "
            f"{kinds[0] or 'no extension'} into {kinds[1] or 'no extension'} "
            f"(or give --to {', '.join(TARGETS)} for a .octo plan)"
        )
    check_output(out, (kinds[1],), "-o/--output")
    if kinds[0] == ".octo":
        plan = _linted(args.input)
        _report([d.render(args.input, read_text(args.input)) for d in export_warnings(plan)])
        write_output(out, write_csv(plan))
        return 0
    source = read_text(args.input)
    try:
        plan, warnings = read_csv(source, args.input)
    except PlanSyntaxError as e:
        _report([e.render()])
        return 1
    _report([w.render(args.input, source) for w in warnings])
    title = (
        f"Imported from {Path(args.input).name} (torch.distributed.pipelining action CSV) "
        f"by {made_by('convert')}."
    )
    write_output(out, render_plan(plan, title=title))
    return 0


def _linted(path: str) -> Plan:
    """The plan of a .octo file with its lint warnings reported (its errors refuse it)."""
    plan, source, warnings = checked_plan(path)
    _report([d.render(path, source) for d in warnings])
    return plan


def _report(lines: list[str]) -> None:
    for line in lines:
        print(line, file=sys.stderr)
