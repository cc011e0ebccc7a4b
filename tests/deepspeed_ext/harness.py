"""Multi-process checks of the DeepSpeed executor, run under the deepspeed launcher by
test_executor.py:

    deepspeed --num_gpus N tests/deepspeed_ext/harness.py CASE OUT.json

Every case trains a CPU-sized hybrid (the Nemotron-H tiny pattern, narrower, tied embeddings)
with stock DeepSpeed and with plans through octodsl.deepspeed_ext, in one process group, and
rank 0 writes what it measured to OUT.json for the test to judge.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import os
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import torch

os.environ.setdefault("DS_ACCELERATOR", "cpu")
ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "examples"))

import deepspeed  # noqa: E402
from deepspeed import comm as dist  # noqa: E402
from deepspeed.pipe import LayerSpec  # noqa: E402
from train import step_data  # noqa: E402

from octodsl.deepspeed_ext import (  # noqa: E402
    init_distributed,
    initialize,
    released_groups,
    shutdown,
)
from octodsl.deepspeed_ext.module import FixedPartitionModule  # noqa: E402
from octodsl.gen import generate  # noqa: E402
from octodsl.lang import parse_plan  # noqa: E402
from octodsl.layers import lm_loss, pipeline_specs, recompute  # noqa: E402
from octodsl.models import parse_model  # noqa: E402
from octodsl.models.builtin import BUILTINS  # noqa: E402
from octodsl.plan import Op, OpKind, Plan, Recompute, Stage  # noqa: E402

SEED, SEQ, M, STEPS = 7, 32, 4, 3


def micro_spec(name: str = "nemotron-h-micro", vocab: int = 512, groups: int = 1):
    d = copy.deepcopy(BUILTINS["nemotron-h-tiny"])
    d.update(name=name, hidden=64, vocab=vocab, seq_len=SEQ, microbatch_size=1, tie_embeddings=True)
    d["mamba2"].update(heads=4, head_dim=32, groups=groups, state=16, chunk=16)
    d["attention"].update(heads=2, kv_heads=1, head_dim=32)
    d["mlp"].update(ffn=128)
    return parse_model(d, "micro")


SPEC = micro_spec()
LAYERS = SPEC.num_layers  # 24


def config(**extra) -> dict:
    c = {
        "train_micro_batch_size_per_gpu": 1,
        "gradient_accumulation_steps": M,
        "optimizer": {"type": "AdamW", "params": {"lr": 1e-3, "weight_decay": 0.01}},
        "gradient_clipping": 0.0,
        "steps_per_print": 10**9,
    }
    c.update(extra)
    return c


def with_partition(plan: Plan, bounds: list[int], dp: int = 1, **header) -> Plan:
    """The plan cut at `bounds`, on `dp` copies, with the other `header` fields given."""
    # strict=False: consecutive pairs, bounds[1:] is one shorter
    stages = [Stage(a, b - 1) for a, b in zip(bounds, bounds[1:], strict=False)]
    update = {"dp": dp, **header}
    return Plan(plan.header.model_copy(update=update), stages, plan.placement, plan.schedule)


def even_mesh_plan(name: str, devices: int, layers: int, dp: int = 1, **header) -> Plan:
    """A generated plan with its `layers` split evenly over its stages (2 per device for V
    plans), on `dp` copies, with the other `header` fields (the mesh) given."""
    plan = generate(name, devices=devices, microbatches=M)
    stages = len(plan.stage_device())
    return with_partition(plan, [layers * i // stages for i in range(stages + 1)], dp, **header)


def with_zero(plan: Plan, zero: int) -> Plan:
    """The plan with header `zero` (what the executor runs: the config follows the plan)."""
    return Plan(
        plan.header.model_copy(update={"zero": zero}), plan.stages, plan.placement, plan.schedule
    )


def even(parts: int) -> list[int]:
    return [LAYERS * i // parts for i in range(parts + 1)]


def octo(
    name: str,
    devices: int,
    bounds: list[int],
    placement: dict[int, list[int]],
    orders: dict[int, list[str]],
) -> Plan:
    """A hand-written plan, through the parser."""
    # strict=False: consecutive pairs, bounds[1:] is one shorter
    part = "\n".join(
        f"  stage {i}: layers {a}..{b - 1}"
        for i, (a, b) in enumerate(zip(bounds, bounds[1:], strict=False))
    )
    place = "\n".join(
        f"  device {d}: stages {', '.join(map(str, ss))}" for d, ss in placement.items()
    )
    sched = "\n".join(f"  device {d} {{ {' '.join(ops)} }}" for d, ops in orders.items())
    text = (
        f'plan "{name}" {{\n  devices {devices}\n  microbatches {M}\n}}\n'
        f"partition {{\n{part}\n}}\nplacement {{\n{place}\n}}\nschedule {{\n{sched}\n}}\n"
    )
    return parse_plan(text, name)


def irregular(
    devices: int, placement: dict[int, list[int]], fused: set[int], reversed_w: bool = False
) -> Plan:
    """Every forward in micro-batch order, then every backward, each device's W delayed to its
    end (stages in `fused` use BW): a projection of one global order, so executable. The
    delayed W run in micro-batch order, or last micro-batch first with `reversed_w`."""
    stages = sum(len(v) for v in placement.values())
    where = {s: d for d, ss in placement.items() for s in ss}
    orders: dict[int, list[str]] = {d: [] for d in placement}
    for m in range(M):
        for s in range(stages):
            orders[where[s]].append(Op(OpKind.F, s, m).label)
    for m in range(M):
        for s in reversed(range(stages)):
            orders[where[s]].append(Op(OpKind.BW if s in fused else OpKind.B, s, m).label)
    for d, ss in placement.items():
        w_order = list(reversed(range(M))) if reversed_w else range(M)
        orders[d] += [Op(OpKind.W, s, m).label for s in ss if s not in fused for m in w_order]
    return octo(f"irregular-p{devices}", devices, even(stages), placement, orders)


class Reentrant(torch.nn.Module):
    """A layer whose weight gradients cannot wait for W: reentrant activation checkpointing
    computes them inside the backward of its output."""

    def __init__(self, spec: LayerSpec):
        super().__init__()
        self.inner = spec.build()

    def forward(self, x):
        return torch.utils.checkpoint.checkpoint(self.inner, x, use_reentrant=True)


def specs(unsplittable: int | None = None) -> list:
    out = pipeline_specs(SPEC)
    if unsplittable is not None:
        out[unsplittable] = LayerSpec(Reentrant, out[unsplittable])
    return out


def build_ours(plan: Plan, cfg: dict, layers: list | None = None):
    engine, *_ = initialize(
        layers or specs(), plan, config=cfg, loss_fn=lm_loss, seed_layers=True, base_seed=SEED
    )
    return engine


def build_stock(parts: list[int], dp: int, cfg: dict, layers: list | None = None):
    from deepspeed.runtime.pipe.topology import PipeDataParallelTopology

    topo = PipeDataParallelTopology(num_pp=len(parts) - 1, num_dp=dp)
    module = FixedPartitionModule(
        layers or specs(), parts, topology=topo, loss_fn=lm_loss, seed_layers=True, base_seed=SEED
    )
    engine, *_ = deepspeed.initialize(
        model=module,
        config=cfg,
        model_parameters=[p for p in module.parameters() if p.requires_grad],
    )
    return engine


def train(engine, steps: int = STEPS, first: int = 0) -> list[float]:
    dp_rank = engine.grid.data_parallel_id
    losses = []
    for step in range(first, first + steps):
        data = step_data(SEED, step, dp_rank, M, 1, SEQ, SPEC.vocab)
        losses.append(engine.train_batch(data).item())
    return losses


def evaluate(engine) -> float:
    data = step_data(SEED, 10**6, engine.grid.data_parallel_id, M, 1, SEQ, SPEC.vocab)
    return engine.eval_batch(data).item()


def weights(engine) -> dict[int, dict[str, torch.Tensor]]:
    """Every layer's parameters (fp32 masters where the optimizer keeps them), on rank 0."""
    module = engine.module
    stages = getattr(module, "stage_funcs", None) or {0: module.forward_funcs}
    starts = (
        {s: module.stage_ranges[s].start for s in stages}
        if hasattr(module, "stage_ranges")
        else {0: module._local_start}
    )
    tied = {id(m): module.tied_weight_attrs[k] for k, m in module.tied_modules.items()}
    local = {}
    for s, funcs in stages.items():
        for i, f in enumerate(funcs):
            f = f.args[0] if hasattr(f, "args") else f
            # a tied module holds some parameters only its other use trains (the head's norm):
            # the embedding's copy on another rank keeps just the tied weight in sync
            keep = tied.get(id(f)) if i == 0 and starts[s] == 0 else None
            local[starts[s] + i] = {
                k: v.detach().float().cpu().clone()
                for k, v in f.state_dict().items()
                if keep is None or k in keep
            }
    everything = [None] * dist.get_world_size()
    torch.distributed.all_gather_object(everything, local)
    merged: dict[int, dict] = {}
    for part in everything:
        merged.update(part)
    return merged


def max_diff(a: dict, b: dict) -> float:
    assert a.keys() == b.keys(), (sorted(a), sorted(b))
    return max((x[k] - y[k]).abs().max().item() for i in a for x, y in [(a[i], b[i])] for k in x)


def compare_runs(name: str, ref: dict, mine: dict, *also: str) -> dict:
    """Two runs' losses (and the largest relative difference) and first-step gradient norms,
    with each run's fields `also`."""
    return {
        "plan": name,
        "losses": mine["losses"],
        "ref_losses": ref["losses"],
        "loss_rel": max(
            abs(a - b) / abs(b) for a, b in zip(mine["losses"], ref["losses"], strict=True)
        ),
        "norm": mine["norm"],
        "ref_norm": ref["norm"],
        **{k: mine[k] for k in also},
        **{f"ref_{k}": ref[k] for k in also},
    }


def compare(name: str, engine, ref_losses, ref_weights, ref_eval, steps=STEPS) -> dict:
    start = time.time()
    losses = train(engine, steps)
    out = {
        "plan": name,
        "losses": losses,
        "ref_losses": ref_losses,
        "loss_diff": max(abs(a - b) for a, b in zip(losses, ref_losses, strict=True)),
        "weight_diff": max_diff(weights(engine), ref_weights),
        "exact": losses == ref_losses,
        "seconds": time.time() - start,
        "zero": engine.zero_optimization_stage(),
        # ZeRO's optimizer: whether it reduce-scattered the gradients (None without ZeRO)
        "reduce_scatter": getattr(engine.optimizer, "reduce_scatter", None),
    }
    if ref_eval is not None:
        out["eval_diff"] = abs(evaluate(engine) - ref_eval)
    return out


def case_plans(out_dir: Path) -> dict:
    """2 processes: every classic plan and an irregular one against stock 1F1B, fp32; bf16,
    ZeRO-1 and clipping; a layer that cannot split its backward; a checkpoint round trip; a
    measured trace."""
    results = []
    stock = build_stock(even(2), 1, config())
    ref = train(stock)
    ref_w, ref_eval = weights(stock), evaluate(stock)
    plans = {
        name: with_partition(generate(name, devices=2, microbatches=M), even(2))
        for name in ("1f1b", "gpipe", "zb-h1", "zb-h2")
    }
    plans.update(
        {
            name: with_partition(generate(name, devices=2, microbatches=M), even(4))
            for name in ("interleaved", "zb-v", "dualpipev")
        }
    )
    plans["irregular"] = irregular(2, {0: [0, 1, 4], 1: [2, 3]}, fused={2})
    plans["irregular/reversed-w"] = irregular(
        2, {0: [0, 1, 4], 1: [2, 3]}, fused={2}, reversed_w=True
    )
    threads = []
    for name, plan in plans.items():
        with released_groups():
            results.append(compare(name, build_ours(plan, config()), ref, ref_w, ref_eval))
        threads.append(len(os.listdir("/proc/self/task")))

    # ZeRO-1 comes from the plan's header `zero 1`: "zero1" leaves it out of our config,
    # "bf16-zero1" states it there too (agreeing); stock gets it from its config
    bf16, zero1 = {"bf16": {"enabled": True}}, {"zero_optimization": {"stage": 1}}
    for label, extra, ours in (
        ("bf16", bf16, bf16),
        ("zero1", zero1, {}),
        ("bf16-zero1", {**bf16, **zero1}, {**bf16, **zero1}),
        ("clip", {"gradient_clipping": 1.0}, {"gradient_clipping": 1.0}),
    ):
        stock = build_stock(even(2), 1, config(**extra))
        ref = train(stock)
        ref_w = weights(stock)
        zero = extra.get("zero_optimization", {}).get("stage", 0)
        for name in ("1f1b", "zb-h1", "zb-v"):
            results.append(
                compare(
                    f"{name}/{label}",
                    build_ours(with_zero(plans[name], zero), config(**ours)),
                    ref,
                    ref_w,
                    None,
                )
            )
    layers = specs(unsplittable=5)
    stock = build_stock(even(2), 1, config(), layers)
    ref, ref_w = train(stock), weights(stock)
    results.append(
        compare(
            "zb-h1/unsplittable", build_ours(plans["zb-h1"], config(), layers), ref, ref_w, None
        )
    )

    traced = build_ours(plans["zb-v"], {**config(), "octo": {"trace": True}})
    train(traced, 1)
    traced.write_trace(str(out_dir / "trace.json"))
    return {
        "results": results,
        "recompute": recompute_runs(plans),
        "checkpoint": checkpoint_round_trip(plans["zb-v"]),
        "trace": str(out_dir / "trace.json"),
        "trace_bounds": even(4),
        "threads": threads,
    }


RECOMPUTED = {
    "zb-h1": ("full selective", "selective full"),
    "zb-v": ("selective full selective full",),
    "1f1b": ("full selective",),
}
"""Per plan (zb-h1 and zb-v split B and W, 1f1b runs fused BW), what its stages recompute."""


def with_recompute(plan: Plan, modes: str) -> Plan:
    stages = [
        dataclasses.replace(st, recompute=Recompute(m))
        for st, m in zip(plan.stages, modes.split(), strict=True)
    ]
    return Plan(plan.header, stages, plan.placement, plan.schedule)


def recompute_runs(plans: dict[str, Plan]) -> list[dict]:
    """Each plan of RECOMPUTED with recompute against the same plan without it, counting
    the stage forwards each rank runs with and without grad, and the recomputations of what
    selective recompute dropped."""
    out = []
    for name, variants in RECOMPUTED.items():
        ref_engine = build_ours(plans[name], config())
        ref, ref_w, ref_eval = train(ref_engine), weights(ref_engine), evaluate(ref_engine)
        for modes in variants:
            plan = with_recompute(plans[name], modes)
            engine = build_ours(plan, config())
            with counting(engine) as counts:
                r = compare(f"{name}/{modes.replace(' ', '-')}", engine, ref, ref_w, None)
            r["eval_diff"] = abs(evaluate(engine) - ref_eval)
            gathered: list = [None] * dist.get_world_size()
            torch.distributed.all_gather_object(gathered, counts)
            r["forwards"] = {
                f"{s} {'grad' if g else 'no_grad'}": n
                for c in gathered
                for (s, g), n in c["forwards"].items()
            }
            r["recomputed_regions"] = [c["regions"] for c in gathered]
            r["modes"], r["stage_device"] = modes.split(), plan.stage_device()
            out.append(r)
    return out


class counting:
    """While training: stage forwards by (stage, grad enabled), and regions of
    `octodsl.layers.recompute` run again, on this rank."""

    def __init__(self, engine):
        self.engine = engine
        self.counts: dict = {"forwards": Counter(), "regions": 0}

    def __enter__(self):
        module, counts = self.engine.module, self.counts
        run, materialize = module.run_stage, recompute._Region.materialize

        def run_stage(stage, x, segmented):
            counts["forwards"][(stage, torch.is_grad_enabled())] += 1
            return run(stage, x, segmented)

        def counted(region):
            counts["regions"] += region.outputs is None
            materialize(region)

        module.run_stage = run_stage
        recompute._Region.materialize = counted
        self._restore = lambda: (
            delattr(module, "run_stage"),
            setattr(recompute._Region, "materialize", materialize),
        )
        return counts

    def __exit__(self, *exc):
        self._restore()
        return False


TORCH_ADAMW = {"type": "AdamW", "params": {"lr": 1e-3, "weight_decay": 0.01, "torch_adam": True}}
"""torch.optim.AdamW: its bias corrections come from the step count in the optimizer state.
DeepSpeed's CPU FusedAdam instead keeps beta ** t in a process-wide C++ object, multiplied once
per step (csrc/includes/cpu_adam.h, IncrementStep) but recomputed with pow() when a step
number arrives out of sequence, as a resumed run's does: in float32, 0.999 * 0.999 * 0.999 is
one ulp off pow(0.999, 3), so a resumed run's update differs from the continued run's with
that optimizer (stock DeepSpeed's too); a checkpoint cannot hold what it keeps."""


def checkpoint_round_trip(plan: Plan) -> dict:
    engine = build_ours(plan, config(optimizer=TORCH_ADAMW))
    first = train(engine, 2)
    with tempfile.TemporaryDirectory() if dist.get_rank() == 0 else _nothing() as tmp:
        box = [tmp]
        torch.distributed.broadcast_object_list(box, src=0)
        engine.save_checkpoint(box[0], tag="t")
        after = train(engine, 2, first=2)
        again = build_ours(plan, config(optimizer=TORCH_ADAMW))
        again.load_checkpoint(box[0], tag="t")
        resumed = train(again, 2, first=2)
        dist.barrier()
    return {"before": first, "continued": after, "resumed": resumed}


class _nothing:
    def __enter__(self):
        return None

    def __exit__(self, *exc):
        return False


def case_dp(out_dir: Path) -> dict:
    """4 processes: data parallelism 2 x pipelines of 2 (with ZeRO-1 too), and a 4-device
    irregular plan whose messages skip ranks, each against stock."""
    results = []
    stock = build_stock(even(2), 2, config())
    ref, ref_w = train(stock), weights(stock)
    for name in ("1f1b", "zb-h1"):
        plan = with_partition(generate(name, devices=2, microbatches=M), even(2), dp=2)
        results.append(compare(f"{name}/dp2", build_ours(plan, config()), ref, ref_w, None))
    plan = with_partition(generate("zb-v", devices=2, microbatches=M), even(4), dp=2)
    results.append(compare("zb-v/dp2", build_ours(plan, config()), ref, ref_w, None))

    # ZeRO-1 sharding the optimizer state over the two copies, from the plan's header
    stock = build_stock(even(2), 2, config(zero_optimization={"stage": 1}))
    ref, ref_w = train(stock), weights(stock)
    plan = with_partition(generate("zb-h1", devices=2, microbatches=M), even(2), dp=2)
    results.append(
        compare("zb-h1/dp2/zero1", build_ours(with_zero(plan, 1), config()), ref, ref_w, None)
    )
    # ... with the gradients all-reduced instead (the header's `reduce_scatter false`)
    stock = build_stock(even(2), 2, config(zero_optimization={"stage": 1, "reduce_scatter": False}))
    ref, ref_w = train(stock), weights(stock)
    allreduce = with_zero(plan, 1)
    allreduce = Plan(
        allreduce.header.model_copy(update={"reduce_scatter": False}),
        allreduce.stages,
        allreduce.placement,
        allreduce.schedule,
    )
    results.append(
        compare("zb-h1/dp2/zero1/allreduce", build_ours(allreduce, config()), ref, ref_w, None)
    )

    stock = build_stock(even(4), 1, config())
    ref, ref_w = train(stock), weights(stock)
    plan = irregular(4, {0: [0, 5], 1: [3], 2: [1, 4], 3: [2]}, fused={3})
    results.append(compare("irregular-p4", build_ours(plan, config()), ref, ref_w, None))
    return {"results": results}


def case_stall(out_dir: Path) -> dict:
    """The loss rank stalls in its data loader: the other rank's watchdog must end the job."""
    plan = with_partition(generate("1f1b", devices=2, microbatches=M), even(2))
    engine = build_ours(plan, {**config(), "octo": {"timeout": 5}})
    data = step_data(SEED, 0, 0, M, 1, SEQ, SPEC.vocab)
    if dist.get_rank() == 1:
        data = _stalling(data)
    engine.train_batch(data)
    return {"finished": True}


def _stalling(it):
    yield next(it)
    time.sleep(120)
    yield from it


def case_single(out_dir: Path) -> dict:
    """1 process (tp 1 x pp 1): the plan's executor against stock DeepSpeed on one stage."""
    stock = build_stock(even(1), 1, config())
    ref, ref_w = train(stock), weights(stock)
    plan = with_partition(generate("1f1b", devices=1, microbatches=M), even(1))
    return {"results": [compare("1f1b/pp1", build_ours(plan, config()), ref, ref_w, None)]}


CASES = {"plans": case_plans, "dp": case_dp, "stall": case_stall, "single": case_single}


def main(cases: dict = CASES) -> None:
    """Run the case the command line names (CASE OUT.json); rank 0 writes its result."""
    case, out = [a for a in sys.argv[1:] if not a.startswith("--local_rank")]
    torch.set_num_threads(1)
    # benchmarks/gpu_check.sh runs the cases on GPUs over NCCL, a GPU per rank
    backend = os.environ.get("OCTO_TEST_BACKEND", "gloo")
    if backend == "nccl":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    init_distributed(backend)
    result = cases[case](Path(out).parent)
    if dist.get_rank() == 0:
        Path(out).write_text(
            json.dumps(
                {
                    **result,
                    "case": case,
                    "world": dist.get_world_size(),
                    "backend": torch.distributed.get_backend(),
                },
                indent=1,
            )
        )
    shutdown()


if __name__ == "__main__":
    main()
