"""Expert parallelism for the MoE hybrids (issue 29): what ep buys on H800 clusters, and what
DualPipeV's overlap groups buy over the same orders run op by op.

For each model and GPU count, every configuration of a grid (tp, pp, dp = GPUs / tp / pp, ep
dividing dp and the expert count, ZeRO 1, micro-batch 1, recompute none or full, schedules 1F1B,
ZB-H1 and DualPipeV) is generated with `octodsl gen` and simulated with the analytical H800
costs; a configuration counts when its peak memory fits the H800's 80 GB. The table gives the
fastest with ep 1 and with any ep, and, for the fastest DualPipeV, its time with its overlap
groups and with each group's ops run in turn (the all-to-alls then in line). A grid of classic
schedules, not the tuner: what `tune --gpus` would add on top is not measured here.

    .venv/bin/python benchmarks/expert_parallel.py [-o benchmarks/expert_parallel.md]
"""

from __future__ import annotations

import argparse
import dataclasses
import re
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from machine import commit, cpu_model  # noqa: E402

MODELS = ("jamba-v0.1", "qwen3-next-80b")
GPUS = (64, 128, 256)
GLOBAL_BATCH = 1024
"""Sequences per iteration (4096 tokens each): 4M tokens, the order of a large MoE run's batch."""
TP = (1, 2, 4, 8)
PP = (2, 4, 8, 16)
SCHEDULES = ("1f1b", "zb-h1", "dualpipev")
RECOMPUTE = ("none", "full")
DEVICE = "H800"


@dataclasses.dataclass(frozen=True)
class Config:
    tp: int
    pp: int
    dp: int
    ep: int
    schedule: str
    recompute: str

    def __str__(self) -> str:
        return (
            f"tp {self.tp} x pp {self.pp} x dp {self.dp}, ep {self.ep}, {self.schedule}, "
            f"recompute {self.recompute}"
        )


def experts(model: str) -> int:
    from octodsl.models import load_model

    spec = load_model(model)
    return max(getattr(layer, "experts", 0) for layer in spec.layers)


def grid(model: str, gpus: int) -> list[Config]:
    e = experts(model)
    out = []
    for tp in TP:
        for pp in PP:
            if gpus % (tp * pp):
                continue
            dp = gpus // (tp * pp)
            if GLOBAL_BATCH % dp:
                continue
            m = GLOBAL_BATCH // dp
            for ep in (k for k in range(1, dp + 1) if dp % k == 0 and e % k == 0):
                for schedule in SCHEDULES:
                    if m < (2 * pp if schedule == "dualpipev" else pp):
                        continue
                    for recompute in RECOMPUTE:
                        out.append(Config(tp, pp, dp, ep, schedule, recompute))
    return out


def split_groups(plan):
    """The plan with each overlap group's ops run in turn, in the group's order."""
    from octodsl.plan import Slot

    schedule = [[Slot((op,)) for slot in slots for op in slot.ops] for slots in plan.schedule]
    return dataclasses.replace(plan, schedule=schedule)


def simulate(model: str, c: Config, tables: dict, grouped: bool = True):
    """(iteration seconds, peak bytes) of configuration `c`."""
    from octodsl.costs.devices import get_device, get_link
    from octodsl.costs.resolve import cost_table, header_costing
    from octodsl.gen import generate
    from octodsl.plan import Recompute
    from octodsl.sim import SimCosts, simulate

    m = GLOBAL_BATCH // c.dp
    plan = generate(
        c.schedule,
        c.pp,
        m,
        model=model,
        mesh={"tp": c.tp, "dp": c.dp, "ep": c.ep, "zero": 1},
    )
    stages = [dataclasses.replace(s, recompute=Recompute(c.recompute)) for s in plan.stages]
    plan = dataclasses.replace(plan, stages=stages)
    if not grouped:
        plan = split_groups(plan)
    key = tuple(sorted(header_costing(plan.header).items()))
    if key not in tables:
        tables[key] = cost_table(model=model, device=DEVICE, **dict(key))
    device = get_device(DEVICE)
    r = simulate(
        plan,
        SimCosts.from_table(tables[key], plan),
        get_link(device.node_link),
        inter_link=get_link(device.inter_node_link),
    )
    return r.iteration_time, float(r.peak_memory.max())


def run(model: str, gpus: int) -> dict:
    from octodsl.costs.devices import get_device

    limit = get_device(DEVICE).memory
    tables: dict = {}
    fits: list[tuple[float, Config]] = []
    configs = grid(model, gpus)
    for c in configs:
        seconds, peak = simulate(model, c, tables)
        if peak <= limit:
            fits.append((seconds, c))
    best = {
        "ep 1": min((f for f in fits if f[1].ep == 1), default=None, key=lambda f: f[0]),
        "any ep": min(fits, default=None, key=lambda f: f[0]),
    }
    dpv = min((f for f in fits if f[1].schedule == "dualpipev"), default=None, key=lambda f: f[0])
    split = simulate(model, dpv[1], tables, grouped=False)[0] if dpv else None
    return {
        "model": model,
        "gpus": gpus,
        "configs": len(configs),
        "fit": len(fits),
        "best": best,
        "dualpipev": dpv,
        "dualpipev_split": split,
    }


def tokens(seconds: float, gpus: int) -> str:
    return f"{GLOBAL_BATCH * 4096 / seconds / gpus:,.0f}"


def report(results: list[dict], command: str, seconds: float) -> str:
    lines = [
        "# Expert parallelism on H800 clusters",
        "",
        f"Made by `{command}` at commit {commit()} on {cpu_model()} in {seconds:.0f} s "
        "(benchmarks/expert_parallel.py's docstring says what it compares).",
        "",
        f"Global batch {GLOBAL_BATCH} sequences of 4096 tokens; analytical {DEVICE} costs, NVLink "
        "inside a node of 8, NDR InfiniBand between; ZeRO 1, micro-batch 1; a configuration "
        "counts when its peak memory fits 80 GB. Throughput in tokens per GPU per second.",
        "",
        "| model | GPUs | configurations (fit) | best with ep 1 | tok/GPU/s | best with ep | "
        "tok/GPU/s | speed-up | DualPipeV overlapped / in turn |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        one, anyep = r["best"]["ep 1"], r["best"]["any ep"]
        g = r["gpus"]
        speed = f"{one[0] / anyep[0]:.2f}x" if one and anyep else "-"
        dpv = r["dualpipev"]
        dual = (
            f"{dpv[0]:.3f} s / {r['dualpipev_split']:.3f} s ({str(dpv[1])})"
            if dpv and r["dualpipev_split"]
            else "-"
        )
        lines.append(
            f"| {r['model']} | {g} | {r['configs']} ({r['fit']}) | "
            f"{one[1] if one else 'none fits'} | {tokens(one[0], g) if one else '-'} | "
            f"{anyep[1] if anyep else 'none fits'} | {tokens(anyep[0], g) if anyep else '-'} | "
            f"{speed} | {dual} |"
        )
    return "\n".join(lines) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("-o", "--output", type=Path, default=Path("benchmarks/expert_parallel.md"))
    args = ap.parse_args()
    t0 = time.perf_counter()
    results = []
    for model in MODELS:
        for gpus in GPUS:
            r = run(model, gpus)
            print(f"{model} {gpus}: {r['fit']} of {r['configs']} fit", flush=True)
            results.append(r)
    command = " ".join(["benchmarks/expert_parallel.py", *sys.argv[1:]])
    text = report(results, f".venv/bin/python {command}", time.perf_counter() - t0)
    from octodsl.fileio import write_atomic

    try:
        write_atomic(args.output, text)
    except OSError as e:
        print(f"expert_parallel.py: cannot write {args.output}: {e.strerror or e}", file=sys.stderr)
        return 2
    print(re.sub(r"\n+$", "", text))
    return 0


if __name__ == "__main__":
    sys.exit(main())
