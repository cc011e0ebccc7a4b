"""`octodsl tune --model SPEC --gpus N --global-batch B -o PLAN [--top K] [--seq-len N]
[--device H800] [--gpus-per-node 8] [--memory 80GiB] [--budget 60s] [--evaluations N]
[--json]`: the fastest configuration and plan for a GPU count and a global batch (octodsl.tune.cluster). `--tp`,
`--devices` (pp), `--microbatch-size`, `--zero`, `--ep` and `--recompute` fix those choices instead of
searching them; `--sequence-parallel false` keeps sequence parallelism off; `--target` chooses
the runtime the configurations are for (octodsl.tune.target), `--overlap` and the other runtime
options what it runs (every configuration's plans take them). Writes the best plan to PLAN and, with `--top K`, the next ones to PLAN-2.octo
and on."""

from __future__ import annotations

from .. import limits
from ..errors import OctoError
from ..plan import Header, plan_runtime
from .common import (
    UserError,
    integer,
    link_named,
    numbered_outputs,
    print_json,
    refuse_runtime_conflict,
    runtime_update,
    stdout_console,
    write_output,
)
from .tune_options import ProgressLine, memory_limit, searches

TOP = integer(1, 100)
GPUS = integer(1, limits.MAX_GPUS)
GLOBAL_BATCH = integer(1, limits.MAX_GLOBAL_BATCH)

_PER_PLAN_ONLY = (
    ("microbatches", "--microbatches (the global batch and the micro-batch size set it)"),
    ("dp", "--dp (the GPU count sets it)"),
    ("start", "--from"),
    ("keep", "--keep"),
    ("compare", "--compare"),
    ("explain", "--explain"),
    ("jobs", "--jobs (it tunes one configuration at a time)"),
    ("grad_accum_dtype", "--grad-accum-dtype (each configuration takes its runtime's own)"),
)


def add_cluster_options(p) -> None:
    p.add_argument(
        "--gpus",
        type=GPUS,
        metavar="N",
        help="search the whole configuration for "
        "this many GPUs: tp x pp x dp, micro-batching, ZeRO, ep (with --global-batch; "
        "--tp, --devices, --microbatch-size, --zero and --ep fix those choices; "
        "docs/cluster.md)",
    )
    p.add_argument(
        "--global-batch",
        type=GLOBAL_BATCH,
        metavar="B",
        help="sequences per iteration over all data-parallel copies (with --gpus)",
    )
    p.add_argument(
        "--top",
        type=TOP,
        metavar="K",
        help="with --gpus: also write the next K-1 configurations' plans, to PLAN-2.octo and on",
    )


def _runtime(args) -> tuple[dict[str, bool], str]:
    """The runtime fields --overlap and the like set for every configuration (those given), and
    the target: --target's, else the one they imply (`plan_runtime`: Megatron-LM's when one
    only it runs is on, else DeepSpeed's). A UserError for --target deepspeed with one of those
    (lint's E407)."""
    fields = {k: bool(v) for k, v in runtime_update(args).items() if k != "runtime"}
    header = Header(name="tune --gpus", devices=1, microbatches=1, runtime=args.target)
    header = header.model_copy(update=fields)
    refuse_runtime_conflict("tune --gpus", header)
    return fields, plan_runtime(header)


def run_cluster(args, began: float) -> int:
    """`began`: when the command began (octodsl.tune.clock.command_start)."""
    from ..tune.clock import left
    from ..tune.cluster.report import (
        baselines_table,
        cluster_table,
        skipped_counts,
        to_json,
    )
    from ..tune.cluster.search import NoConfigurationFits, search
    from ..tune.cluster.space import Cluster
    from ..tune.cluster.target import refusal
    from ..tune.warm import compiled_note

    if args.gpus is None or args.global_batch is None:
        raise UserError("the whole-cluster search needs both --gpus and --global-batch")
    if args.model is None:
        raise UserError("--model is required with --gpus")
    for name, what in _PER_PLAN_ONLY:
        if getattr(args, name) not in (None, False, ""):
            raise UserError(f"--gpus searches the whole configuration: {what} is not taken")
    fields, target = _runtime(args)
    why = refusal(target, args.zero) if args.zero is not None else None
    if why is not None:
        raise UserError(why)
    if args.tp == 1 and args.sequence_parallel:
        raise UserError(
            "sequence parallelism splits the sequence over the tp group: give --tp 2 "
            "or more, or --sequence-parallel false"
        )
    if fields.get("overlap_tp_comm") and args.sequence_parallel is False:
        raise UserError(  # lint's E704 on every plan at tp > 1
            "--overlap tp-comm without sequence parallelism: Megatron overlaps the "
            "collectives of sequence-parallel layers only; drop --sequence-parallel false "
            "or tp-comm"
        )
    try:
        cluster = Cluster(
            args.model,
            args.gpus,
            args.global_batch,
            seq_len=args.seq_len,
            device=args.device,
            gpus_per_node=args.gpus_per_node or 8,
            memory=memory_limit(args),
            link=link_named(args.link) if args.link else None,
            inter_link=args.inter_node_link,
            recompute=args.recompute,
            tp=args.tp,
            pp=args.devices,
            microbatch_size=args.microbatch_size,
            zero=args.zero,
            ep=args.ep,
            sequence_parallel=args.sequence_parallel,
            target=target,
            runtime_fields=tuple(fields.items()),
        )
        cluster.tokens()  # the model loads
    except OctoError as e:
        raise UserError(str(e)) from None
    top = args.top or 1
    with ProgressLine(args.budget, enabled=not args.json) as progress:
        try:
            result = search(
                cluster,
                budget=left(args.budget, began),
                seed=args.seed,
                top=top,
                progress=progress,
                max_evaluations=args.evaluations,
                searches=searches(args),
            )
        except NoConfigurationFits as e:
            raise UserError(str(e), exit_code=1) from None
        except OctoError as e:
            raise UserError(str(e)) from None
    written = _write(result, top, args)
    status = 130 if result.interrupted else 0
    if args.json:
        print_json(to_json(result, written))
        return status
    console = stdout_console()
    console.print(cluster_table(result))
    console.print()
    console.print(baselines_table(result))
    counts = skipped_counts(result)
    compiled = compiled_note(result.compiled)
    console.print(
        f"wrote {', '.join(written)}; configurations: "
        + ", ".join(f"{n} {k}" for k, n in counts.items())
        + f"; {result.seconds:.1f} s"
        + (" (interrupted: the best so far)" if result.interrupted else "")
        + (
            " (the budget ran out before any configuration was tuned: the best is a "
            "classic plan; give a longer --budget)"
            if result.budget_short
            else ""
        )
        + (f"; {compiled}" if compiled else ""),
        style="dim",
    )
    return status


def _write(result, top: int, args) -> list[str]:
    """The best `top` configurations' plans, linted: PLAN, then PLAN-2.octo, ..."""
    from ..gen import render_plan
    from ..lint import lint_source
    from ..tune.cluster.search import plan_of
    from ..units import milliseconds
    from ..version import made_by

    paths = []
    for i, (path, cand) in enumerate(
        zip(numbered_outputs(args.output, top), result.ranked()[:top], strict=False)
    ):
        plan = plan_of(cand)
        best = cand.best
        title = (
            f"Tuned by {made_by('tune')} with seed {args.seed}: {result.cluster.model} on "
            f"{result.cluster.gpus} GPUs, global batch {result.cluster.global_batch}; "
            f"rank {i + 1} of the configurations searched: {cand.config}.\n"
            f"Simulated iteration {milliseconds(best.time)}, "
            f"{result.tokens_per_gpu(best.time):,.0f} tokens per GPU per second."
        )
        text = render_plan(plan, title=title)
        _, diags = lint_source(text, path)
        errors = [d for d in diags if d.is_error]
        if errors:  # the search only proposes valid plans: a bug, not a user error
            raise RuntimeError(
                f"the plan of {cand.config} does not lint clean: {errors[0].message}"
            )
        write_output(path, text)
        paths.append(path)
    return paths
