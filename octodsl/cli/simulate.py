"""`octodsl simulate PLAN... [--model SPEC | --profile FILE | --costs F=1,B=1,W=1[,comm=0]]
[--device H800] [--link nvlink] [--inter-node-link ib-ndr] [--dp N] [--zero 0|1|2] [--ep N] [--tp N]
[--sequence-parallel true|false] [--gpus-per-node N] [--recompute none|full|selective]
[--json] [--trace FILE] [--png FILE]`: iteration time, bubbles, overlap, memory, each link's
busy time and the critical path of a plan, before renting any GPU. Several plans are compared
side by side, one row each. --dp, --zero, --ep, --tp, --sequence-parallel, --gpus-per-node and
--recompute override the plan's header and `recompute` section (--recompute: every stage), for
the costs and the communication alike. Pipeline messages and data-parallel collectives take
--link inside a node and --inter-node-link between nodes, by where the plan's ranks sit
(octodsl.mesh)."""

from __future__ import annotations

import dataclasses
import sys
import time
from pathlib import Path
from typing import TypedDict

from ..costs.devices import LINKS, get_device
from ..costs.resolve import cost_table, header_costing
from ..costs.table import AccumulationError, Link, uniform_stage_costs
from ..errors import OctoError
from ..extras import require
from ..interop import read_csv
from ..lang import PlanSyntaxError
from ..lint.memory import CODE as MEMORY_CODE
from ..plan import Plan, PlanError, Recompute
from ..sim import SimCosts, SimResult, compile, simulate, warm_up
from ..sim.costs import TpMismatch
from .common import (
    DEVICE,
    DEVICE_HELP,
    INTER_NODE_LINK,
    LINK,
    LINK_HELP,
    UserError,
    add_data_parallel_options,
    add_mesh_options,
    check_outputs,
    link_named,
    mesh_update,
    op_costs,
    output,
    pipeline_link,
    print_json,
    read_text,
    refuse_runtime_conflict,
    stdout_console,
    warn_zero_without_copies,
    writing,
)
from .plans import checked_plan

_UNIT_COSTS = "F=1,B=1,W=1,comm=0"


class _Shown(TypedDict):
    """What the report says beside a result (to_json's and summary's keywords)."""

    link: str
    memory_limit: int | None
    simulate_seconds: float


def register(sub) -> None:
    p = sub.add_parser(
        "simulate",
        help="simulate a plan: iteration time, bubbles, communication "
        "overlap, peak memory, critical path",
    )
    p.add_argument(
        "plans",
        nargs="+",
        metavar="PLAN",
        help="a .octo plan (or a PyTorch schedule .csv); several are compared side by side",
    )
    src = p.add_mutually_exclusive_group()
    src.add_argument(
        "--model",
        metavar="SPEC",
        help="model (built-in name or spec file); default: the plan's `model`",
    )
    src.add_argument("--profile", metavar="FILE", help="measured per-layer costs (octodsl profile)")
    src.add_argument(
        "--costs",
        type=op_costs,
        metavar="F=..,B=..,W=..[,comm=..]",
        help="the same costs for every stage, per micro-batch, in seconds (a fused "
        f"backward costs B + W); comm is each message's time. Default for a plan "
        f"without a model: {_UNIT_COSTS}",
    )
    p.add_argument(
        "--device",
        type=DEVICE,
        default="H800",
        metavar="DEVICE",
        help=f"device for a model's analytical costs: {DEVICE_HELP} (default H800)",
    )
    p.add_argument(
        "--link",
        type=LINK,
        metavar="NAME",
        help="link between pipeline devices in one node (and of the tp collectives, "
        f"with a model): {', '.join(LINKS)} (none: communication is free), or a "
        "link file. Default: a calibrated profile's link, "
        "else the device's node link (H800: nvlink) with a model, --costs' comm without",
    )
    p.add_argument(
        "--dp-link",
        type=LINK,
        metavar="NAME",
        help="link of every data-parallel "
        f"collective, {LINK_HELP} (default: --inter-node-link for a dp group that "
        "spans nodes, else --link)",
    )
    add_data_parallel_options(p, default_from="the plan's")
    add_mesh_options(p, default_from="the plan's")
    p.add_argument(
        "--recompute",
        choices=[m.value for m in Recompute],
        help="what every stage recomputes (default: the plan's `recompute` section)",
    )
    p.add_argument(
        "--json", action="store_true", help="print one JSON object instead of the summary"
    )
    p.add_argument(
        "--trace",
        type=output(".json"),
        metavar="FILE",
        help="write a Chrome / Perfetto trace (a .json file)",
    )
    p.add_argument(
        "--png",
        type=output(".png"),
        metavar="FILE",
        help="write a Gantt chart (a .png file; needs matplotlib)",
    )
    p.set_defaults(func=run)


def run(args) -> int:
    if len(args.plans) > 1 and (args.trace or args.png):
        raise UserError("--trace and --png take one plan at a time")
    check_outputs(args, "trace", "png")
    if args.png:
        require("simulate --png", "matplotlib")
    dp_link = link_named(args.dp_link) if args.dp_link else None
    warm_up()  # start-up (loading the compiled walk) is not simulating
    rows: list[tuple[str, SimResult, _Shown]] = []
    for path in args.plans:
        plan = load_plan_or_report(path)
        if plan is None:
            return 1
        update = {
            k: v
            for k, v in (("dp", args.dp), ("zero", args.zero), ("ep", args.ep))
            if v is not None
        }
        update.update(mesh_update(args, plan.header.tp, plan.header.sequence_parallel))
        plan = with_overrides(plan, update, args.recompute)
        refuse_runtime_conflict(path, plan.header)
        warn_zero_without_copies(path, plan.header.zero, plan.header.dp)
        costs, link, inter_link, device_memory = _costs(args, path, plan)
        t0 = time.perf_counter()
        try:
            result = simulate(compile(plan), costs, link, inter_link=inter_link, dp_link=dp_link)
        except PlanError as e:
            raise UserError(f"{path}: {e}") from None
        limit = plan.header.memory if plan.header.memory is not None else device_memory
        rows.append(
            (
                path,
                result,
                _Shown(
                    link=link.name, memory_limit=limit, simulate_seconds=time.perf_counter() - t0
                ),
            )
        )
    from ..sim.report import comparison, summary, to_json

    if args.json:
        objs = [to_json(result, **info) for _, result, info in rows]
        print_json(objs[0] if len(objs) == 1 else objs)
    else:
        out = stdout_console()
        if len(rows) == 1:
            out.print(summary(rows[0][1], **rows[0][2]))
        else:
            out.print(comparison([(path, result) for path, result, _ in rows]))
    _, result, _ = rows[0]
    if args.trace:
        from ..sim.trace import write_trace

        with writing(args.trace):
            write_trace(result, args.trace)
    if args.png:
        from ..sim.gantt import write_gantt

        with writing(args.png):
            write_gantt(result, args.png)
    return 0


def load_plan_or_report(path: str) -> Plan | None:
    """The plan, or None after printing why it cannot be simulated (a CSV's errors, which lint
    does not read; a .octo plan's are refused by checked_plan in one line). Lint's memory error
    is no reason: the simulation shows the memory."""
    if Path(path).suffix.lower() != ".csv":
        return checked_plan(path, allow=(MEMORY_CODE,))[0]
    source = read_text(path)
    try:
        plan, diags = read_csv(source, path)
    except PlanSyntaxError as e:
        print(e.render(), file=sys.stderr)
        return None
    errors = [d for d in diags if d.is_error]
    for d in errors:
        print(d.render(path, source), file=sys.stderr)
    return None if errors else plan


def with_overrides(plan: Plan, update: dict, recompute: str | None) -> Plan:
    """The plan with the header fields in `update` (dp, zero, tp, ...: those given) and every
    stage's recompute (None: the plan's) replaced."""
    header = plan.header.model_copy(update=update)
    stages = (
        plan.stages
        if recompute is None
        else [dataclasses.replace(s, recompute=Recompute(recompute)) for s in plan.stages]
    )
    return dataclasses.replace(plan, header=header, stages=stages)


def _costs(args, path: str, plan: Plan) -> tuple[SimCosts, Link, Link, int | None]:
    """The costs, the pipeline's links inside and between nodes, and the memory of the device
    the costs are for. Between nodes: --inter-node-link, else the device's inter-node link
    (InfiniBand NDR for a device we hold no description of), but for a calibrated profile's
    link or --costs' comm, which then holds everywhere."""
    model = args.model or (None if args.costs or args.profile else plan.header.model)
    if model or args.profile:
        h = plan.header
        given = link_named(args.link) if args.link else None
        try:
            # The tp collectives run inside a node: on --link when given, else the device's own.
            table = cost_table(
                model=model,
                profile=args.profile,
                device=args.device,
                tp_link=given,
                inter_link=args.inter_node_link,
                **header_costing(h),
            )
            costs = SimCosts.from_table(table, plan)
        except (TpMismatch, AccumulationError) as e:
            raise UserError(f"{path}: {e}") from None
        except PlanError as e:
            raise UserError(
                f"{path}: {e}; partition the plan over the model's layers, or "
                "simulate it with --costs"
            ) from None
        except OctoError as e:
            raise UserError(str(e)) from None
        try:
            device = get_device(table.meta.get("device", args.device))
        except OctoError:  # a profile measured on a device we hold no description of
            device = None
        link = pipeline_link(args.link, table, device.node_link if device else "nvlink")
        fitted = table.calibration is not None and link is table.calibration.link
        inter = args.inter_node_link or (
            link if fitted else link_named(device.inter_node_link if device else INTER_NODE_LINK)
        )
        return costs, link, inter, device.memory if device else None
    values = args.costs or op_costs(_UNIT_COSTS)
    costs = SimCosts(
        tuple(uniform_stage_costs(plan.num_stages, values["F"], values["B"], values["W"])),
        source="uniform costs " + ", ".join(f"{k}={v:g}" for k, v in values.items()),
    )
    fixed = Link(f"{values['comm']:g} s per message", values["comm"], 0.0)
    link = link_named(args.link) if args.link else fixed
    return costs, link, args.inter_node_link or link, None
