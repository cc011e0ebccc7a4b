"""Multi-process checks of expert parallelism in the executor, run under the deepspeed launcher by
test_expert_parallel.py:

    deepspeed --num_gpus 4 tests/deepspeed_ext/ep_cases.py CASE OUT.json

Each run trains qwen3-next-tiny (gated DeltaNet, gated attention, MoE layers of 16 experts, top-4,
with a shared expert) from the same seeds on the same data as its ep 1 reference (every
data-parallel copy on its own data, so the ep all-to-alls carry different tokens), and rank 0
writes the losses of both and the gradient norm of the first step to OUT.json.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import os  # noqa: E402
import signal  # noqa: E402
import threading  # noqa: E402
import time  # noqa: E402
from collections import Counter  # noqa: E402
from contextlib import nullcontext  # noqa: E402

import torch  # noqa: E402
from harness import SEED, M, compare_runs, config, even_mesh_plan, main  # noqa: E402
from train import step_data  # noqa: E402

from octodsl.deepspeed_ext import initialize, released_groups  # noqa: E402
from octodsl.deepspeed_ext.mesh import grad_norm  # noqa: E402
from octodsl.layers import expert_parallel as epl  # noqa: E402
from octodsl.layers import lm_loss, pipeline_specs  # noqa: E402
from octodsl.layers.moe import MoE  # noqa: E402
from octodsl.models import load_model  # noqa: E402
from octodsl.plan import Plan, Slot  # noqa: E402
from octodsl.trace import COMPUTE  # noqa: E402

SEQ = 64  # a whole chunk of the DeltaNet layers
SPEC = load_model("qwen3-next-tiny").model_copy(update={"seq_len": SEQ, "microbatch_size": 1})


def mesh_plan(name: str, devices: int, dp: int, ep: int = 1, tp: int = 1) -> Plan:
    """A generated plan with the layers split evenly over its stages, on dp copies with ep."""
    return even_mesh_plan(name, devices, SPEC.num_layers, dp, ep=ep, tp=tp)


def build(plan: Plan, **extra):
    engine, *_ = initialize(
        pipeline_specs(SPEC),
        plan,
        config=config(**extra),
        loss_fn=lm_loss,
        seed_layers=True,
        base_seed=SEED,
    )
    return engine


def train(engine, first: int, steps: int) -> list[float]:
    """Losses of `steps` steps from step `first`, each data-parallel copy on its own data."""
    dp = engine.grid.data_parallel_id
    return [
        engine.train_batch(step_data(SEED, s, dp, M, 1, SEQ, SPEC.vocab)).item()
        for s in range(first, first + steps)
    ]


SGD = {"type": "SGD", "params": {"lr": 0.05}}
"""The optimizer of the runs compared across ep sizes (torch.optim.SGD). Adam's first steps are
lr x sign(gradient), so a gradient that is near zero but for rounding takes a full step either
way, and the rounding differs with the GEMM kernels' order of summation: ep 1 and ep 2 sum an
expert's rows in differently shaped matmuls. Under AdamW the losses drifted apart by a few 1e-6
over three steps on an AMD EPYC and by 1.3e-5 to 5.5e-5 on an Intel Xeon, as far as two ep 1
runs of different plans drift from each other: a measure of the CPU, not of the ep code. SGD's
step is linear in the gradient, so the losses differ by what the gradients do."""


def run(plan: Plan, steps: int = 3, watch=None, **extra) -> dict:
    """The losses, the gradient norm of each step (mesh.grad_norm before clipping and the
    optimizer step, routed experts summed over the ep group), and each rank's local expert
    counts; with `watch`, the steps run inside `watch(engine)`, whose `report()` joins these.
    The optimizer is `SGD` unless `extra` names one."""
    with released_groups():
        engine = build(plan, **{"optimizer": SGD, **extra})
        norms: list[float] = []
        take_step = engine._take_model_step

        def recorded(*args, **kwargs):  # the gradients are reduced, not yet clipped or applied
            params = [p for p in engine.module.parameters() if p.grad is not None]
            tied = engine._tied_copies()
            norms.append(
                grad_norm(params, engine.grid, engine.tp, tied, engine.device, engine.ep).item()
            )
            return take_step(*args, **kwargs)

        engine._take_model_step = recorded
        with watch(engine) if watch else nullcontext() as seen:
            losses = train(engine, 0, steps)
        local = sorted({m.w_in.shape[0] for m in engine.module.modules() if isinstance(m, MoE)})
        everyone: list = [None] * torch.distributed.get_world_size()
        torch.distributed.all_gather_object(everyone, local)
        seen_all = seen.report() if seen is not None else {}
    return {
        "losses": losses,
        "norm": norms[0],
        "norms": norms,
        "local_experts": everyone,
        **seen_all,
    }


def compare(name: str, ref: dict, mine: dict) -> dict:
    return compare_runs(name, ref, mine, "local_experts")


def case_ep(out_dir: Path) -> dict:
    """4 processes: pp 2 x dp 2 at ep 2 against ep 1 (zb-h1: B and W split); pp 1 x dp 4 at ep 2
    and ep 4 against ep 1, with gradient clipping that cuts every step (DeepSpeed's own at ep 1,
    the engine's at ep > 1); tp 2 x dp 2 at ep 2 against ep 1."""
    results = []
    ref = run(mesh_plan("zb-h1", 2, 2))
    results.append(compare("zb-h1/pp2/dp2/ep2", ref, run(mesh_plan("zb-h1", 2, 2, ep=2))))
    clip = {"gradient_clipping": 0.5}
    ref = run(mesh_plan("1f1b", 1, 4), **clip)
    for ep in (2, 4):
        mine = run(mesh_plan("1f1b", 1, 4, ep=ep), **clip)
        results.append(compare(f"1f1b/pp1/dp4/ep{ep}/clip", ref, mine))
    # tp 2 x dp 2 at ep 2 (each local expert split over the tp group too) against ep 1
    ref = run(mesh_plan("1f1b", 1, 2, tp=2))
    results.append(compare("1f1b/tp2/dp2/ep2", ref, run(mesh_plan("1f1b", 1, 2, ep=2, tp=2))))
    return {"results": results}


def case_checkpoint(out_dir: Path) -> dict:
    """4 processes, pp 2 x dp 2 at ep 2: saved after 2 steps, a new engine loads and trains 2
    more as the first continued; the same plan at ep 1 refuses the checkpoint."""
    from harness import TORCH_ADAMW
    from launch_cases import error_of

    folder = [str(out_dir / "ck") if torch.distributed.get_rank() == 0 else None]
    torch.distributed.broadcast_object_list(folder, src=0)
    plan = mesh_plan("zb-h1", 2, 2, ep=2)
    with released_groups():
        engine = build(plan, optimizer=TORCH_ADAMW)
        train(engine, 0, 2)
        engine.save_checkpoint(folder[0], tag="t")
        continued = train(engine, 2, 2)
    with released_groups():
        again = build(plan, optimizer=TORCH_ADAMW)
        again.load_checkpoint(folder[0], tag="t")
        resumed = train(again, 2, 2)
    with released_groups():
        refused = error_of(
            lambda: build(mesh_plan("zb-h1", 2, 2), optimizer=TORCH_ADAMW).load_checkpoint(
                folder[0], tag="t"
            )
        )
    files = sorted(p.name for p in (Path(folder[0]) / "t").iterdir())
    return {"continued": continued, "resumed": resumed, "other": refused, "files": files}


def case_killed(out_dir: Path) -> dict:
    """2 processes, dp 2 at ep 2: rank 1 is killed between two micro-batches of a step, so rank
    0 waits in the next forward's expert all-to-all; its watchdog must name the op."""
    from launch_cases import _dying

    engine = build(mesh_plan("1f1b", 1, 2, ep=2))
    data = step_data(SEED, 0, engine.grid.data_parallel_id, M, 1, SEQ, SPEC.vocab)
    if torch.distributed.get_rank() == 1:
        data = _dying(data)
    engine.train_batch(data)
    return {"finished": True}


def ungrouped(plan: Plan) -> Plan:
    """The plan with each overlap group's ops as consecutive slots: what a group run in turn
    does."""
    schedule = [[Slot((op,)) for slot in slots for op in slot.ops] for slots in plan.schedule]
    return Plan(plan.header, plan.stages, plan.placement, schedule)


class rendezvous:
    """While training: each op of an overlap group that runs at once waits, as it starts, until
    the other op of its group has started too (a group run in turn breaks the barrier, and the
    run fails); and every expert all-to-all is noted with its thread and whether it went on the
    lane's group."""

    def __init__(self, engine):
        self.engine = engine
        groups = [slot.ops for slot in engine.plan.schedule[engine.stage_id] if slot.overlapped]
        # one barrier per group, shared by its two ops
        self.barrier = {
            op: barrier
            for ops in groups
            for barrier in [threading.Barrier(2, timeout=120)]
            for op in ops
        }
        self.issued: Counter = Counter()

    def __enter__(self):
        engine, barrier, issued = self.engine, self.barrier, self.issued
        lane_group = engine._lane.group
        forward, backward, issue = engine._forward, engine._backward, epl.dist.all_to_all_single

        def met(run):
            def run_when_met(op):
                if op in barrier:
                    barrier[op].wait()
                return run(op)

            return run_when_met

        def noted(*args, group=None, **kwargs):
            lane = threading.current_thread().name.startswith("octodsl-lane")
            issued[
                f"{'lane' if lane else 'rank'} thread, {'lane' if group is lane_group else 'layer'} group"
            ] += 1
            return issue(*args, group=group, **kwargs)

        engine._forward, engine._backward = met(forward), met(backward)
        epl.dist.all_to_all_single = noted
        self._restore = lambda: (
            delattr(engine, "_forward"),
            delattr(engine, "_backward"),
            setattr(epl.dist, "all_to_all_single", issue),
        )
        return self

    def __exit__(self, *exc):
        self._restore()
        return False

    def report(self) -> dict:
        """Every rank's op spans, all-to-alls by thread and group, and RunGroup count (collective)."""
        engine = self.engine
        spans = [
            (s.name, s.start, s.end)
            for s in engine.trace_spans()
            if s.tid == COMPUTE and "mb" in s.args
        ]
        steps = [type(c).__name__ for slot in engine._train_sched.steps() for c in slot]
        mine = {
            "device": engine.stage_id,
            "spans": spans,
            "issued": dict(self.issued),
            "run_groups": steps.count("RunGroup"),
        }
        everyone: list = [None] * torch.distributed.get_world_size()
        torch.distributed.all_gather_object(everyone, mine)
        return {"ranks": everyone}


def case_overlap(out_dir: Path) -> dict:
    """4 processes, pp 2 x dp 2: dualpipev (overlap groups of a forward and a fused backward)
    at ep 2, its groups run at once (traced, each group's ops meeting at a barrier), against the
    same plan with every group's ops in turn at ep 2 and against ep 1."""
    grouped = mesh_plan("dualpipev", 2, 2, ep=2)
    ref = run(mesh_plan("dualpipev", 2, 2))
    in_turn = run(ungrouped(grouped))
    at_once = run(grouped, watch=rendezvous, octo={"trace": True})
    groups = {
        d: [[str(op) for op in slot.ops] for slot in slots if slot.overlapped]
        for d, slots in enumerate(grouped.schedule)
    }
    return {
        # the rows benchmarks/gpu_check.py tabulates: against ep 1, and against the groups in turn
        "results": [
            compare("dualpipev/pp2/dp2/ep2/at-once vs ep 1", ref, at_once),
            {
                **compare("dualpipev/pp2/dp2/ep2/at-once vs in turn", in_turn, at_once),
                "exact": at_once["losses"] == in_turn["losses"],
                "norm_exact": at_once["norms"] == in_turn["norms"],
            },
        ],
        "groups": groups,
        "ranks": at_once["ranks"],
    }


def case_overlap_killed(out_dir: Path) -> dict:
    """4 processes, dualpipev at pp 2 x dp 2, ep 2: device 0's second data-parallel copy is
    killed as it draws micro-batch 3, the forward of device 0's first overlap group
    (F0:3 & BW3:1), so device 0's first copy waits in that group's all-to-alls: its watchdog
    must name the op and the group."""
    engine = build(mesh_plan("dualpipev", 2, 2, ep=2))
    data = step_data(SEED, 0, engine.grid.data_parallel_id, M, 1, SEQ, SPEC.vocab)
    if torch.distributed.get_rank() == 1:  # device 0, data-parallel copy 1
        data = _dying_after(data, 3)
    engine.train_batch(data)
    return {"finished": True}


def _dying_after(it, n: int):
    for _ in range(n):
        yield next(it)
    time.sleep(1)  # rank 0 is waiting for this rank by now
    os.kill(os.getpid(), signal.SIGKILL)


CASES = {
    "ep": case_ep,
    "checkpoint": case_checkpoint,
    "killed": case_killed,
    "overlap": case_overlap,
    "overlap_killed": case_overlap_killed,
}


if __name__ == "__main__":
    main(CASES)
