"""`octodsl gen NAME --devices P --microbatches M [--chunks V] [--model SPEC [--partition HOW]
[--device GPU] [--profile FILE] [--microbatch-size N] [--seq-len N]] [--costs F=..,B=..,W=..]
[--tp N] [--sequence-parallel true|false] [--gpus-per-node N] [--dp N] [--zero N] [--ep N]
[--overlap LIST] [-o FILE]`: write a classic schedule as a .octo plan (the last seven go into its
header as the plan language writes them)."""

from __future__ import annotations

import sys

from .. import limits
from ..gen import PARTITIONS, SCHEDULES, generate_text
from .common import (
    DEVICE,
    DEVICE_HELP,
    DEVICES,
    GPUS_PER_NODE,
    MICROBATCH_SIZE,
    MICROBATCHES,
    SEQ_LEN,
    TP,
    UserError,
    add_data_parallel_options,
    add_overlap_option,
    check_outputs,
    integer,
    op_costs,
    output,
    runtime_update,
    switch,
    write_output,
)


def register(sub) -> None:
    p = sub.add_parser(
        "gen",
        help="write a classic pipeline schedule (GPipe, 1F1B, ZeroBubble, ...) as a .octo plan",
    )
    p.add_argument(
        "name", choices=SCHEDULES, metavar="NAME", help="one of: " + ", ".join(SCHEDULES)
    )
    p.add_argument(
        "--devices", "-p", type=DEVICES, required=True, metavar="P", help="pipeline devices"
    )
    p.add_argument(
        "--microbatches",
        "-m",
        type=MICROBATCHES,
        required=True,
        metavar="M",
        help="micro-batches per iteration",
    )
    p.add_argument(
        "--chunks",
        "-v",
        type=integer(1, limits.MAX_STAGES),
        metavar="V",
        help="stages per device for interleaved (default 2); zb-v and dualpipev use 2",
    )
    p.add_argument(
        "--costs",
        type=op_costs,
        metavar="F=..,B=..,W=..",
        help="the op times of one stage (a chunk on a V) that zb-v with fewer than "
        "2P-1 micro-batches places its weight gradients for (default equal; only "
        "their ratio matters; the other schedules do not depend on times)",
    )
    p.add_argument(
        "--model",
        metavar="SPEC",
        help="name this model (built-in name or spec file) and cut its layers into the stages",
    )
    p.add_argument(
        "--partition",
        choices=PARTITIONS,
        default="time",
        help="with --model: balance F+B+W time (default), parameter counts "
        "(DeepSpeed's 'parameters'), layer counts, or Megatron-LM's split (equal "
        "transformer layers, the embedding first, the LM head last; megatron-ends: "
        "those two each counted as a layer)",
    )
    p.add_argument(
        "--device",
        type=DEVICE,
        default="H800",
        metavar="DEVICE",
        help=f"device of the analytical costs: {DEVICE_HELP} (default H800)",
    )
    p.add_argument(
        "--profile",
        metavar="FILE",
        help="measured per-layer costs (octodsl profile) instead of the analytical ones",
    )
    p.add_argument(
        "--microbatch-size", type=MICROBATCH_SIZE, metavar="N", help="sequences per micro-batch"
    )
    p.add_argument("--seq-len", type=SEQ_LEN, metavar="N", help="tokens per sequence")
    p.add_argument(
        "--tp",
        type=TP,
        metavar="N",
        help="tensor-parallel degree: each pipeline device is a group of N GPUs (default 1)",
    )
    p.add_argument(
        "--sequence-parallel",
        type=switch,
        metavar="true|false",
        help="Megatron's sequence parallelism in the tp group (default: true when --tp is above 1)",
    )
    p.add_argument(
        "--gpus-per-node",
        type=GPUS_PER_NODE,
        metavar="N",
        help="GPUs per node, which ranks share NVLink (default 8)",
    )
    add_data_parallel_options(p, default_from=None)
    add_overlap_option(p, "none")
    p.add_argument(
        "-o",
        "--output",
        type=output(".octo"),
        metavar="FILE",
        help="write here, a .octo file (default: standard output)",
    )
    p.set_defaults(func=run)


def run(args) -> int:
    check_outputs(args, "output")
    # Every schedule has at least `chunks` stages per device and two ops per stage and
    # micro-batch: refuse a plan past the limit before spending minutes building it.
    ops = args.devices * (args.chunks or 1) * args.microbatches * 2
    if ops > limits.MAX_OPS:
        raise UserError(
            f"{args.devices} devices x {args.microbatches} micro-batches"
            + (f" x {args.chunks} chunks" if args.chunks else "")
            + f" make at least {ops:,} ops, more than octodsl's limit of "
            f"{limits.MAX_OPS:,} per plan"
        )
    times = None if args.costs is None else (args.costs["F"], args.costs["B"], args.costs["W"])
    if times is not None and min(times) <= 0:
        raise UserError("--costs: F, B and W must each be more than 0 (their ratio is what counts)")
    if args.sequence_parallel and (args.tp or 1) == 1:
        raise UserError(
            "--sequence-parallel true splits the sequence over the tp group: give --tp 2 or more"
        )
    mesh = {
        "tp": args.tp,
        "gpus_per_node": args.gpus_per_node,
        "dp": args.dp,
        "zero": args.zero,
        "ep": args.ep,
        "sequence_parallel": args.sequence_parallel,
        **runtime_update(args),
    }
    text = generate_text(
        args.name,
        args.devices,
        args.microbatches,
        args.chunks,
        args.model,
        args.partition,
        times,
        device=args.device,
        profile=args.profile,
        microbatch_size=args.microbatch_size,
        seq_len=args.seq_len,
        mesh={k: v for k, v in mesh.items() if v is not None},
    )
    _check_lints_clean(text)
    if args.output:
        write_output(args.output, text)
    else:
        sys.stdout.write(text)
    return 0


def _check_lints_clean(text: str) -> None:
    """A UserError with lint's first error (its code, message and hint) when the plan these
    options make would not lint clean (a seq_len that tp does not divide): gen writes no plan
    that `octodsl lint` refuses."""
    from ..lint import lint_source

    _, diags = lint_source(text, "<gen>")
    errors = [d for d in diags if d.is_error]
    if errors:
        e = errors[0]
        more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
        hint = f"; hint: {e.hint}" if e.hint else ""
        raise UserError(
            f"the plan these options make does not lint: error[{e.code}]: {e.message}{hint}{more}"
        )
