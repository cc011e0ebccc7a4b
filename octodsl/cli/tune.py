"""`octodsl tune --model SPEC --devices P --microbatches M -o PLAN [--device H800] [--memory SIZE]
[--dp N] [--zero 0|1|2] [--ep N] [--tp N] [--sequence-parallel true|false] [--gpus-per-node N]
[--link NAME] [--inter-node-link NAME] [--recompute auto|none|full|selective] [--budget 60s]
[--evaluations N] [--searches N] [--jobs N] [--seed N] [--from PLAN [--keep partition|partition,placement]]
[--compare random,milp,milp-warm] [--explain] [--json]`: search partition, placement, schedule
and recompute together for the fastest plan that fits in memory, and show it next to the
classic schedules (with the same levers) on the same simulator.

`--dp`, `--zero`, `--ep`, `--tp`, `--sequence-parallel` and `--gpus-per-node` go into the header
of every plan the tuner proposes and writes (ZeRO shards the optimizer state, and with 2 the
gradients, over the dp copies; ep spreads the MoE layers' experts over ep of them; at tp N every layer is one GPU's share of a tp group, costed with
its collectives). `--recompute auto` lets the tuner pick each stage's mode; a mode makes every
stage recompute that way (`none`: never). `--keep` keeps the `--from` plan's cuts (and
placement) exactly.

`octodsl tune --model SPEC --gpus N --global-batch B -o PLAN [--top K]` searches the whole
configuration instead (tp x pp x dp, micro-batching, ZeRO, ep; `octodsl.cli.tune_cluster`)."""

from __future__ import annotations

import argparse
import os
from dataclasses import replace

from ..errors import OctoError
from ..extras import require
from .common import (
    DEVICE,
    DEVICE_HELP,
    DEVICES,
    DP,
    EP,
    LINK,
    LINK_HELP,
    MICROBATCH_SIZE,
    MICROBATCHES,
    SEED,
    SEQ_LEN,
    ZERO,
    UserError,
    add_mesh_options,
    check_top_outputs,
    duration,
    link_named,
    mesh_update,
    output,
    print_json,
    refuse_runtime_conflict,
    stdout_console,
    write_output,
)
from .tune_cluster import add_cluster_options, run_cluster
from .tune_options import (
    EVALUATIONS,
    JOBS,
    SEARCHES,
    ProgressLine,
    jobs,
    memory_limit,
    memory_option,
    searches,
)


def register(sub) -> None:
    p = sub.add_parser(
        "tune",
        help="tune partition, placement and schedule together; compare with the classic schedules",
    )
    p.add_argument(
        "--model",
        metavar="SPEC",
        help="model (built-in name or spec file); default: the --from plan's",
    )
    p.add_argument(
        "--devices",
        "-p",
        type=DEVICES,
        metavar="P",
        help="pipeline devices (2 up to the model's layer count)",
    )
    p.add_argument(
        "--microbatches", "-m", type=MICROBATCHES, metavar="M", help="micro-batches per iteration"
    )
    p.add_argument(
        "--device",
        type=DEVICE,
        default="H800",
        metavar="DEVICE",
        help=f"device of the analytical costs: {DEVICE_HELP} (default H800)",
    )
    p.add_argument(
        "--link",
        type=LINK,
        metavar="NAME",
        help="link between devices in one node, "
        f"and of the tp collectives: {LINK_HELP} (default: the device's node link, "
        "H800: nvlink)",
    )
    p.add_argument(
        "--memory",
        type=memory_option,
        metavar="SIZE",
        help="memory limit per device, e.g. 80GiB, or 'none' (default: the device's memory)",
    )
    p.add_argument(
        "--microbatch-size", type=MICROBATCH_SIZE, metavar="N", help="sequences per micro-batch"
    )
    p.add_argument("--seq-len", type=SEQ_LEN, metavar="N", help="tokens per sequence")
    p.add_argument(
        "--dp",
        type=DP,
        metavar="N",
        help="data-parallel copies of the pipeline, "
        "written in every plan's header (default: the --from plan's, else 1)",
    )
    p.add_argument(
        "--zero",
        type=ZERO,
        metavar="0|1|2",
        help="ZeRO stage over the dp copies: "
        "1 shards the optimizer state, 2 the gradients too; in every plan's header "
        "(default: the --from plan's, else 0)",
    )
    p.add_argument(
        "--ep",
        type=EP,
        metavar="N",
        help="expert-parallel degree of the MoE layers: their experts spread over N of the dp "
        "copies (divides dp and the expert count); in every plan's header (default: the --from "
        "plan's, else 1); with --gpus it fixes ep instead of searching it",
    )
    add_mesh_options(p, default_from="the --from plan's, else tp 1 and 8 GPUs per node")
    p.add_argument(
        "--recompute",
        type=RECOMPUTE,
        default=AUTO_MODE,
        metavar="auto|none|full|selective",
        help="activation recomputation: auto (default) lets the tuner pick none, "
        "selective or full per stage; none never recomputes; full or selective "
        "makes every stage (and every baseline) recompute that way",
    )
    p.add_argument(
        "--budget",
        type=duration,
        default="60s",
        metavar="TIME",
        help="wall time of the whole command, start-up and the check of the written "
        "plan included, e.g. 60s, 2m (default 60s; each --compare search gets as "
        "much again)",
    )
    p.add_argument(
        "--evaluations",
        type=EVALUATIONS,
        metavar="N",
        help="stop the tuner after "
        "it has simulated N plans (with --gpus: N of each configuration it tunes), "
        "or when --budget runs out, whichever comes first: with a --budget that N "
        "plans fit in, the result depends on the seed alone, not on the machine's "
        "speed (default: the budget alone)",
    )
    p.add_argument(
        "--searches",
        type=SEARCHES,
        metavar="N",
        help="run up to N searches, seeds SEED, SEED + 1, ..., one after another while "
        "--budget lasts, and keep the best plan (with --gpus: of each configuration it "
        "tunes). Each search ends in a local optimum of its own, so more searches (and "
        "the budget for them) can find a better plan; the result depends on the seed "
        "alone as long as they all end before the budget (default 6)",
    )
    p.add_argument(
        "--jobs",
        type=JOBS,
        metavar="N",
        help="run N of the searches at once, each in a process of its own (one per CPU core "
        "is the most that helps): the plan is the same as one after another wherever all "
        "the searches end before --budget, and where the budget stops them more of them "
        "have run (each process loads the compiled search in about 2 s of the budget; not "
        "with --evaluations or --gpus; default 1)",
    )
    p.add_argument("--seed", type=SEED, default=0, help="seed of the search (default 0)")
    p.add_argument(
        "--from",
        dest="start",
        metavar="PLAN",
        help="refine this plan (its partition must name the model's layers)",
    )
    p.add_argument(
        "--keep",
        type=_keep,
        metavar="partition|partition,placement",
        help="with --from: keep the plan's cuts exactly and search placement, order "
        "and recompute (partition), or keep its placement too and search only the "
        "order and recompute (partition,placement)",
    )
    p.add_argument(
        "--compare",
        default="",
        metavar="LIST",
        help="also run, with the same budget: random, milp, milp-warm (comma-separated)",
    )
    p.add_argument(
        "-o",
        "--output",
        type=output(".octo"),
        required=True,
        metavar="FILE",
        help="write the tuned plan here (a .octo file)",
    )
    p.add_argument(
        "--explain",
        action="store_true",
        help="print each round: phase, move, iteration time before and after",
    )
    add_cluster_options(p)
    p.add_argument("--json", action="store_true", help="print the figures as JSON")
    p.set_defaults(func=run)


def _more_jobs(args) -> str:
    """Where the budget stopped the searches one after another on a machine of several cores:
    that --jobs would run more of them."""
    n = min(os.cpu_count() or 1, searches(args))
    if jobs(args) > 1 or n == 1:
        return ""
    return f"; --jobs {n} would run that many searches at once"


def run(args) -> int:
    require("tune", "numba", "ortools")  # before octodsl.tune, which imports them
    from ..tune.clock import command_start

    began = command_start()  # --budget bounds the whole command, its start-up too (/proc)
    check_top_outputs(args)
    if args.gpus is not None or args.global_batch is not None:
        return run_cluster(args, began)
    if args.top is not None:
        raise UserError(
            "--top writes the best configurations of a whole-cluster search: give "
            "--gpus and --global-batch"
        )
    from ..lint import lint_source
    from ..tune.clock import check_reserve, left
    from ..tune.cluster.space import plan_ops
    from ..tune.reference.compare import OTHERS, NoPlanFits, tune_and_compare
    from ..tune.reference.report import comparison_table, explain, searches_spread, to_json
    from ..tune.warm import compiled_note

    start, model, devices, microbatches = _start(args)
    if args.keep is not None and start is None:
        raise UserError("--keep needs a --from plan (the cuts it keeps)")
    if jobs(args) > 1 and args.evaluations is not None:
        raise UserError(
            "--evaluations stops at a count of one process's plans: give it with --jobs 1"
        )
    others = [x for x in args.compare.split(",") if x]
    unknown = [x for x in others if x not in OTHERS]
    if unknown:
        raise UserError(
            f"--compare: unknown {', '.join(unknown)} (choose from {', '.join(OTHERS)})"
        )
    problem = _problem(args, model, devices, microbatches, start)
    if start is not None:
        from ..plan import PlanError
        from ..tune.pipeline.evaluate import check_plan

        try:
            check_plan(start, problem)
        except PlanError as e:
            raise UserError(f"{args.start}: {e}") from None
        # The plan runs with the levers asked for: its header's ZeRO and dp become the
        # problem's, a fixed recompute mode its stages'.
        start = problem.adopt(
            replace(start, header=problem.header.model_copy(update={"name": start.header.name}))
        )
        if args.keep is not None:
            from ..tune.problem import Keep

            problem.keep = Keep.of(start, placement=args.keep == KEEP_PLACEMENT)
    with ProgressLine(args.budget, enabled=not args.json) as progress:
        try:
            outcome = tune_and_compare(
                problem,
                budget=left(args.budget, began, check_reserve(plan_ops(devices, microbatches))),
                seed=args.seed,
                start=start,
                others=others,
                progress=progress,
                max_evaluations=args.evaluations,
                searches=searches(args),
                jobs=jobs(args),
            )
        except NoPlanFits as e:
            raise UserError(str(e), exit_code=1) from None
    best = outcome.tuned.best
    plan = replace(best.plan, header=problem.header.model_copy())
    text = _render(plan, problem, best, args)
    _, diags = lint_source(text, args.output)
    errors = [d for d in diags if d.is_error]
    if errors:  # the tuner only proposes valid plans: this is a bug, not a user error
        raise RuntimeError(f"the tuned plan does not lint clean: {errors[0].message}")
    write_output(args.output, text)

    # Ctrl-C stopped the search: the plan is written, the exit status still says interrupted.
    status = 130 if outcome.tuned.interrupted else 0
    if args.json:
        print_json(
            to_json(
                problem,
                outcome.tuned,
                outcome.baselines,
                args.output,
                outcome.others,
                outcome.compiled,
            )
        )
        return status
    console = stdout_console()
    if args.explain:
        console.print("rounds (phase, iteration before -> after, move):", style="bold")
        for line in explain(outcome.tuned.rounds):
            console.print(line)
        console.print()
    console.print(comparison_table(problem, outcome.tuned, outcome.baselines, outcome.others))
    t = outcome.tuned
    notes = "; ".join(
        x
        for x in [*(f"{k}: {v}" for k, v in outcome.notes.items()), compiled_note(outcome.compiled)]
        if x
    )
    stopped = (
        ""
        if t.finished
        else " (interrupted: the best plan found so far)"
        if t.interrupted
        else f" (stopped after {args.evaluations} plans)"
        if args.evaluations is not None and t.evaluations >= args.evaluations
        else " (stopped by the budget" + _more_jobs(args) + ")"
    )
    built = sum(b.score is not None for b in outcome.baselines)
    console.print(
        f"wrote {args.output}; {built} baselines and {t.evaluations} plans simulated in "
        f"{outcome.seconds:.1f} s" + stopped + (f"; {notes}" if notes else ""),
        style="dim",
    )
    spread = searches_spread(t)
    if spread:
        console.print(spread, style="dim")
    return status


def _start(args):
    """The --from plan (or None), and the model, devices and micro-batches to tune for."""
    start = None
    model, devices, microbatches = args.model, args.devices, args.microbatches
    if args.start:
        from ..lint.memory import CODE as MEMORY_CODE
        from .plans import checked_plan

        # Over the memory limit is what the tuner can fix; anything else must be fixed first.
        start = checked_plan(args.start, allow=(MEMORY_CODE,))[0]
        model = model or start.header.model
        for what, given, own in (
            ("--devices", devices, start.devices),
            ("--microbatches", microbatches, start.microbatches),
        ):
            if given is not None and given != own:
                raise UserError(f"{what} {given} differs from {args.start}'s {own}")
        devices, microbatches = start.devices, start.microbatches
    if model is None:
        raise UserError("--model is required (or a --from plan that names its model)")
    if devices is None or microbatches is None:
        raise UserError("--devices and --microbatches are required (or a --from plan)")
    return start, model, devices, microbatches


def _problem(args, model: str, devices: int, microbatches: int, start):
    """The options given, else the --from plan's header (micro-batch shape, memory limit, data
    parallelism), else the defaults."""
    from ..costs.devices import get_device
    from ..models import load_model
    from ..models.ep import ep_problem
    from ..plan import RUNTIME_FIELDS, zero_without_copies
    from ..tune.problem import Problem

    own = start.header if start is not None else None
    try:
        memory = memory_limit(args, own.memory if own is not None else None)
        dp = args.dp if args.dp is not None else own.dp if own is not None else 1
        zero = args.zero if args.zero is not None else own.zero if own is not None else 0
        pointless = zero_without_copies(zero, dp)
        if pointless:  # lint warns of it in a plan; a search that shards nothing is refused
            raise UserError(f"--{pointless}: give --dp 2 or more, or --zero 0")
        ep = args.ep if args.ep is not None else own.ep if own is not None else 1
        why = ep_problem(load_model(model), ep, dp)
        if why is not None:  # lint's E705 / E706 on every plan the tuner would write
            raise UserError(f"--ep {ep}: {why[1]}")
        # the --from plan's cluster and runtime (its costs assume them) unless options differ
        kept = (
            "tp",
            "sequence_parallel",
            "gpus_per_node",
            *RUNTIME_FIELDS,
            "runtime",
            "grad_accum_dtype",
        )
        mesh = {name: getattr(own, name) for name in kept} if own is not None else {}
        mesh.update(mesh_update(args, mesh.get("tp", 1), mesh.get("sequence_parallel")), ep=ep)
        problem = Problem.create(
            model,
            devices,
            microbatches,
            device=args.device,
            memory=memory,
            link=link_named(args.link) if args.link else None,
            microbatch_size=args.microbatch_size or (own and own.microbatch_size),
            seq_len=args.seq_len or (own and own.seq_len),
            dp=dp,
            zero=zero,
            recompute=args.recompute,
            inter_link=args.inter_node_link or get_device(args.device).inter_node_link,
            **mesh,
        )
    except OctoError as e:
        raise UserError(str(e)) from None
    refuse_runtime_conflict("tune", problem.header)
    return problem


AUTO_MODE = "auto"
KEEP_PARTITION, KEEP_PLACEMENT = "partition", "partition,placement"


class _Recompute:
    """--recompute: auto, or a mode for every stage."""

    __name__ = "recompute"  # argparse's messages name it

    @property
    def choices(self) -> tuple[str, ...]:
        """The words it takes, which the completion offers (read when asked: plan is heavy)."""
        from ..plan import Recompute

        return (AUTO_MODE, *(m.value for m in Recompute))

    def __call__(self, text: str):
        from ..plan import Recompute

        name = text.strip().lower()
        if name not in self.choices:
            raise argparse.ArgumentTypeError(
                f"{text.strip()[:40]!r} is not a recompute choice "
                f"(choose from {', '.join(self.choices)})"
            )
        return name if name == AUTO_MODE else Recompute(name)


RECOMPUTE = _Recompute()


def _keep(text: str) -> str:
    """--keep: partition, or partition,placement (in either order)."""
    parts = sorted(x.strip().lower() for x in text.split(","))
    if parts == ["partition"]:
        return KEEP_PARTITION
    if parts == ["partition", "placement"]:
        return KEEP_PLACEMENT
    if parts == ["placement"]:
        raise argparse.ArgumentTypeError(
            "a placement is of the plan's stages: keep the "
            "partition too (--keep partition,placement)"
        )
    raise argparse.ArgumentTypeError(
        f"{text.strip()[:40]!r}: write partition or partition,placement"
    )


_keep.choices = (KEEP_PARTITION, KEEP_PLACEMENT)  # type: ignore[attr-defined]  # offered by the completion


def _render(plan, problem, best, args) -> str:
    from ..gen import render_plan
    from ..version import made_by

    title = (
        f"Tuned by {made_by('tune')} with seed {args.seed}: {problem.header.model}, "
        f"{problem.devices} devices, {problem.microbatches} micro-batches.\n"
        f"Simulated iteration {best.time * 1e3:.1f} ms, efficiency "
        f"{problem.lower_bound() / best.time:.3f} against the lower bound."
    )
    return render_plan(plan, title=title)
