"""Simulator speed, and nemotron-h-8b under 1F1B and ZB-V: writes benchmarks/simulator.md.

    .venv/bin/python benchmarks/simulator.py [--quick] [-o benchmarks/simulator.md]

Each timing is the best of several runs in one process after a warm-up (the compiled walk
loaded); the first-call costs are measured in fresh processes. --quick skips the 64 x 512 case.
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from rich.console import Console

from octodsl.costs.devices import get_device, get_link
from octodsl.costs.resolve import cost_table
from octodsl.costs.table import uniform_stage_costs
from octodsl.dag import build_graph
from octodsl.gen import generate
from octodsl.partition import balance_time
from octodsl.plan import OpKind, Plan, Stage
from octodsl.sim import SimCosts, SimDeadlock, compile, simulate, warm_up
from octodsl.sim.jit import JIT
from octodsl.sim.report import summary

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "benchmarks"))
from machine import check_outputs, write_outputs  # noqa: E402


def timed(fn, runs: int) -> tuple[float, object]:
    """The best of `runs` calls in seconds (timeit's convention: on a shared machine the
    slower runs measure the neighbours), and the last result."""
    times, out = [], None
    for _ in range(runs):
        t = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t)
    return min(times), out


def dict_walk(plan: Plan) -> float:
    """The issue's yardstick: a plain dictionary-driven walk of the compute ops alone (unit
    costs, no communication, no memory), each device in its order."""
    done: dict[tuple, float] = {}
    pos = [0] * plan.devices
    free = [0.0] * plan.devices
    S = plan.num_stages
    progress = True
    while progress:
        progress = False
        for d, slots in enumerate(plan.schedule):
            while pos[d] < len(slots):
                op = slots[pos[d]].ops[0]
                k, s, m = op.kind, op.stage, op.mb
                if k is OpKind.F:
                    needs = [("F", s - 1, m)] if s else []
                elif k is OpKind.W:
                    needs = [("B", s, m)]
                else:
                    needs = [("F", s, m)] + ([("B", s + 1, m)] if s + 1 < S else [])
                if any(n not in done for n in needs):
                    break
                start = max([free[d]] + [done[n] for n in needs])
                free[d] = start + 1.0
                done[("B" if k is OpKind.BW else k.value, s, m)] = free[d]
                pos[d] += 1
                progress = True
    return max(free)


def reordered(plan: Plan, program, costs, link) -> Plan:
    """The tuner's smallest move: on the middle device, swap the first two adjacent ops from
    the middle of its order on that still make a plan that runs."""
    d = plan.devices // 2
    for i in range(len(plan.schedule[d]) // 2, len(plan.schedule[d]) - 1):
        order = list(plan.schedule[d])
        order[i], order[i + 1] = order[i + 1], order[i]
        moved = dataclasses.replace(
            plan, schedule=[*plan.schedule[:d], order, *plan.schedule[d + 1 :]]
        )
        try:
            simulate(compile(moved, like=program), costs, link)
        except SimDeadlock:
            continue
        return moved
    raise AssertionError("no swap runs")


def with_model(plan: Plan, model: str, dp: int = 1, tp: int = 1) -> tuple[Plan, SimCosts]:
    """The plan with the model's layers (one GPU's share at `tp`) cut into its stages,
    balanced by F + B + W."""
    table = cost_table(model=model, device="H800", tp=tp)
    cuts = balance_time([x.f + x.b + x.w for x in table.layers], plan.num_stages)
    header = plan.header.model_copy(
        update={"name": f"{plan.header.name}-{model}", "model": model, "dp": dp, "tp": tp}
    )
    plan = dataclasses.replace(plan, header=header, stages=[Stage(a, b) for a, b in cuts])
    return plan, SimCosts.from_table(table, plan)


def speed_row(name: str, plan: Plan, costs, link, runs: int, inter_link=None) -> dict:
    t_compile, program = timed(lambda: compile(plan), max(3, runs // 2))
    gc.disable()  # as compile runs it
    t_graph, _ = timed(lambda: build_graph(plan), max(3, runs // 2))
    gc.enable()
    t_sim, result = timed(lambda: simulate(program, costs, link, inter_link=inter_link), runs)
    moved = reordered(plan, program, costs, link)
    t_re, _ = timed(
        lambda: simulate(compile(moved, like=program), costs, link, inter_link=inter_link), runs
    )
    t_dict, _ = timed(lambda: dict_walk(plan), max(3, runs // 2))
    return {
        "case": name,
        "ops": program.num_nodes,
        "messages": program.num_messages,
        "simulate": t_sim,
        "compile": t_compile,
        "graph": t_graph,
        "end_to_end": t_compile + t_sim,
        "reorder": t_re,
        "dict_walk": t_dict,
        "result": result,
    }


def first_call() -> dict:
    """Fresh processes: import + first simulation with the on-disk cache, and with none."""
    code = (
        "import time; t = time.perf_counter(); from octodsl.sim import warm_up; warm_up(); "
        "print(time.perf_counter() - t)"
    )
    out = {}
    with tempfile.TemporaryDirectory() as empty:
        for label, env in (("cold", {"NUMBA_CACHE_DIR": empty}), ("cached", {})):
            proc = subprocess.run(
                [sys.executable, "-c", code],
                capture_output=True,
                text=True,
                env={**os.environ, **env},
                cwd=REPO,
                check=True,
            )
            out[label] = float(proc.stdout.split()[-1])
    return out


def ms(seconds: float) -> str:
    return f"{seconds * 1e3:,.1f} ms"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="skip the 64 x 512 case")
    ap.add_argument("-o", "--output", default=str(REPO / "benchmarks" / "simulator.md"))
    args = ap.parse_args()
    if not check_outputs("simulator.py", [args.output]):
        return 2
    load = os.getloadavg()[0]
    warm_up()
    nvlink, ib = get_link("nvlink"), get_link("ib-ndr")

    rows = []
    shapes = [(16, 128, 20)] + ([] if args.quick else [(64, 512, 5)])
    for p, m, runs in shapes:
        plan = generate("zb-v", p, m)
        costs = uniform_stage_costs(2 * p, 1e-3, 1e-3, 1e-3, send_bytes=32e6)
        rows.append(speed_row(f"ZB-V {p} x {m}, 2 chunks", plan, costs, nvlink, runs))
    scale = []
    for name, chunks, tp, p, dp, m in (
        ("1f1b", None, 1, 16, 512, 64),
        ("zb-v", None, 1, 32, 256, 64),
        ("1f1b", None, 8, 16, 64, 64),
        ("interleaved", 2, 8, 16, 64, 64),
    ):
        plan, costs = with_model(generate(name, p, m, chunks), "nemotron-h-56b", dp, tp)
        shown = (
            f"{name}{f' v{chunks}' if chunks else ''} nemotron-h-56b, "
            + (f"TP {tp} x " if tp > 1 else "")
            + f"PP {p} x DP {dp} = {tp * p * dp} GPUs, {m} mb"
        )
        scale.append(speed_row(shown, plan, costs, nvlink, 10, inter_link=ib))
    rows += scale
    start = first_call()

    lines = [
        "# Simulator benchmark",
        "",
        f"Made by `.venv/bin/python benchmarks/simulator.py{' --quick' if args.quick else ''}` on "
        f"{platform.processor() or platform.machine()}, Python {platform.python_version()}, "
        f"{'numba ' + __import__('numba').__version__ if JIT else 'no numba (plain Python walk)'}; "
        f"one process, one thread, on a {os.cpu_count()}-core machine shared with other work (load "
        f"average {load:.1f} when it started, {os.getloadavg()[0]:.1f} when it ended). Times are "
        "the best of several runs after a warm-up (timeit's convention).",
        "",
        "- **simulate**: `simulate(program, costs, link)` on a compiled plan: the walk of compute, "
        "communication and memory, and every metric (what the tuner pays per cost change).",
        "- **compile**: `compile(plan)`; **of which graph**: the part spent in "
        "`octodsl.dag.build_graph(plan)`.",
        "- **end to end**: compile + simulate, from a Plan.",
        "- **reorder**: `compile(moved, like=program)` + simulate after moving one op on one device "
        "(no graph rebuild).",
        "- **dict walk**: the issue's yardstick, a plain dictionary-driven walk of compute ops "
        "alone, on this machine.",
        "",
        "| case | ops | messages | simulate | compile | of which graph | end to end | reorder | dict walk |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        lines.append(
            f"| {r['case']} | {r['ops']:,} | {r['messages']:,} | {ms(r['simulate'])} | "
            f"{ms(r['compile'])} | {ms(r['graph'])} | {ms(r['end_to_end'])} | {ms(r['reorder'])} | "
            f"{ms(r['dict_walk'])} |"
        )
    lines += [
        "",
        "The 8192-GPU plans (8 GPUs per node, Megatron's rank order: `octodsl.mesh`) walk one "
        "pipeline, every tp rank of a stage in lockstep and every dp copy alike, and compute the "
        "data-parallel ring all-reduce of each device's bf16 gradients from a formula. Links by "
        "where ranks sit: the tp collectives are in the analytical costs (one GPU's share of each "
        "layer at tp 8, sequence parallel, its collectives on NVLink); pipeline messages and dp "
        "collectives that leave a node take InfiniBand NDR (here all of them: a pipeline device's "
        "tp x dp GPUs fill 8 nodes or more), those inside one NVLink. Link columns are the "
        "busiest device's seconds (`SimResult.link_busy`):",
        "",
        "| case | iteration time | pipeline | tp collectives | pipeline inter-node | all-reduce | tokens / GPU / s | bubble |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in scale:
        res = r["result"]
        busy = res.link_busy()
        lines.append(
            f"| {r['case']} | {res.iteration_time:.3f} s | {res.pipeline_time:.3f} s | "
            f"{ms(float(busy['tp'].busy.max()))} | "
            f"{ms(float(busy['pipeline_inter_node'].busy.max()))} | "
            f"{res.allreduce.max() * 1e3:,.1f} ms | {res.throughput:,.0f} | "
            f"{res.bubble_ratio:.1%} |"
        )
    lines += [
        "",
        f"First call in a fresh process (import, then a tiny simulation): {start['cached']:.2f} s "
        f"with numba's on-disk cache, {start['cold']:.2f} s on a machine's very first run "
        "(compiling the walk).",
        "",
    ]

    # nemotron-h-8b on 8 H800s: 1F1B (8 stages) vs ZB-V (16 stages, V placement).
    console = Console(width=100, record=True, file=open(os.devnull, "w"), color_system=None)
    lines += ["## nemotron-h-8b on 8 H800 (NVLink), 32 micro-batches of 1 x 4096 tokens", ""]
    for name in ("1f1b", "zb-v"):
        plan, costs = with_model(generate(name, 8, 32), "nemotron-h-8b")
        result = simulate(plan, costs, nvlink)
        console.print(summary(result, link=nvlink.name, memory_limit=get_device("H800").memory))
        lines += ["```", console.export_text().rstrip(), "```", ""]
    lines += [
        "(Stages cut by `octodsl.partition.balance_time` over F + B + W per layer; "
        "ZB-V's V placement then pairs stage d with stage 15 - d on device d, unbalanced "
        "as generated, which is the tuner's to fix.)",
        "",
    ]
    text = "\n".join(lines)
    if not write_outputs("simulator.py", {Path(args.output): text}):
        return 2
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
