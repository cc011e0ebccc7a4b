"""Expert parallelism for the MoE hybrids (issue 29): what letting `tune --gpus` choose ep buys on
H800 clusters, and what DualPipeV's overlap groups buy over the same orders run op by op.

For each model and GPU count, the whole-cluster search (`octodsl tune --gpus`, octodsl.tune.cluster)
runs twice with the same budget: once with ep searched beside tp, pp, dp, micro-batching and
ZeRO, once with ep fixed at 1 (`--ep 1`). The table gives each side's best configuration and
plan, and the speed-up of the first over the second. For the configuration the search with ep
chose, the fastest DualPipeV plan of it (its classic plan, each partition and recompute tried)
is simulated with its overlap groups and with each group's ops run in turn (the all-to-alls
then in line). Both sides' searches are stopped by the clock, so a rerun on a faster or less
loaded machine may screen and tune more configurations.

    .venv/bin/python benchmarks/expert_parallel.py [--budget 120] [-o benchmarks/expert_parallel.md]
"""

from __future__ import annotations

import argparse
import dataclasses
import re
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from machine import check_outputs, command_line, commit, cpu_model, write_outputs  # noqa: E402

MODELS = ("jamba-v0.1", "qwen3-next-80b")
GPUS = (64, 128, 256)
GLOBAL_BATCH = 1024
"""Sequences per iteration (4096 tokens each): 4M tokens, the order of a large MoE run's batch."""
DEVICE = "H800"
BUDGET = 120.0
"""Seconds per search (each side of each row): `tune --budget`."""


def split_groups(plan):
    """The plan with each overlap group's ops run in turn, in the group's order."""
    from octodsl.plan import Slot

    schedule = [[Slot((op,)) for slot in slots for op in slot.ops] for slots in plan.schedule]
    return dataclasses.replace(plan, schedule=schedule)


def search(model: str, gpus: int, budget: float, ep: int | None):
    from octodsl.costs.devices import get_device
    from octodsl.tune.cluster.search import search as cluster_search
    from octodsl.tune.cluster.space import Cluster

    cluster = Cluster(
        model, gpus, GLOBAL_BATCH, device=DEVICE, memory=get_device(DEVICE).memory, ep=ep
    )
    return cluster_search(cluster, budget=budget)


def dualpipev(candidate) -> tuple[float, float] | None:
    """(overlapped, in turn) seconds of the candidate's fastest DualPipeV plan that fits, or None."""
    from octodsl.tune.pipeline.evaluate import Evaluator
    from octodsl.tune.reference.baselines import best_baseline, classic_baselines

    evaluate = Evaluator(candidate.problem)
    best = best_baseline(
        classic_baselines(candidate.problem, evaluate, schedules=(("dualpipev", None),))
    )
    if best is None or best.score is None:
        return None
    return best.score.time, evaluate(split_groups(best.score.plan)).time


def run(model: str, gpus: int, budget: float) -> dict:
    from octodsl.tune.cluster.report import rows, skipped_counts

    out: dict = {"model": model, "gpus": gpus}
    for side, ep in (("ep", None), ("ep 1", 1)):
        result = search(model, gpus, budget, ep)
        best = rows(result)[0]
        counts = skipped_counts(result)
        out[side] = {
            "config": best.config.short(),
            "plan": best.how,
            "tok": best.throughput,
            "space": sum(counts.values()),
            "screened": counts["tuned"] + counts["screened"],
        }
        if ep is None:
            out["dualpipev"] = dualpipev(result.best)
    return out


def report(results: list[dict], command: str, seconds: float, budget: float) -> str:
    lines = [
        "# Expert parallelism on H800 clusters: `tune --gpus` with ep searched and with ep 1",
        "",
        f"Made by `{command}` at commit {commit()} on {cpu_model()} in {seconds:.0f} s "
        "(benchmarks/expert_parallel.py's docstring says what it compares).",
        "",
        f"Global batch {GLOBAL_BATCH} sequences of 4096 tokens; analytical {DEVICE} costs, NVLink "
        "inside a node of 8, NDR InfiniBand between, 80 GB per GPU; target deepspeed (ZeRO 0 "
        f"and 1). Each search had a budget of {budget:.0f} s of wall time on this 2-core machine "
        "shared with other jobs (the same on both sides; the configurations' enumeration "
        "counts in it), so each side screened and tuned only the most promising "
        "configurations (`screen_order`: by layout estimate, each ep in turn). Configurations are `Config.short()`: tp, pp, dp, "
        "ep (when over 1), micro-batches x sequences each, ZeRO stage. Throughput in tokens "
        "per GPU per second.",
        "",
        "| model | GPUs | ep searched: best | plan | tok/GPU/s | ep 1: best | plan | "
        "tok/GPU/s | speed-up | DualPipeV at the ep-searched configuration: overlapped / in "
        "turn |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        a, b = r["ep"], r["ep 1"]
        dual = r["dualpipev"]
        dpv = (
            f"{dual[0]:.3f} s / {dual[1]:.3f} s ({dual[1] / dual[0]:.2f}x)"
            if dual
            else "no DualPipeV plan fits"
        )
        lines.append(
            f"| {r['model']} | {r['gpus']} | {a['config']} | {a['plan']} | {a['tok']:,.0f} | "
            f"{b['config']} | {b['plan']} | {b['tok']:,.0f} | {a['tok'] / b['tok']:.2f}x | "
            f"{dpv} |"
        )
    lines += [
        "",
        "Configurations screened (their classic plans simulated, some then tuned) of the space, "
        "ep searched and ep 1: "
        + "; ".join(
            f"{r['model']} {r['gpus']}: {r['ep']['screened']:,} of {r['ep']['space']:,} and "
            f"{r['ep 1']['screened']:,} of {r['ep 1']['space']:,}"
            for r in results
        )
        + ".",
    ]
    return "\n".join(lines) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("-o", "--output", type=Path, default=Path("benchmarks/expert_parallel.md"))
    ap.add_argument(
        "--budget", type=float, default=BUDGET, help="seconds per search (default %(default)s)"
    )
    args = ap.parse_args()
    if not check_outputs("expert_parallel.py", [args.output]):
        return 2
    if not 1 <= args.budget <= 3600:
        print("expert_parallel.py: --budget takes 1 to 3600 seconds", file=sys.stderr)
        return 2
    t0 = time.perf_counter()
    results = []
    for model in MODELS:
        for gpus in GPUS:
            r = run(model, gpus, args.budget)
            print(
                f"{model} {gpus}: ep {r['ep']['config']} {r['ep']['tok']:,.0f}, "
                f"ep 1 {r['ep 1']['config']} {r['ep 1']['tok']:,.0f} tok/GPU/s",
                flush=True,
            )
            results.append(r)
    command = command_line("benchmarks/expert_parallel.py")
    text = report(results, f".venv/bin/python {command}", time.perf_counter() - t0, args.budget)
    if not write_outputs("expert_parallel.py", {args.output: text}):
        return 2
    print(re.sub(r"\n+$", "", text))
    return 0


if __name__ == "__main__":
    sys.exit(main())
