"""Throughput of the DeepSpeed executor against stock DeepSpeed, in one process group.

    DS_ACCELERATOR=cpu OMP_NUM_THREADS=1 deepspeed --num_gpus 2 benchmarks/executor_bench.py \\
        [--model nemotron-h-tiny] [--seq-len 128] [--microbatches 8] [--rounds 12] [--steps 1] \\
        [-o benchmarks/executor_results.json]

Engines, all on the same model, data and config, built once and measured in turns (round
robin, so that they share the machine's state):
- stock: DeepSpeed's PipelineEngine, TrainSchedule (1F1B), DeepSpeed's `parameters` partition;
- 1f1b-same: the same 1F1B schedule and partition as a plan through octodsl (the overhead);
- 1f1b-balanced, zb-h1-balanced, zb-v-balanced: plans whose partition balances the
  profiled per-layer F + B + W time of this machine (the speed-up).
Reported: the median and the best step time over rounds x steps (the first step of each engine
dropped: warm-up), as tokens/s; the best is the least disturbed by other load on the machine.
Rank 0 writes the JSON (with the load average before and after) and prints a markdown table.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

import torch

os.environ.setdefault("DS_ACCELERATOR", "cpu")
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "examples"))
sys.path.insert(0, str(ROOT / "benchmarks"))

import deepspeed  # noqa: E402
from deepspeed import comm as dist  # noqa: E402
from machine import check_outputs, write_outputs  # noqa: E402
from train import step_data  # noqa: E402

from octodsl.costs.profiler import profile_model  # noqa: E402
from octodsl.deepspeed_ext import init_distributed, initialize  # noqa: E402
from octodsl.deepspeed_ext.module import FixedPartitionModule, parameters_parts  # noqa: E402
from octodsl.gen import generate  # noqa: E402
from octodsl.layers import lm_loss, pipeline_specs  # noqa: E402
from octodsl.models import load_model  # noqa: E402
from octodsl.partition import balance_time  # noqa: E402
from octodsl.plan import Plan, Stage  # noqa: E402

SEED = 1234


def parse_args():
    p = argparse.ArgumentParser()
    p.add_argument("--model", default="nemotron-h-tiny")
    p.add_argument("--seq-len", type=int, default=128)
    p.add_argument("--microbatches", type=int, default=8)
    p.add_argument("--rounds", type=int, default=12)
    p.add_argument("--steps", type=int, default=1, help="steps per engine per turn")
    p.add_argument("-o", "--out", default=str(ROOT / "benchmarks" / "executor_results.json"))
    p.add_argument("--local_rank", type=int, default=-1)
    return p.parse_args()


def with_partition(plan: Plan, ranges: list[range]) -> Plan:
    return Plan(
        plan.header, [Stage(r.start, r.stop - 1) for r in ranges], plan.placement, plan.schedule
    )


def balanced(costs: list[float], stages: int) -> list[range]:
    return [range(a, b + 1) for a, b in balance_time(costs, stages)]


def layer_seconds(spec) -> list[float]:
    """Profiled F + B + W seconds per layer (rank 0 measures, everyone gets the numbers)."""
    box = [None]
    if dist.get_rank() == 0:
        table = profile_model(spec, "cpu", threads=1).cost_table("<bench>")
        box = [[lc.f + lc.b + lc.w for lc in table.layers]]
    torch.distributed.broadcast_object_list(box, src=0)
    return box[0]


def main() -> int:
    args = parse_args()
    if not check_outputs("executor_bench.py", [args.out]):  # each rank: all stop before the group
        return 2
    torch.set_num_threads(1)
    init_distributed("gloo")
    devices = dist.get_world_size()
    spec = load_model(args.model).with_shape(1, args.seq_len)
    config = {
        "train_micro_batch_size_per_gpu": 1,
        "gradient_accumulation_steps": args.microbatches,
        "optimizer": {"type": "AdamW", "params": {"lr": 1e-4}},
        "gradient_clipping": 1.0,
        "steps_per_print": 10**9,
    }
    common = dict(loss_fn=lm_loss, seed_layers=True, base_seed=SEED)

    costs = layer_seconds(spec)
    parts = parameters_parts(pipeline_specs(spec), devices)
    stock_module = FixedPartitionModule(pipeline_specs(spec), parts, num_stages=devices, **common)
    engines = {
        "stock": deepspeed.initialize(
            model=stock_module,
            config=config,
            model_parameters=[p for p in stock_module.parameters() if p.requires_grad],
        )[0]
    }
    layouts = {
        # strict=False: consecutive pairs, parts[1:] is one shorter
        "1f1b-same": ("1f1b", [range(a, b) for a, b in zip(parts, parts[1:], strict=False)]),
        "1f1b-balanced": ("1f1b", balanced(costs, devices)),
        "zb-h1-balanced": ("zb-h1", balanced(costs, devices)),
        "zb-v-balanced": ("zb-v", balanced(costs, 2 * devices)),
    }
    for name, (schedule, ranges) in layouts.items():
        plan = with_partition(
            generate(schedule, devices=devices, microbatches=args.microbatches), ranges
        )
        engines[name] = initialize(pipeline_specs(spec), plan, config=config, **common)[0]

    tokens = spec.seq_len * args.microbatches
    load_before = os.getloadavg()
    times: dict[str, list[float]] = {name: [] for name in engines}
    step = 0
    for _ in range(args.rounds):
        for name, engine in engines.items():
            for _ in range(args.steps):
                data = step_data(SEED, step, 0, args.microbatches, 1, spec.seq_len, spec.vocab)
                dist.barrier()
                start = time.perf_counter()
                engine.train_batch(data)
                times[name].append(time.perf_counter() - start)
                step += 1
    if dist.get_rank() != 0:
        return 0
    stock_med, stock_best = statistics.median(times["stock"][1:]), min(times["stock"][1:])
    rows = []
    for name, ts in times.items():
        med, best = statistics.median(ts[1:]), min(ts[1:])
        rows.append(
            {
                "engine": name,
                "median_step_s": med,
                "best_step_s": best,
                "tokens_per_s": tokens / med,
                "best_tokens_per_s": tokens / best,
                "vs_stock": stock_med / med,
                "best_vs_stock": stock_best / best,
                "steps": ts,
            }
        )
    result = {
        "model": args.model,
        "seq_len": args.seq_len,
        "microbatches": args.microbatches,
        "processes": devices,
        "threads_per_process": torch.get_num_threads(),
        "stock_parts": list(parts),
        "balanced": {k: [[r.start, r.stop - 1] for r in v[1]] for k, v in layouts.items()},
        "layer_seconds": costs,
        "load_average": [load_before, os.getloadavg()],
        "rows": rows,
    }
    if not write_outputs("executor_bench.py", {Path(args.out): json.dumps(result, indent=1)}):
        return 2
    print(
        "| engine | median step (s) | tokens/s | vs stock | best step (s) | best tokens/s | vs stock |\n"
        "|---|---|---|---|---|---|---|"
    )
    for r in rows:
        print(
            f"| {r['engine']} | {r['median_step_s']:.3f} | {r['tokens_per_s']:.0f} | {r['vs_stock']:.3f}x "
            f"| {r['best_step_s']:.3f} | {r['best_tokens_per_s']:.0f} | {r['best_vs_stock']:.3f}x |"
        )


if __name__ == "__main__":
    sys.exit(main())
