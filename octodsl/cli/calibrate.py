"""`octodsl calibrate --model SPEC [--ranks 2,4] [--profile BASE.json] -o PROFILE.json
[--microbatch-size B] [--seq-len S] [--steps 12] [--warmup 2] [--workdir DIR] [--trace TRACE.json --plan PLAN.octo ...] [--json]`: profile the
model, run calibration plans of its own through the executor on this machine (deepspeed
launcher), fit what the layer profile does not capture (link latency and bandwidth, per-op
overhead and scale, processor sharing, overlap slowdown, optimizer step, step overhead, memory
held for W) and write a calibrated profile that `simulate --profile` accepts. With --trace (and
one --plan per trace), fit from runs measured already instead."""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

from .. import limits
from ..errors import OctoError
from ..extras import require
from ..units import size
from .common import (
    MICROBATCH_SIZE,
    SEQ_LEN,
    STEPS,
    WARMUP,
    UserError,
    check_outputs,
    integer,
    output,
    print_json,
    progress_bar,
    write_output,
    writing,
)
from .profile import TIMING, measure

if TYPE_CHECKING:  # imported where used, to keep the command line quick to start
    from ..calibrate.fit import Run

BUSY = 0.25
"""CPU cores used by other processes during the calibration runs above which a warning says the
fit is noisy."""


def register(sub) -> None:
    p = sub.add_parser(
        "calibrate",
        help="fit the simulator's costs to real runs on this machine "
        "and write a calibrated profile",
    )
    p.add_argument(
        "--model",
        metavar="SPEC",
        help="model (built-in name or spec file); default: the --profile's",
    )
    p.add_argument(
        "--profile",
        metavar="BASE.json",
        help="start from this profile (default: profile the model now)",
    )
    p.add_argument(
        "-o",
        "--output",
        type=output(".json"),
        required=True,
        metavar="PROFILE.json",
        help="where to write the calibrated profile (a .json file)",
    )
    p.add_argument(
        "--ranks",
        type=_ranks,
        default="2,4",
        metavar="N[,N...]",
        help="process counts of the calibration plans (default 2,4: pipelines of 2 "
        "and 4 processes)",
    )
    p.add_argument(
        "--microbatch-size",
        type=MICROBATCH_SIZE,
        metavar="B",
        help="profile at this micro-batch size (default: the spec's)",
    )
    p.add_argument(
        "--seq-len",
        type=SEQ_LEN,
        metavar="S",
        help="profile at this sequence length (default: the spec's)",
    )
    p.add_argument(
        "--steps",
        type=STEPS,
        default=12,
        metavar="N",
        help="training steps per calibration plan (default 12: docs/calibration.md, "
        '"Steady state")',
    )
    p.add_argument(
        "--warmup",
        type=WARMUP,
        default=2,
        metavar="N",
        help="steps at the start of each run (or --trace) that are not timed (default 2)",
    )
    p.add_argument(
        "--trace",
        action="append",
        default=[],
        metavar="TRACE.json",
        help="fit from this measured trace instead of running plans (repeat; one "
        "--plan per --trace, in the same order)",
    )
    p.add_argument(
        "--plan", action="append", default=[], metavar="PLAN.octo", help="the plan each --trace ran"
    )
    p.add_argument(
        "--workdir",
        metavar="DIR",
        help="keep the calibration plans and traces here (default: a temporary directory, removed)",
    )
    p.add_argument("--json", action="store_true", help="print the calibration as JSON")
    p.set_defaults(func=run)


def run(args) -> int:
    from ..costs.profile import ProfileError, read_profile, write_profile
    from ..models import SpecError, load_model

    check_outputs(args, "output")
    _check_options(args)
    ranks = args.ranks
    base = None
    if args.profile:
        try:
            base = read_profile(args.profile)
        except ProfileError as e:
            raise UserError(str(e)) from None
        if base.calibration is not None:
            base = base.model_copy(update={"calibration": None})  # refit from the layer costs
    try:
        if args.model:
            spec = load_model(args.model)
        else:
            assert base is not None, "checked above: without --model there is a --profile"
            spec = base.model
    except SpecError as e:
        raise UserError(str(e)) from None
    if base is not None and (args.microbatch_size or args.seq_len):
        raise UserError(
            "--microbatch-size and --seq-len are for profiling; the --profile fixes them"
        )
    # The options are bounded where they are read: the spec accepts any shape they allow.
    spec = spec.with_shape(args.microbatch_size, args.seq_len)
    if base is not None and args.model and _layers(spec) != _layers(base.model):
        raise UserError(f"{args.profile} measured {base.model.name}, not {args.model}")

    from rich.console import Console

    console = Console(stderr=True)
    work = (
        Path(args.workdir) if args.workdir else Path(tempfile.mkdtemp(prefix="octodsl-calibrate-"))
    )
    with writing(work):
        work.mkdir(parents=True, exist_ok=True)
    try:
        if base is None:
            base = measure(spec, "cpu", TIMING, console, transient=True)
        base_path = work / "base.profile.json"
        with writing(base_path):
            write_profile(base, base_path)
        if args.trace:
            runs, probe, source = _from_traces(args, base, base_path)
        else:
            runs, probe, source = _from_launches(
                args, base, base_path, _model_ref(base.model, work), ranks, work, console
            )
        from ..calibrate.fit import fit

        with console.status("fitting"):
            calibration = fit(base.cost_table(base_path), runs, probe=probe, source=source)
        profile = base.model_copy(update={"calibration": calibration})
        with writing(args.output):
            write_profile(profile, args.output)
    finally:
        if not args.workdir:
            import shutil

            shutil.rmtree(work, ignore_errors=True)
    if args.json:
        spec = profile.model
        print_json(
            {
                "model": spec.name,
                "microbatch_size": spec.microbatch_size,
                "seq_len": spec.seq_len,
                **json.loads(calibration.model_dump_json()),
            }
        )
    else:
        Console(highlight=False).print(render(calibration, args.output, profile.model))
    return 0


def _check_options(args) -> None:
    """What the options alone say is wrong, before anything runs."""
    if args.steps < args.warmup + 2:
        raise UserError(
            f"--steps must be at least --warmup + 2 = {args.warmup + 2} (the steps "
            "after the warm-up are timed, from one step's start to the next's)"
        )
    if len(args.trace) != len(args.plan):
        raise UserError(
            f"give one --plan per --trace ({len(args.trace)} traces, {len(args.plan)} plans)"
        )
    if args.profile is None and args.model is None:
        raise UserError("give --model (or a --profile to start from)")
    if not (args.trace and args.profile):  # else it only fits, from the traces and the profile
        require("calibrate", "torch", "deepspeed")


def _layers(spec) -> dict:
    """A spec without its name and shape (what a profile must match)."""
    return spec.model_dump(exclude={"name", "description", "microbatch_size", "seq_len"})


def _model_ref(spec, work: Path) -> str:
    """How the calibration plans name the model: the built-in's name, else a spec file."""
    from ..models import SpecError, load_model

    try:
        if _layers(load_model(spec.name)) == _layers(spec):
            return spec.name
    except SpecError:
        pass
    path = work / "model.json"
    write_output(path, spec.model_dump_json(indent=1))
    return str(path)


def _shape(spec) -> dict:
    return {"microbatch_size": spec.microbatch_size, "seq_len": spec.seq_len}


_PROCESSES = integer(2, limits.MAX_DEVICES)


def _ranks(text: str) -> list[int]:
    """--ranks: process counts, each at least 2 (a pipeline)."""
    parts = [x for x in text.split(",") if x.strip()]
    if not parts:
        raise argparse.ArgumentTypeError(f"cannot read {text!r} (e.g. 2,4)")
    try:
        return sorted({_PROCESSES(x) for x in parts})
    except argparse.ArgumentTypeError as e:
        raise argparse.ArgumentTypeError(
            f"{e} (pipelines need at least 2 processes; e.g. 2,4)"
        ) from None


def _from_traces(args, base, base_path):
    from ..calibrate.fit import Run
    from ..calibrate.measured import as_ran, read_trace
    from ..costs.resolve import cost_table
    from ..lang import PlanSyntaxError, load_plan

    runs = []
    for trace_path, plan_path in zip(args.trace, args.plan, strict=True):
        try:
            plan = load_plan(plan_path)
        except PlanSyntaxError as e:
            raise UserError(e.render() if hasattr(e, "render") else str(e)) from None
        except OSError as e:
            raise UserError(f"{plan_path}: {e.strerror}") from None
        trace = read_trace(trace_path, args.warmup)  # a TraceError names the trace already
        plan = as_ran(plan, trace)  # the executor's split of a plan that names no layers
        try:
            # The profile's shape must be the one the plan states, as for `simulate --profile`.
            cost_table(
                profile=args.profile or str(base_path),
                microbatch_size=plan.header.microbatch_size,
                seq_len=plan.header.seq_len,
            ).stage_costs(plan)
        except OctoError as e:
            raise UserError(f"{plan_path}: {e}") from None
        runs.append(Run(plan, trace, Path(plan_path).stem))
    return runs, [], "traces " + ", ".join(args.trace)


def _from_launches(args, base, base_path, model, ranks, work, console):
    from ..calibrate.plans import calibration_plans
    from ..calibrate.runner import RunError, run_plans

    try:
        plans = calibration_plans(model, str(base_path), ranks, shape=_shape(base.model))
    except OctoError as e:
        raise UserError(str(e)) from None
    for _, name, text in plans:
        write_output(work / f"{name}.octo", text)
    runs: list[Run] = []
    probe: list[tuple[int, float]] = []
    total = len(plans) * args.steps
    with progress_bar(console, "{task.description}", not sys.stderr.isatty()) as bar:
        task = bar.add_task("calibration runs", total=total)

        def progress(event, fields):
            if event == "launch":
                bar.update(task, description=f"starting {fields['processes']} processes")
            elif event == "probe":
                bar.update(task, description="probing the link")
            elif event == "run":
                bar.update(task, description=f"running {fields['run']}")
            elif event == "step":
                bar.advance(task)

        for p in ranks:
            mine = [(name, text) for q, name, text in plans if q == p]
            try:
                launch = run_plans(base.model, mine, p, work, steps=args.steps, progress=progress)
            except RunError as e:
                raise UserError(str(e)) from None
            if not probe:
                probe = launch.link
            busy = [r.other_load for r in launch.runs if r.other_load is not None]
            if busy and max(busy) > BUSY:
                console.print(
                    f"warning: other processes used up to {max(busy):.1f} CPU cores while "
                    f"the {p}-process calibration plans ran: their timings, and so the "
                    "fit, are noisy; calibrate on a quiet machine",
                    style="yellow",
                )
            runs += launch.fit_runs(dict(mine), args.warmup)
    source = (
        f"{len(runs)} calibration plans on {', '.join(map(str, ranks))} processes, "
        f"{args.steps} steps each"
    )
    return runs, probe, source


def render(cal, output: str, spec):
    from rich.console import Group
    from rich.table import Table
    from rich.text import Text

    from .profile import shape

    head = Text(f"calibrated on {cal.source}\n", style="bold")
    head.append(f"{spec.name} at {shape(spec)}\n", style="")
    t = Table(box=None, pad_edge=False, header_style="bold")
    for col in ("parameter", "value"):
        t.add_column(col)
    t.add_row(
        "link", f"{cal.link.latency * 1e6:.0f} us + bytes / {cal.link.bandwidth / 1e9:.2f} GB/s"
    )
    for k in ("F", "B", "W", "BW"):
        if k in cal.op_scale:
            t.add_row(
                f"{k} ops",
                f"x{cal.op_scale[k]:.3f} profiled + {cal.op_overhead.get(k, 0) * 1e3:.2f} ms",
            )
    t.add_row(
        "processor sharing",
        "none"
        if cal.cores is None and not cal.contention
        else f"{'unlimited' if cal.cores is None else f'{cal.cores:g}'} cores, contention "
        f"{cal.contention:.2f} per other busy process"
        + (
            f", {cal.oversubscription:.2f} per busy process beyond the cores"
            if cal.oversubscription
            else ""
        ),
    )
    t.add_row("overlap slowdown", f"{cal.overlap_slowdown:.2f}")
    t.add_row("optimizer step", f"{cal.update_per_param * 1e9:.2f} ns per parameter")
    t.add_row("step overhead", f"{cal.step_overhead * 1e3:.1f} ms per iteration")
    if cal.act_w_extra:
        t.add_row("held for W", ", ".join(f"{k} {size(v, 2)}" for k, v in cal.act_w_extra.items()))
    runs = Table(
        box=None,
        pad_edge=False,
        header_style="bold",
        title="calibration runs (fitted on)",
        title_justify="left",
    )
    for col in ("plan", "measured", "simulated", "error"):
        runs.add_column(col, justify="left" if col == "plan" else "right")
    for r in cal.fit.get("runs", []):
        runs.add_row(
            r["plan"], f"{r['measured']:.3f} s", f"{r['simulated']:.3f} s", f"{r['error']:+.1%}"
        )
    notes = Text("".join(f"note: {n}\n" for n in cal.fit.get("notes", [])), style="yellow")
    return Group(head, t, Text(""), runs, notes, Text(f"wrote {output}", style="dim"))
