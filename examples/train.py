"""Train a hybrid model with any linted plan, or with stock DeepSpeed for comparison.

    deepspeed --num_gpus 4 examples/train.py --deepspeed_config examples/ds_config.json \\
        --schedule plan.octo [--model nemotron-h-tiny] [--steps N] [--trace measured.json] \\
        [--save DIR] [--load DIR] [--stock] [--task affine|modadd]

Rank 0 prints a start-up line (the model and the micro-batch shape), then one JSON line per step:
{"step", "loss", "tokens_per_s", "step_seconds"}. Without a GPU, DeepSpeed runs on the CPU
(DS_ACCELERATOR=cpu) over gloo. The data are synthetic, deterministic token sequences (each next
token a fixed function of the last one, so the loss falls); the same for every engine, so losses
compare across runs. --task picks the rule (octodsl.synthetic): `affine` over the whole
vocabulary (the default), or `modadd` over 16 ids, which the tiny models learn in ~20 steps.

The micro-batch shape is the plan's, as `octodsl simulate` costs it: the header's
`microbatch_size` and `seq_len`, else the model's defaults. The DeepSpeed config may leave its
batch sizes out (they are set from the plan); sizes it gives must agree. A mistake in the
arguments, the plan, the model, the config or the --save / --load folders is one line on rank 0
(`train.py: error: ...`, exit 2), found before training.

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

from octodsl import limits  # noqa: E402
from octodsl.cli.common import read_text  # noqa: E402
from octodsl.cli.common import integer  # noqa: E402
from octodsl.errors import OctoError  # noqa: E402
from octodsl.lang import PlanSyntaxError, parse_plan  # noqa: E402
from octodsl.models import load_model  # noqa: E402
from octodsl.plan import Plan  # noqa: E402
from octodsl.synthetic import TASKS, get_task, sequences  # noqa: E402
from octodsl.synthetic import check as check_task  # noqa: E402

DEFAULT_MODEL = "nemotron-h-tiny"


class _Parser(argparse.ArgumentParser):
    def error(self, message):
        # every rank parses the same arguments: main prints the mistake once, on rank 0
        raise OctoError(message)


def parse_args(argv=None) -> argparse.Namespace:
    """The arguments; OctoError on a bad one (no exit, no usage text)."""
    p = _Parser(description=__doc__.split("\n\n")[0])
    p.add_argument("--deepspeed_config", required=True, help="DeepSpeed config (JSON)")
    p.add_argument("--schedule", required=True, help="the plan (.octo)")
    p.add_argument("--model", help="built-in model or spec file (default: the plan's model, "
                                   "else nemotron-h-tiny)")
    p.add_argument("--steps", type=integer(0, limits.MAX_TRAIN_STEPS), default=5)
    p.add_argument("--seed", type=integer(0, limits.MAX_SEED), default=1234,
                   help="model init and data seed")
    p.add_argument("--trace", help="write the measured per-op timeline (Chrome trace JSON)")
    p.add_argument("--task", choices=list(TASKS), default="affine",
                   help="the synthetic data (octodsl.synthetic): " + "; ".join(
                       f"{t.name}: {t.description}" for t in TASKS.values()) + " (default affine)")
    p.add_argument("--stock", action="store_true", help="run stock DeepSpeed instead")
    p.add_argument("--save", help="save a checkpoint here after the last step")
    p.add_argument("--load", help="resume from a checkpoint saved with --save")
    p.add_argument("--local_rank", type=int, default=-1, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.stock and (args.trace or args.save or args.load):
        raise OctoError("--trace, --save and --load need the octodsl executor, not --stock")
    return args


def model_spec(plan: Plan, model: str | None):
    """The model the plan trains (`model`, else the plan's, else nemotron-h-tiny) at the plan's
    micro-batch shape: its header's microbatch_size and seq_len, else the spec's defaults; the
    shape `octodsl simulate` costs for the same plan and model (costs.resolve.cost_table)."""
    return load_model(model_name(plan, model)).with_shape(plan.header.microbatch_size,
                                                          plan.header.seq_len)


def model_name(plan: Plan, model: str | None) -> str:
    return model or plan.header.model or DEFAULT_MODEL


def startup_line(plan: Plan, spec) -> str:
    """What the run trains, and where its micro-batch shape comes from."""
    source = "; ".join(
        f"{field} {getattr(spec, field)}: " + ("the plan's" if getattr(plan.header, field) is not None
                                               else "the model's default, the plan states none")
        for field in ("microbatch_size", "seq_len"))
    dp, tp, ep = plan.header.dp, plan.header.tp, plan.header.ep
    return (f"train.py: {spec.name}, {plan.microbatches} micro-batches of {spec.microbatch_size} x "
            f"{spec.seq_len} tokens per step" + (f" on each of {dp} data-parallel copies" if dp > 1 else "")
            + (f", each device a tp group of {tp}" + (" (sequence-parallel)" if plan.header.sp else "")
               if tp > 1 else "")
            + (f", each MoE layer's experts spread over ep {ep} of the copies" if ep > 1 else "")
            + f" ({source})")


def synthetic_batch(seed: int, step: int, dp: int, mb: int, batch: int, seq: int, vocab: int,
                    task: str = "affine"):
    """(ids, labels) for micro-batch `mb` of `step` on data-parallel copy `dp`: sequences that
    follow the task's rule (octodsl.synthetic; affine: x' = (5x + 3) mod vocab) from a random
    start, so the next token is learnable."""
    g = torch.Generator().manual_seed(((seed * 1009 + step) * 1009 + dp) * 1009 + mb)
    return sequences(get_task(task), g, batch, seq, vocab)


def step_data(seed: int, step: int, dp: int, microbatches: int, batch: int, seq: int, vocab: int,
              task: str = "affine"):
    return iter([synthetic_batch(seed, step, dp, m, batch, seq, vocab, task) for m in range(microbatches)])


def stock_parts(plan: Plan) -> list[int] | None:
    """DeepSpeed stage boundaries equal to the plan's partition, if stock can run it (one stage
    per device, stage d on device d)."""
    if plan.num_stages != plan.devices or any(st.abstract for st in plan.stages):
        return None
    if plan.stage_device() != list(range(plan.devices)):
        return None
    return [st.first for st in plan.stages] + [plan.stages[-1].last + 1]


def build_engine(args, plan: Plan, spec):
    """The octodsl engine running the plan, or with --stock DeepSpeed's own. PlanLaunchError,
    before any communication, when the plan, the config and the model do not fit the launch."""
    import deepspeed

    from octodsl.deepspeed_ext import init_distributed, initialize
    from octodsl.deepspeed_ext.config import plan_config, read_config
    from octodsl.deepspeed_ext.partition import default_layer_costs
    from octodsl.deepspeed_ext.module import FixedPartitionModule, parameters_parts
    from octodsl.layers import lm_loss, pipeline_specs

    specs = pipeline_specs(spec)
    if args.stock and plan.header.tp > 1:
        raise OctoError(f"--stock runs DeepSpeed's own PipelineEngine, which has no tensor-parallel "
                        f"layers; the plan's `tp {plan.header.tp}` needs the octodsl executor")
    if args.stock and plan.header.ep > 1:
        raise OctoError(f"--stock runs DeepSpeed's own PipelineEngine, whose layers are not "
                        f"expert-parallel; the plan's `ep {plan.header.ep}` needs the octodsl executor")
    common = dict(loss_fn=lm_loss, seed_layers=True, base_seed=args.seed)
    if not args.stock:
        costs = default_layer_costs(spec) if all(st.abstract for st in plan.stages) else None
        engine, *_ = initialize(specs, args.schedule, config=args.deepspeed_config, layer_costs=costs,
                                microbatch_size=spec.microbatch_size,
                                octo={"trace": True} if args.trace else None, **common)
        return engine
    config = plan_config(read_config(args.deepspeed_config)[0], plan, spec.microbatch_size,
                         plan_name=args.schedule, config_name=args.deepspeed_config)
    init_distributed()
    parts = stock_parts(plan) or parameters_parts(specs, plan.devices)
    module = FixedPartitionModule(specs, parts, num_stages=plan.devices, **common)
    engine, *_ = deepspeed.initialize(model=module, config=config,
                                      model_parameters=[p for p in module.parameters() if p.requires_grad])
    return engine


def check_outputs(engine, args) -> None:
    """Collective, before training: --save's folder and --trace's can be written (CheckpointError
    / OctoError on every rank, naming the rank that cannot)."""
    from octodsl.deepspeed_ext.checkpoint import agree, probe_dir

    if args.save:
        engine.check_save_dir(args.save)
    if args.trace:
        mine = probe_dir(Path(args.trace).resolve().parent) if engine.global_rank == 0 else None
        agree(mine, f"cannot write the trace {args.trace}", OctoError)


def run(args, rank0: bool) -> int:
    try:
        plan = parse_plan(read_text(args.schedule), args.schedule)
    except PlanSyntaxError as e:
        raise OctoError(e.render()) from None
    spec = model_spec(plan, args.model)
    check_task(get_task(args.task), spec.microbatch_size, spec.seq_len, spec.vocab)
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    engine = build_engine(args, plan, spec)
    if rank0:
        print(startup_line(plan, spec), flush=True)

    check_outputs(engine, args)
    if args.load:
        engine.load_checkpoint(args.load)
    dp_rank, dp = engine.grid.data_parallel_id, engine.grid.data_parallel_size
    tokens = spec.microbatch_size * spec.seq_len * plan.microbatches * dp
    for _ in range(args.steps):
        step = engine.global_steps
        data = step_data(args.seed, step, dp_rank, plan.microbatches, spec.microbatch_size,
                         spec.seq_len, spec.vocab, args.task)
        start = time.perf_counter()
        loss = engine.train_batch(data)
        seconds = time.perf_counter() - start
        if engine.global_rank == 0:
            print(json.dumps({"step": step, "loss": loss.item(), "tokens_per_s": tokens / seconds,
                              "step_seconds": seconds}), flush=True)
    if args.save:
        engine.save_checkpoint(args.save)
    if args.trace:
        try:
            engine.write_trace(args.trace)
        except OSError as e:  # rank 0 writes it
            raise OctoError(f"{args.trace}: cannot write the trace: {e.strerror}") from None
    return 0


def main(argv=None) -> int:
    rank0 = os.environ.get("RANK", "0") == "0"
    try:
        return run(parse_args(argv), rank0)
    except OctoError as e:  # the same on every rank (or agreed by all): said once
        if rank0:
            print(f"train.py: error: {e}", file=sys.stderr, flush=True)
        return e.exit_code


if __name__ == "__main__":
    code = main()
    from octodsl.deepspeed_ext import shutdown

    shutdown()  # else a rank may abort in the interpreter's teardown
    sys.exit(code)
