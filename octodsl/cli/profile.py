"""`octodsl profile --model SPEC [--device cpu|cuda] [-o PROFILE.json]`: measure every distinct
layer of a model on this machine and write a profile the simulator and tuner accept."""

from __future__ import annotations

import sys

from .. import limits
from ..errors import OctoError
from ..extras import require
from ..models import SpecError, load_model
from .common import (
    MICROBATCH_SIZE,
    SEQ_LEN,
    STEPS,
    WARMUP,
    UserError,
    check_output,
    check_outputs,
    integer,
    output,
    progress_bar,
    writing,
)

TIMING = (1, 2, 5)
"""The defaults of --threads, --warmup and --repeats (calibrate's base profile uses them too)."""


def register(sub) -> None:
    p = sub.add_parser(
        "profile",
        help="measure per-layer F, B, W times and activation memory "
        "(and what selective recompute saves and costs) with the torch layers on "
        "this machine",
    )
    p.add_argument(
        "--model",
        required=True,
        metavar="SPEC",
        help="a built-in model name or a spec file (.yaml/.json)",
    )
    p.add_argument(
        "--device", choices=("cpu", "cuda"), default="cpu", help="where to measure (default cpu)"
    )
    p.add_argument(
        "-o",
        "--output",
        type=output(".json"),
        metavar="PROFILE.json",
        help="where to write the profile (default NAME.DEVICE.profile.json)",
    )
    p.add_argument(
        "--threads",
        type=integer(1, limits.MAX_THREADS),
        default=TIMING[0],
        metavar="N",
        help="CPU threads, as each executor rank will use (default 1: one rank per core)",
    )
    p.add_argument(
        "--warmup", type=WARMUP, default=TIMING[1], metavar="N", help="untimed runs per layer"
    )
    p.add_argument(
        "--repeats",
        type=STEPS,
        default=TIMING[2],
        metavar="N",
        help="timed runs per layer; the median is kept (default 5)",
    )
    p.add_argument(
        "--microbatch-size", type=MICROBATCH_SIZE, metavar="B", help="override the spec's"
    )
    p.add_argument("--seq-len", type=SEQ_LEN, metavar="S", help="override the spec's")
    p.set_defaults(func=run)


def measure(spec, device: str, timing: tuple[int, int, int], console, transient: bool):
    """Profile `spec` on `device` (`timing`: threads, warm-up runs, timed runs) behind a progress
    bar; what the profiler cannot do is a UserError."""
    from ..costs.profiler import profile_model

    with progress_bar(console, "profiling {task.description}", transient) as bar:
        task = bar.add_task(spec.name, total=None)

        def progress(done: int, total: int, label: str) -> None:
            bar.update(task, completed=done, total=total, description=f"{spec.name}: {label}")

        try:
            return profile_model(spec, device, *timing, progress)
        except (NotImplementedError, OctoError) as e:
            raise UserError(str(e)) from None


def run(args) -> int:
    require("profile", "torch")
    try:
        spec = load_model(args.model).with_shape(args.microbatch_size, args.seq_len)
    except SpecError as e:
        raise UserError(str(e)) from None
    from rich.console import Console

    from ..costs.profile import write_profile

    console = Console(stderr=True)
    output = args.output or check_output(
        f"{spec.name}.{args.device}.profile.json", (".json",), "-o/--output (default)"
    )
    check_outputs(args, "output", more=[("-o/--output (default)", output)])
    profile = measure(
        spec,
        args.device,
        (args.threads, args.warmup, args.repeats),
        console,
        transient=not sys.stderr.isatty(),
    )
    with writing(output):
        write_profile(profile, output)
    _print_summary(profile, output)
    return 0


def _print_summary(profile, output: str) -> None:
    from rich.console import Console
    from rich.table import Table

    spec = profile.model
    threads = f", {profile.threads} thread(s)" if profile.threads else ""
    table = Table(
        title=f"{spec.name} on {profile.device_name}{threads}: {shape(spec)}, median "
        f"of {profile.repeats}"
    )
    for col in (
        "layers",
        "kind",
        "count",
        "F ms",
        "B ms",
        "W ms",
        "act MiB",
        "act_w MiB",
        "sel +B ms",
        "sel -act MiB",
    ):
        table.add_column(col, justify="left" if col in ("layers", "kind") else "right")
    for m in profile.layers:
        first = str(m.layers[0]) + ("..." if len(m.layers) > 1 else "")
        table.add_row(
            first,
            m.kind,
            str(len(m.layers)),
            f"{m.f * 1e3:.2f}",
            f"{m.b * 1e3:.2f}",
            f"{m.w * 1e3:.2f}",
            f"{m.act / 2**20:.2f}",
            f"{m.act_w / 2**20:.2f}",
            f"{m.sel_f * 1e3:.2f}",
            f"{m.sel_act / 2**20:.2f}",
        )
    console = Console()
    console.print(table)
    console.print(f"wrote {output}, measured at {shape(spec)}", highlight=False, soft_wrap=True)


def shape(spec) -> str:
    """The micro-batch a profile measured, as `profile` and `calibrate` print it."""
    return (
        f"micro-batch size {spec.microbatch_size}, sequence length {spec.seq_len} "
        f"({spec.tokens:,} tokens)"
    )
