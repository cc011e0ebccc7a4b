"""`octodsl profile --model SPEC [--device cpu|cuda] [-o PROFILE.json]`: measure every distinct
layer of a model on this machine and write a profile the simulator and tuner accept."""

from __future__ import annotations

import sys

from ..errors import OctoError
from ..models import SpecError, load_model
from .common import UserError


def register(sub) -> None:
    p = sub.add_parser("profile", help="measure per-layer F, B, W times and activation memory "
                       "with the torch layers on this machine")
    p.add_argument("--model", required=True, metavar="SPEC",
                   help="a built-in model name or a spec file (.yaml/.json)")
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu",
                   help="where to measure (default cpu)")
    p.add_argument("-o", "--output", metavar="PROFILE.json",
                   help="where to write the profile (default NAME.DEVICE.profile.json)")
    p.add_argument("--threads", type=int, default=1, metavar="N",
                   help="CPU threads, as each executor rank will use (default 1: one rank per core)")
    p.add_argument("--warmup", type=int, default=2, metavar="N", help="untimed runs per layer")
    p.add_argument("--repeats", type=int, default=5, metavar="N",
                   help="timed runs per layer; the median is kept (default 5)")
    p.add_argument("--microbatch-size", type=int, metavar="B", help="override the spec's")
    p.add_argument("--seq-len", type=int, metavar="S", help="override the spec's")
    p.set_defaults(func=run)


def run(args) -> int:
    if args.repeats < 1 or args.warmup < 0 or args.threads < 1:
        raise UserError("--repeats and --threads must be at least 1, --warmup at least 0")
    try:
        spec = load_model(args.model).with_shape(args.microbatch_size, args.seq_len)
    except SpecError as e:
        raise UserError(str(e)) from None
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from ..costs.profile import write_profile
    from ..costs.profiler import profile_model

    console = Console(stderr=True)
    output = args.output or f"{spec.name}.{args.device}.profile.json"
    with Progress(TextColumn("profiling {task.description}"), BarColumn(), MofNCompleteColumn(),
                  TimeElapsedColumn(), console=console, transient=not sys.stderr.isatty()) as bar:
        task = bar.add_task(spec.name, total=None)

        def progress(done: int, total: int, label: str) -> None:
            bar.update(task, completed=done, total=total, description=f"{spec.name}: {label}")

        try:
            profile = profile_model(spec, args.device, args.threads, args.warmup, args.repeats,
                                    progress)
        except (NotImplementedError, OctoError) as e:
            raise UserError(str(e)) from None
    try:
        write_profile(profile, output)
    except OSError as e:
        raise UserError(f"{output}: cannot write: {e.strerror}") from None
    _print_summary(profile, output)
    return 0


def _print_summary(profile, output: str) -> None:
    from rich.console import Console
    from rich.table import Table

    spec = profile.model
    threads = f", {profile.threads} thread(s)" if profile.threads else ""
    table = Table(title=f"{spec.name} on {profile.device_name}{threads}: micro-batch "
                        f"{spec.microbatch_size} x {spec.seq_len}, median of {profile.repeats}")
    for col in ("layers", "kind", "count", "F ms", "B ms", "W ms", "act MiB", "act_w MiB"):
        table.add_column(col, justify="left" if col in ("layers", "kind") else "right")
    for m in profile.layers:
        first = str(m.layers[0]) + ("..." if len(m.layers) > 1 else "")
        table.add_row(first, m.kind, str(len(m.layers)), f"{m.f * 1e3:.2f}", f"{m.b * 1e3:.2f}",
                      f"{m.w * 1e3:.2f}", f"{m.act / 2**20:.2f}", f"{m.act_w / 2**20:.2f}")
    console = Console()
    console.print(table)
    console.print(f"wrote {output}", highlight=False)
