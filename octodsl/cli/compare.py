"""`octodsl compare PLAN --trace MEASURED.json [--profile FILE | --model SPEC [--device D]]
[--link NAME] [--warmup N] [--json] [--side-by-side FILE] [--png FILE] [--no-files]`: the simulator's
iteration time, per-device busy and idle time, the time in each op kind and peak memory next to
a measured run's, with the error of each, and both timelines side by side (one Chrome trace, one PNG)."""

from __future__ import annotations

import math
from pathlib import Path

from ..errors import OctoError
from ..extras import installed, require
from ..units import size
from .common import (
    DEVICE,
    DEVICE_HELP,
    LINK,
    LINK_HELP,
    WARMUP,
    UserError,
    check_output,
    check_outputs,
    output,
    pipeline_link,
    print_json,
    stdout_console,
    writing,
)
from .simulate import load_plan_or_report


def register(sub) -> None:
    p = sub.add_parser(
        "compare",
        help="simulated vs measured: iteration time, busy and idle time "
        "per device, time per op kind, peak memory, and the two timelines side by side",
    )
    p.add_argument("plan", metavar="PLAN", help="the .octo plan the trace ran")
    p.add_argument(
        "--trace",
        required=True,
        metavar="MEASURED.json",
        help="Chrome trace of a run (examples/train.py --trace, or octodsl calibrate's)",
    )
    src = p.add_mutually_exclusive_group()
    src.add_argument("--profile", metavar="FILE", help="measured (and calibrated) per-layer costs")
    src.add_argument(
        "--model", metavar="SPEC", help="analytical costs of this model (default: the plan's model)"
    )
    p.add_argument(
        "--device",
        type=DEVICE,
        default="cpu",
        metavar="DEVICE",
        help=f"device of the analytical costs: {DEVICE_HELP} (default cpu)",
    )
    p.add_argument(
        "--link",
        type=LINK,
        metavar="NAME",
        help=f"link between devices: {LINK_HELP} "
        "(default: the calibrated profile's, else the device's node link for "
        "analytical costs, else loopback for a CPU profile, else nvlink)",
    )
    p.add_argument(
        "--warmup",
        type=WARMUP,
        default=1,
        metavar="N",
        help="steps at the start of the trace that are not timed (default 1)",
    )
    p.add_argument("--json", action="store_true", help="print one JSON object instead of the table")
    p.add_argument(
        "--side-by-side",
        type=output(".json"),
        metavar="FILE",
        help="write both "
        "timelines as one Chrome trace (default: TRACE.compare.json beside the trace)",
    )
    p.add_argument(
        "--png",
        type=output(".png"),
        metavar="FILE",
        help="write both timelines as one "
        "picture (default: TRACE.compare.png beside the trace; needs matplotlib)",
    )
    p.add_argument("--no-files", action="store_true", help="write neither file")
    p.set_defaults(func=run)


def run(args) -> int:
    from ..calibrate.compare import compare, write_png, write_side_by_side
    from ..calibrate.measured import TraceError, as_ran, read_trace
    from ..plan import PlanError

    if args.png:
        require("compare --png", "matplotlib")
    if not args.no_files:
        stem = Path(args.trace)
        stem = stem.with_name(stem.name.removesuffix(".json"))
        trace_out = args.side_by_side or check_output(
            f"{stem}.compare.json", (".json",), "--side-by-side (default)"
        )
        png_out = args.png or check_output(f"{stem}.compare.png", (".png",), "--png (default)")
        check_outputs(
            args,
            "side_by_side",
            "png",
            more=[("--side-by-side (default)", trace_out), ("--png (default)", png_out)],
        )
    plan = load_plan_or_report(args.plan)
    if plan is None:
        return 1
    try:
        trace = read_trace(args.trace, args.warmup)
        plan = as_ran(plan, trace)  # the executor's split of a plan that names no layers
    except TraceError as e:
        raise UserError(str(e)) from None
    costs, link = resolve_costs(args, plan)
    try:
        result = compare(plan, costs, link, trace)
    except TraceError as e:
        raise UserError(str(e)) from None
    except PlanError as e:
        raise UserError(f"{args.plan}: {e}") from None

    written = []
    if not args.no_files:
        with writing(trace_out):
            write_side_by_side(result, trace_out)
        written.append(trace_out)
        if installed("matplotlib"):  # the default picture is skipped without it
            with writing(png_out):
                write_png(result, png_out)
            written.append(png_out)
    if args.json:
        out = result.to_json()
        out["written"] = written
        print_json(out)
        return 0
    console = stdout_console()
    console.print(render(result))
    for path in written:
        console.print(f"wrote {path}", style="dim")
    return 0


def resolve_costs(args, plan):
    """(SimCosts, Link) as `octodsl simulate` resolves them, with compare's link default."""
    from ..costs.resolve import cost_table, header_costing
    from ..sim import SimCosts

    model = args.model or (None if args.profile else plan.header.model)
    if model is None and args.profile is None:
        raise UserError(f"{args.plan} names no model: give --profile or --model")
    try:
        table = cost_table(
            model=model, profile=args.profile, device=args.device, **header_costing(plan.header)
        )
        costs = SimCosts.from_table(table, plan)
    except OctoError as e:
        raise UserError(str(e)) from None
    return costs, pipeline_link(args.link, table, _node_link(args))


def _node_link(args):
    """The default link between devices: the device's node link for analytical costs; for a
    profile's, loopback on a CPU (processes of one machine talk over loopback), else nvlink."""
    if args.profile:
        from ..costs.profile import read_profile

        return "loopback" if read_profile(args.profile).device == "cpu" else "nvlink"
    from ..costs.devices import get_device

    return get_device(args.device).node_link


def render(c):
    from rich.console import Group
    from rich.table import Table
    from rich.text import Text

    head = Text()
    head.append(c.plan.header.name, style="bold")
    head.append(
        f": {c.plan.devices} devices x {c.plan.microbatches} micro-batches; "
        f"{len(c.measured.timed)} of {len(c.measured.steps)} measured steps timed"
        + (
            ""
            if c.measured.spread is None
            else f", {c.measured.spread:.0%} apart from fastest to slowest"
        )
        + "\n"
    )
    head.append(
        f"{c.result.costs.source}; link {c.link.name} ({c.link.latency * 1e6:.0f} us + "
        f"bytes / {c.link.bandwidth / 1e9:.2f} GB/s)",
        style="dim",
    )
    table = Table(box=None, pad_edge=False, header_style="bold")
    for col in ("metric", "device", "simulated", "measured", "error"):
        table.add_column(col, justify="left" if col == "metric" else "right")
    for m in c.metrics():
        fmt = size if m.name == "peak memory" else _time
        err = m.error
        style = "" if math.isnan(err) or abs(err) <= 0.05 else "bold red"
        table.add_row(
            m.name,
            "" if m.device is None else str(m.device),
            fmt(m.simulated),
            fmt(m.measured),
            Text("-" if math.isnan(err) else f"{err:+.1%}", style=style),
        )
    foot = Text()
    busy = [abs(m.error) for m in c.busy if not math.isnan(m.error)]
    foot.append(
        f"iteration time error {c.iteration.error:+.1%}; mean |error| busy "
        f"{sum(busy) / max(len(busy), 1):.1%}"
    )
    if c.memory_error is not None:
        foot.append(f", peak memory {c.memory_error:.1%}")
    else:
        foot.append(
            "; the trace has no memory counters (an older trace: the executor's "
            "traces now record them)"
        )
    for note in c.notes:
        foot.append(f"\nnote: {note}", style="yellow")
    return Group(head, Text(""), table, Text(""), foot)


def _time(seconds: float) -> str:
    if abs(seconds) >= 1:
        return f"{seconds:.3f} s"
    return f"{seconds * 1e3:.1f} ms"
