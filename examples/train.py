"""Train a hybrid model with any linted plan, or with stock DeepSpeed for comparison.

    deepspeed --num_gpus 4 examples/train.py --deepspeed_config examples/ds_config.json \\
        --schedule plan.octo [--model nemotron-h-tiny] [--steps N] [--trace measured.json] [--stock]

Rank 0 prints one JSON line per step: {"step", "loss", "tokens_per_s", "step_seconds"}.
Without a GPU, DeepSpeed runs on the CPU (DS_ACCELERATOR=cpu) over gloo. The data are
synthetic, deterministic token sequences (each next token a fixed function of the last one, so
the loss falls); the same for every engine, so losses compare across runs.

--stock runs DeepSpeed's own PipelineEngine (TrainSchedule, 1F1B) on the same model and data:
with the plan's partition when the plan has one stage per device, stage d on device d, and
otherwise with DeepSpeed's `parameters` partitioning.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("DS_ACCELERATOR", "cpu")

from octodsl.lang import PlanSyntaxError, load_plan  # noqa: E402
from octodsl.models import SpecError, load_model  # noqa: E402
from octodsl.plan import Plan  # noqa: E402

DEFAULT_MODEL = "nemotron-h-tiny"


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--deepspeed_config", required=True, help="DeepSpeed config (JSON)")
    p.add_argument("--schedule", required=True, help="the plan (.octo)")
    p.add_argument("--model", help="built-in model or spec file (default: the plan's model, "
                                   "else nemotron-h-tiny)")
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--seq-len", type=int, help="tokens per sequence (default: plan, then model)")
    p.add_argument("--seed", type=int, default=1234, help="model init and data seed")
    p.add_argument("--trace", help="write the measured per-op timeline (Chrome trace JSON)")
    p.add_argument("--stock", action="store_true", help="run stock DeepSpeed instead")
    p.add_argument("--save", help="save a checkpoint here after the last step")
    p.add_argument("--load", help="resume from a checkpoint saved with --save")
    p.add_argument("--local_rank", type=int, default=-1, help=argparse.SUPPRESS)
    return p.parse_args(argv)


def synthetic_batch(seed: int, step: int, dp: int, mb: int, batch: int, seq: int, vocab: int):
    """(ids, labels) for micro-batch `mb` of `step` on data-parallel copy `dp`: sequences that
    follow x' = (5x + 3) mod vocab from a random start, so the next token is learnable."""
    g = torch.Generator().manual_seed(((seed * 1009 + step) * 1009 + dp) * 1009 + mb)
    tokens = [torch.randint(0, vocab, (batch,), generator=g)]
    for _ in range(seq):
        tokens.append((5 * tokens[-1] + 3) % vocab)
    tokens = torch.stack(tokens, dim=1)
    return tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()


def step_data(seed: int, step: int, dp: int, microbatches: int, batch: int, seq: int, vocab: int):
    return iter([synthetic_batch(seed, step, dp, m, batch, seq, vocab) for m in range(microbatches)])


def stock_parts(plan: Plan) -> list[int] | None:
    """DeepSpeed stage boundaries equal to the plan's partition, if stock can run it (one stage
    per device, stage d on device d)."""
    if plan.num_stages != plan.devices or any(st.abstract for st in plan.stages):
        return None
    if plan.stage_device() != list(range(plan.devices)):
        return None
    return [st.first for st in plan.stages] + [plan.stages[-1].last + 1]


def build_engine(args, plan: Plan, spec, config: dict):
    """The octodsl engine running the plan, or with --stock DeepSpeed's own."""
    import deepspeed

    from octodsl.deepspeed_ext import init_distributed, initialize
    from octodsl.deepspeed_ext.module import FixedPartitionModule, parameters_parts
    from octodsl.layers import lm_loss, pipeline_specs

    specs = pipeline_specs(spec)
    common = dict(loss_fn=lm_loss, seed_layers=True, base_seed=args.seed)
    if not args.stock:
        costs = layer_costs(args.model or plan.header.model or DEFAULT_MODEL, spec) \
            if all(st.abstract for st in plan.stages) else None
        engine, *_ = initialize(specs, plan, config=config, layer_costs=costs, **common)
        return engine
    init_distributed()
    parts = stock_parts(plan) or parameters_parts(specs, plan.devices)
    module = FixedPartitionModule(specs, parts, num_stages=plan.devices, **common)
    config = {k: v for k, v in config.items() if k != "octo"}
    engine, *_ = deepspeed.initialize(model=module, config=config,
                                      model_parameters=[p for p in module.parameters() if p.requires_grad])
    return engine


def layer_costs(model: str, spec) -> list[float]:
    """Per-layer F + B + W seconds from the cost model, to balance an abstract plan's stages."""
    from octodsl.costs.resolve import cost_table

    device = "H100" if torch.cuda.is_available() else "cpu"
    table = cost_table(model=model, device=device, microbatch_size=spec.microbatch_size,
                       seq_len=spec.seq_len)
    return [lc.f + lc.b + lc.w for lc in table.layers]


def main(argv=None) -> int:
    args = parse_args(argv)
    rank0 = os.environ.get("RANK", "0") == "0"
    from octodsl.deepspeed_ext import PlanLaunchError

    try:
        plan = load_plan(args.schedule)
        config = json.loads(Path(args.deepspeed_config).read_text())
        spec = load_model(args.model or plan.header.model or DEFAULT_MODEL)
        spec = spec.with_shape(config.get("train_micro_batch_size_per_gpu", spec.microbatch_size),
                               args.seq_len or plan.header.seq_len)
        if args.trace:
            config.setdefault("octo", {})["trace"] = True
        torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
        engine = build_engine(args, plan, spec, config)
    except PlanSyntaxError as e:
        if rank0:
            print(f"train.py: error: {e}", file=sys.stderr)
        return 2
    except (PlanLaunchError, SpecError, OSError, ValueError) as e:
        if rank0:
            print(f"train.py: error: {e}", file=sys.stderr)
        return 2

    dp_rank, dp = engine.grid.data_parallel_id, engine.grid.data_parallel_size
    if args.load:
        engine.load_checkpoint(args.load)
    tokens = spec.microbatch_size * spec.seq_len * plan.microbatches * dp
    for _ in range(args.steps):
        step = engine.global_steps
        data = step_data(args.seed, step, dp_rank, plan.microbatches, spec.microbatch_size,
                         spec.seq_len, spec.vocab)
        start = time.perf_counter()
        loss = engine.train_batch(data)
        seconds = time.perf_counter() - start
        if engine.global_rank == 0:
            print(json.dumps({"step": step, "loss": loss.item(), "tokens_per_s": tokens / seconds,
                              "step_seconds": seconds}), flush=True)
    if args.save:
        engine.save_checkpoint(args.save)
    if args.trace:
        if args.stock:
            print("train.py: --trace needs the octodsl executor, not --stock", file=sys.stderr)
        else:
            engine.write_trace(args.trace)
    return 0


if __name__ == "__main__":
    code = main()
    from octodsl.deepspeed_ext import shutdown

    shutdown()  # else a rank may abort in the interpreter's teardown
    sys.exit(code)
