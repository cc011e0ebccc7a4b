"""Helpers shared by the command modules: reading inputs, checking and writing outputs, and the
one parser of each kind of option value (counts, byte sizes, seconds), bounded by
octodsl.limits, so that every command refuses the same bad values with the same message."""

from __future__ import annotations

import argparse
import contextlib
import math
import os
import re
import sys
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

from .. import inputs, limits
from ..costs import devices as _devices
from ..costs.devices import (
    INTER_NODE_LINK,  # --inter-node-link's default, for the commands
)
from ..errors import OctoError
from ..fileio import unwritable, write_atomic
from ..plan import ACCUM_DTYPES, OVERLAPS, RUNTIME_SWITCHES, RUNTIMES
from ..units import exact_size, parse_size


class UserError(OctoError):
    """A bad command-line argument or an unreadable file."""


class Parser(argparse.ArgumentParser):
    """argparse, with its usage errors raised as UserErrors so that `main` prints them as it
    prints every other error (one line, exit 2)."""

    def error(self, message: str):
        # "argument --memory: must be ..." -> "--memory: must be ..."; an error about no one
        # option value (a missing argument, an unknown option) points to the help.
        if message.startswith("argument "):
            raise UserError(message.removeprefix("argument "))
        raise UserError(f"{message} (`{self.prog} --help` lists the options)")

    def _print_message(self, message: str, file=None) -> None:
        # argparse drops an OSError here, so `--help > /dev/full` would exit 0 with nothing
        # written; raised, it reaches `main`, which reports a full disk in one line.
        if message:
            (file or sys.stderr).write(message)


# --- Option values ------------------------------------------------------------------------

_WHOLE = re.compile(r"[+-]?[0-9]+")
_DECIMAL = re.compile(r"[+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][+-]?[0-9]+)?")
"""Numbers as a plan writes them, in ASCII digits (`re`'s [0-9] is ASCII only)."""


def integer(low: int, high: int) -> Callable[[str], int]:
    """An argparse `type`: a whole number from `low` to `high`."""

    def parse(text: str) -> int:
        digits = text.strip()
        # int() also reads 1_0 and other scripts' digits (Arabic-Indic ١٢): a plan does not.
        if not _WHOLE.fullmatch(digits):
            raise argparse.ArgumentTypeError(f"{digits[:40]!r} is not a whole number")
        value = int(digits) if len(digits) <= 40 else high + 1  # int() refuses 4,300 digits
        if value < low:
            raise argparse.ArgumentTypeError(f"must be at least {low}")
        if value > high:
            raise argparse.ArgumentTypeError(f"must be at most {high:,} (octodsl's limit)")
        return value

    # A short range is a fixed set of values (--zero: 0, 1, 2), which the completion offers.
    parse.choices = tuple(map(str, range(low, high + 1))) if high - low < 10 else None  # type: ignore[attr-defined]
    return parse


DEVICES = integer(1, limits.MAX_DEVICES)
MICROBATCHES = integer(1, limits.MAX_MICROBATCHES)
MICROBATCH_SIZE = integer(1, limits.MAX_MICROBATCH_SIZE)
SEQ_LEN = integer(1, limits.MAX_SEQ_LEN)
DP = integer(1, limits.MAX_DP)
ZERO = integer(0, 2)
"""--zero: a ZeRO stage (`Header.zero`)."""
EP = integer(1, limits.MAX_DP)
"""--ep: the expert-parallel degree (`Header.ep`)."""
TP = integer(1, limits.MAX_TP)
"""--tp: the tensor-parallel degree (`Header.tp`)."""
GPUS_PER_NODE = integer(1, limits.MAX_GPUS_PER_NODE)
"""--gpus-per-node (`Header.gpus_per_node`)."""
SEED = integer(0, limits.MAX_SEED)
STEPS = integer(1, limits.MAX_STEPS)
"""Timed repetitions a command runs itself (profile --repeats, calibrate --steps)."""
WARMUP = integer(0, limits.MAX_STEPS)


class _Switch:
    """An argparse `type`: true or false, as a plan's header writes it (`switch`)."""

    __name__ = "switch"  # argparse's messages name it

    @property
    def choices(self) -> tuple[str, ...]:
        """The words it takes, which the completion offers (read when asked: lang is heavy)."""
        from ..lang.lower import BOOLEANS

        return tuple(BOOLEANS)

    def __call__(self, text: str) -> bool:
        from ..lang.lower import BOOLEANS

        try:
            return BOOLEANS[text.strip().lower()]
        except KeyError:
            raise argparse.ArgumentTypeError(
                f"{text.strip()[:40]!r} is not true or false"
            ) from None


switch = _Switch()


class NameOrFile:
    """An argparse `type` of an option that takes a built-in's name or a file's path (a device
    or a link): `resolve` (get_device, get_link) checks it at once. The value is what `resolve`
    gives, or with `as_text` the text itself (what the commands pass on: a cost table records
    it, and it resolves again to the same device). A bad file is not the option's error but
    the file's: its OctoError (`PATH: field: what is wrong`) goes out as it is; an unknown name
    is the option's (`--device: unknown device ...`). `names`: the built-ins, which the shell
    completion offers (octodsl.cli.completion)."""

    def __init__(self, resolve: Callable[[str], object], names: list[str], *, as_text: bool):
        self.resolve = resolve
        self.names = names
        self.as_text = as_text
        self.__name__ = getattr(resolve, "__name__", "value")  # argparse's messages name it

    def __call__(self, text: str):
        try:
            value = self.resolve(text.strip())
        except OctoError as e:
            if e.path is not None:  # a file's own error: it names the file and the field
                raise
            raise argparse.ArgumentTypeError(e.message) from None
        return text.strip() if self.as_text else value


DEVICE = NameOrFile(_devices.get_device, list(_devices.DEVICES), as_text=True)
"""--device: a built-in device or a device file, kept as given."""
LINK = NameOrFile(_devices.get_link, list(_devices.LINKS), as_text=True)
"""--link, --dp-link: a built-in link or a link file, kept as given (`link_named` reads it)."""
link_option = NameOrFile(_devices.get_link, list(_devices.LINKS), as_text=False)
"""--inter-node-link: the same, as the Link."""
DEVICE_HELP = "a built-in device (`octodsl devices` lists them) or a device file"
LINK_HELP = "a built-in link (`octodsl devices`) or a link file"


def add_mesh_options(p: argparse.ArgumentParser, *, default_from: str) -> None:
    """--tp, --sequence-parallel, --gpus-per-node and --inter-node-link: the plan header's tensor
    parallelism and cluster shape, and the link between nodes (`default_from`: where the header
    values come from when not given)."""
    p.add_argument(
        "--tp",
        type=TP,
        metavar="N",
        help=f"tensor-parallel degree: GPUs of each pipeline device (default: {default_from})",
    )
    p.add_argument(
        "--sequence-parallel",
        type=switch,
        metavar="true|false",
        help=f"Megatron's sequence parallelism in the tp group (default: {default_from}; "
        "a header without it: on when tp > 1)",
    )
    p.add_argument(
        "--gpus-per-node",
        type=GPUS_PER_NODE,
        metavar="N",
        help=f"GPUs per node, which sets which ranks share a node (default: {default_from})",
    )
    p.add_argument(
        "--inter-node-link",
        type=link_option,
        metavar="NAME",
        help="link of the pipeline messages and data-parallel collectives that leave "
        f"a node: {LINK_HELP} (default: the device's inter-node link; H800: "
        f"{INTER_NODE_LINK}, InfiniBand NDR, 400 Gb/s per GPU)",
    )
    add_overlap_option(p, default_from)


def add_data_parallel_options(p: argparse.ArgumentParser, *, default_from: str | None) -> None:
    """--dp, --zero and --ep: the plan header's data-parallel copies, ZeRO stage and
    expert-parallel degree (`default_from`: whose fields they default to when not given; None:
    the header's own defaults, 1, 0 and 1)."""

    def default(field: str, value: int) -> str:
        return f"default {value}" if default_from is None else f"default: {default_from} `{field}`"

    p.add_argument(
        "--dp",
        type=DP,
        metavar="N",
        help=f"data-parallel copies of the pipeline ({default('dp', 1)})",
    )
    p.add_argument(
        "--zero",
        type=ZERO,
        metavar="N",
        help="ZeRO stage over the dp copies: 0, 1 (shard the optimizer state), 2 (and "
        f"the gradients); {default('zero', 0)}",
    )
    p.add_argument(
        "--ep",
        type=EP,
        metavar="N",
        help="expert-parallel degree of the MoE layers: their experts spread over N of "
        f"the dp copies (divides dp and the expert count); {default('ep', 1)}",
    )


def add_overlap_option(p: argparse.ArgumentParser, default_from: str) -> None:
    """--target, --overlap, --scatter-gather-messages, --grad-accumulation-fusion,
    --reduce-scatter and --grad-accum-dtype: which runtime runs the plan and what it does
    beside the plan's ops (the header's `runtime` and runtime fields)."""
    p.add_argument(
        "--target",
        choices=RUNTIMES,
        help="the runtime the plan is for, whose bytes per parameter its memory counts (the "
        "header's runtime): deepspeed (octodsl's executor), megatron (Megatron-LM); with "
        "tune --gpus, the runtime of the configurations searched (default deepspeed, ZeRO 0 "
        "and 1; megatron: zero 2 in a pipeline too). Default: the plan's runtime, else the "
        "one its runtime fields imply (megatron when one that only Megatron-LM runs is on)",
    )
    p.add_argument(
        "--overlap",
        type=overlap_list,
        metavar="LIST",
        help=f"what the runtime overlaps with compute, comma-separated: "
        f"{', '.join(OVERLAP_OPTIONS)} (Megatron's --tp-comm-overlap, "
        "--overlap-grad-reduce, --overlap-param-gather, --overlap-p2p-comm), or none; "
        "those not named are off (octodsl's executor runs p2p-comm alone; default: "
        f"{default_from})",
    )
    p.add_argument(
        "--scatter-gather-messages",
        type=switch,
        metavar="true|false",
        help="without sequence parallelism, each tp GPU sends 1/tp of a pipeline "
        "message (Megatron's default, and stock DeepSpeed's with tp > 1); false: the "
        f"whole activation, as octodsl's executor does (default: {default_from})",
    )
    p.add_argument(
        "--grad-accumulation-fusion",
        type=switch,
        metavar="true|false",
        help="the weight-gradient GEMMs add into the gradient buffer themselves "
        "(Megatron's --gradient-accumulation-fusion); false: a pass of its own per "
        f"micro-batch, as octodsl's executor runs it (default: {default_from})",
    )
    p.add_argument(
        "--reduce-scatter",
        type=switch,
        metavar="true|false",
        help="under ZeRO, the gradients are reduce-scattered to their shards "
        "(DeepSpeed's zero_optimization.reduce_scatter, Megatron's distributed "
        "optimizer); false: all-reduced, as DeepSpeed's BF16 optimizer does in its "
        f"pipeline engine (default: {default_from})",
    )
    p.add_argument(
        "--grad-accum-dtype",
        choices=ACCUM_DTYPES,
        help="the dtype the gradients are accumulated in (the header's grad_accum_dtype, "
        "DeepSpeed's data_types.grad_accum_dtype): fp32 for a bf16 model at zero 1 is "
        "DeepSpeed's BF16 optimizer, as BLOOM trained (default: "
        f"{default_from}, else the runtime's: fp32 for bf16 in Megatron-LM, the model's "
        "dtype in DeepSpeed)",
    )


OVERLAP_OPTIONS = {name.removeprefix("overlap_").replace("_", "-"): name for name in OVERLAPS}
"""--overlap's names for the header's overlap fields."""


def overlap_list(text: str) -> dict[str, bool]:
    """--overlap's value: the header's overlap fields, those named on and the others off."""
    names = [t.strip() for t in text.split(",")]
    if names == ["none"]:
        return {field: False for field in OVERLAPS}
    unknown = [n for n in names if n not in OVERLAP_OPTIONS]
    if unknown or not all(names):
        raise argparse.ArgumentTypeError(
            f"{text.strip()[:40]!r}: give {', '.join(OVERLAP_OPTIONS)} (comma-separated) or none"
        )
    return {field: name in names for name, field in OVERLAP_OPTIONS.items()}


overlap_list.choices = (*OVERLAP_OPTIONS, "none")  # type: ignore[attr-defined]
"""The words --overlap takes (one, or several comma-separated), which the completion offers."""


def runtime_update(args) -> dict[str, bool | str]:
    """The header's runtime fields that --target, --overlap, --grad-accumulation-fusion,
    --scatter-gather-messages, --reduce-scatter and --grad-accum-dtype set (those given;
    `add_overlap_option`)."""
    update: dict[str, bool | str] = dict(getattr(args, "overlap", None) or {})
    if getattr(args, "target", None) is not None:
        update["runtime"] = args.target
    if getattr(args, "grad_accum_dtype", None) is not None:
        update["grad_accum_dtype"] = args.grad_accum_dtype
    for name in RUNTIME_SWITCHES:
        if getattr(args, name, None) is not None:
            update[name] = getattr(args, name)
    return update


def mesh_update(args, tp: int, sequence_parallel: bool | None) -> dict:
    """The header fields --tp, --sequence-parallel, --gpus-per-node and --overlap set (those
    given), for a header of `tp` and `sequence_parallel` otherwise; a UserError for sequence
    parallelism at tp 1 (it splits the sequence over the tp group: there is none)."""
    names = ("tp", "sequence_parallel", "gpus_per_node")  # a command may take only some
    update = {k: v for k in names if (v := getattr(args, k, None)) is not None}
    update.update(runtime_update(args))
    if update.get("tp", tp) == 1 and update.get("sequence_parallel", sequence_parallel):
        raise UserError(
            "sequence parallelism splits the sequence over the tp group: give --tp 2 "
            "or more, or --sequence-parallel false"
        )
    return update


def refuse_runtime_conflict(where: str, h) -> None:
    """Lint's E407 as a UserError, for a header the command's options made."""
    from ..plan import runtime_conflict

    message = runtime_conflict(h)
    if message:
        raise UserError(
            f"{where}: {message}; give --target megatron, or leave out what it does not run"
        )


def warn_zero_without_copies(where: str, zero: int, dp: int) -> None:
    """Lint's W404 on standard error, for a command that takes --zero and --dp."""
    from ..lang.errors import Diagnostic
    from ..plan import zero_without_copies

    message = zero_without_copies(zero, dp)
    if message:
        print(
            Diagnostic("W404", f"{message} (give --dp 2 or more, or --zero 0)").render(where, None),
            file=sys.stderr,
        )


def seconds_value(
    text: str, *, zero: bool = False, unit: float = 1.0, shown: str | None = None
) -> float:
    """`text` x `unit` seconds, finite and at most MAX_SECONDS; 0 only if `zero`.
    ArgumentTypeError otherwise (also for nan and inf, which float() reads), quoting `shown`
    (default: `text`)."""
    shown = (text if shown is None else shown).strip()
    try:
        value = float(text) * unit
    except ValueError:
        raise argparse.ArgumentTypeError(f"{shown[:40]!r} is not a number of seconds") from None
    if math.isfinite(value) and not _DECIMAL.fullmatch(text.strip()):  # float() reads 1_0, ١٢
        raise argparse.ArgumentTypeError(f"{shown[:40]!r} is not a number of seconds (digits 0-9)")
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"{shown!r} is not a finite number of seconds")
    if value < 0 or (value == 0 and not zero):
        raise argparse.ArgumentTypeError(
            f"must be {'at least 0' if zero else 'more than 0'} seconds"
        )
    if value > limits.MAX_SECONDS:
        raise argparse.ArgumentTypeError(
            f"must be at most {limits.MAX_SECONDS:g} seconds (octodsl's limit)"
        )
    return value


def op_costs(text: str) -> dict[str, float]:
    """An argparse `type` (--costs): seconds per op kind of one stage, F=1,B=1,W=1, and
    optionally per message, comm=0; each finite and at least 0."""
    values = {"comm": 0.0}
    for part in text.split(","):
        key, sep, value = part.partition("=")
        key = key.strip()
        key = key if key == "comm" else key.upper()
        if not sep or key not in ("F", "B", "W", "comm"):
            raise argparse.ArgumentTypeError(
                f"cannot read {part.strip()!r}; write F=1,B=1,W=1 and optionally comm=0 (seconds)"
            )
        try:
            values[key] = seconds_value(value, zero=True)
        except argparse.ArgumentTypeError as e:
            raise argparse.ArgumentTypeError(f"{key}: {e}") from None
    missing = [k for k in ("F", "B", "W") if k not in values]
    if missing:
        raise argparse.ArgumentTypeError(f"give {', '.join(missing)} too (e.g. F=1,B=1,W=1)")
    return {k: values[k] for k in ("F", "B", "W", "comm")}


_TIME_UNITS = {"s": 1, "m": 60, "h": 3600}


def duration(text: str) -> float:
    """An argparse `type`: '60s', '2m', '1h' or plain seconds ('90'), more than 0."""
    t = text.strip().lower()
    unit = _TIME_UNITS.get(t[-1:])
    try:
        return seconds_value(t[:-1] if unit else t, unit=unit or 1, shown=text)
    except argparse.ArgumentTypeError as e:
        raise argparse.ArgumentTypeError(f"{e} (e.g. 60s, 2m)") from None


def memory_size(text: str) -> int:
    """An argparse `type`: a byte size such as 80GiB, from 1 byte to MAX_MEMORY."""
    try:
        value = parse_size(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"cannot read {text.strip()!r} as a size (e.g. 80GiB, 512MB)"
        ) from None
    if value < 1:
        raise argparse.ArgumentTypeError("must be at least 1 byte (e.g. 80GiB)")
    if value > limits.MAX_MEMORY:
        raise argparse.ArgumentTypeError(
            f"must be at most {exact_size(limits.MAX_MEMORY)} (octodsl's limit)"
        )
    return value


# --- Files --------------------------------------------------------------------------------


def read_text(path: str) -> str:
    """A file's text ('-' for standard input), or a UserError saying why it cannot be read."""
    return inputs.read_text(path, "file", error=UserError)


def check_output(path: str, suffixes: tuple[str, ...], option: str) -> str:
    """`path` if a file of one of `suffixes` can be written there, else a UserError naming
    `option`: called before a command does its work, so that the work is not lost to a typo."""
    why = _unwritable(path, suffixes)
    if why:
        raise UserError(f"{option}: {why}")
    return path


def output(*suffixes: str) -> Callable[[str], str]:
    """An argparse `type`: an output file that check_output accepts."""

    def parse(path: str) -> str:
        why = _unwritable(path, suffixes)
        if why:
            raise argparse.ArgumentTypeError(why)
        return path

    return parse


def _unwritable(path: str, suffixes: tuple[str, ...]) -> str | None:
    why = unwritable(path)
    if why is None and Path(path).suffix.lower() not in suffixes:
        # Written exactly where asked, never under another name: the name must say what it is.
        why = f"{path} must end in {' or '.join(suffixes)} (the file written is that kind)"
    return why


def check_outputs(args, *dests: str, more: Iterable[tuple[str, str]] = ()) -> None:
    """Before a command does its work: a UserError when a file it will write (the options of
    `dests`, and `more`: (option, path) pairs, e.g. default names) is, or links to (a symbolic
    or a hard link), a file one of its other arguments names: writing it would destroy that
    input, and the command would have nothing left to read from."""
    inputs = [
        v
        for k, value in vars(args).items()
        if k not in dests
        for v in (value if isinstance(value, list) else [value])
        if isinstance(v, str)
    ]
    outputs = [(_option_name(d), getattr(args, d)) for d in dests if getattr(args, d, None)]
    for option, path in [*outputs, *more]:
        for name in inputs:
            if _same_file(path, _input_file(name)):
                same = (
                    "is"
                    if os.path.abspath(path) == os.path.abspath(_input_file(name))
                    else "links to"
                )
                raise UserError(
                    f"{option}: {path} {same} the input {name}: writing it would "
                    "destroy it (give another file name)"
                )


def _option_name(dest: str) -> str:
    return "-o/--output" if dest == "output" else "--" + dest.replace("_", "-")


def _input_file(name: str) -> str:
    """The file an argument names: `hf:PATH` is PATH's config.json."""
    if name.startswith("hf:"):
        name = name.removeprefix("hf:")
        return os.path.join(name, "config.json") if os.path.isdir(name) else name
    return name


def _same_file(a: str, b: str) -> bool:
    try:
        return bool(b) and os.path.samefile(a, b)
    except (OSError, ValueError):  # either is missing (nothing to destroy), or no path
        return False


def numbered_outputs(path: str, count: int) -> list[str]:
    """Where `tune --top K` writes its K plans: PATH, then PATH-2.octo, PATH-3.octo, ..."""
    out = Path(path)
    return [path] + [str(out.with_name(f"{out.stem}-{i}{out.suffix}")) for i in range(2, count + 1)]


def check_top_outputs(args) -> None:
    """`tune`'s outputs, before the search: each of the --top plans' files writable (their
    names are numbered after -o's) and none an input (check_outputs)."""
    more = [
        ("--top", check_output(p, (".octo",), "--top"))
        for p in numbered_outputs(args.output, args.top or 1)[1:]
    ]
    check_outputs(args, "output", more=more)


@contextlib.contextmanager
def writing(path: str | os.PathLike) -> Iterator[None]:
    """Turn an OSError of writing `path` inside the block into a UserError."""
    try:
        yield
    except OSError as e:
        raise UserError(f"{path}: cannot write: {e.strerror or e}") from None


def write_output(path: str | os.PathLike, data: str | bytes) -> None:
    """Write a command's result to `path` atomically (a failure leaves any old file whole), or
    a UserError saying why it cannot be written."""
    with writing(path):
        write_atomic(path, data)


def print_json(obj: dict | list) -> None:
    """A command's --json result on standard output, each object of it (the object, or each of
    a list's) opening with "octodsl_version": what made it. Strict JSON: a value that cannot be
    a JSON number (nan, inf) is a bug here, each producer turns those into null where it means
    "undefined" (and its docstring says when)."""
    import json

    from ..version import FIELD, version

    def stamped(o):
        return {FIELD: version(), **o} if isinstance(o, dict) else o

    obj = [stamped(o) for o in obj] if isinstance(obj, list) else stamped(obj)
    json.dump(obj, sys.stdout, indent=1, allow_nan=False)
    sys.stdout.write("\n")


def stdout_console():
    """A rich Console for command output; piped output gets a wide page instead of rich's
    80-column default, so tables stay one line per row."""
    from rich.console import Console

    return Console(highlight=False, width=None if sys.stdout.isatty() else 160)


def progress_bar(console, description: str, transient: bool):
    """The bar of a long measuring run (profile, calibrate): `description` (a rich format of the
    task), the bar, done of total and the time so far."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    return Progress(
        TextColumn(description),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=console,
        transient=transient,
    )


def link_named(name):
    """A built-in link by name or a link file by path (--link, --dp-link), or a Link as it is
    (a device file's own); a UserError for an unknown name, a bad file's own error (naming
    it) for a file."""
    try:
        return _devices.get_link(name)
    except OctoError as e:
        if e.path is not None:
            raise
        raise UserError(str(e)) from None


def pipeline_link(name: str | None, table, default):
    """The link between pipeline devices: --link NAME, else the fitted link of a calibrated
    profile's table, else `default` (a built-in's name or a Link: the device's node link)."""
    if not name and table.calibration is not None and table.calibration.link is not None:
        return table.calibration.link
    return link_named(name or default)
