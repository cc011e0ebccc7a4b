"""Multi-process checks of tensor parallelism in the executor, run under the deepspeed launcher by
test_tensor_parallel.py:

    deepspeed --num_gpus 4 tests/deepspeed_ext/tp_cases.py CASE OUT.json

Each run trains the same model from the same seeds on the same data as its tp 1 reference, and
rank 0 writes the losses of both (and the gradient norm of the first step) to OUT.json. The
model is the hybrid harness.py trains (`tp_spec`).
"""

from __future__ import annotations

import copy
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch  # noqa: E402
from harness import SEED, SEQ, M, compare_runs, config, even_mesh_plan, main, micro_spec  # noqa: E402
from train import step_data  # noqa: E402

from octodsl.deepspeed_ext import initialize, released_groups  # noqa: E402
from octodsl.deepspeed_ext.mesh import grad_norm  # noqa: E402
from octodsl.layers import lm_loss, pipeline_specs  # noqa: E402
from octodsl.models import parse_model  # noqa: E402
from octodsl.models.builtin import BUILTINS  # noqa: E402
from octodsl.plan import Plan  # noqa: E402


def tp_spec():
    """harness.py's CPU-sized Nemotron-H (Mamba2 with 4 heads in 2 groups; attention with 2
    heads on 1 KV head, so the KV head is replicated on both tp ranks; MLPs), tied embeddings,
    with a vocabulary that tp 2 pads."""
    return micro_spec("nemotron-h-micro-tp", vocab=509, groups=2)


def jamba_spec():
    """jamba-tiny, narrower: 8 sub-layers (Mamba1 with inner norms, attention, MLPs, MoE with a
    shared expert and top-2 of 4 experts)."""
    d = copy.deepcopy(BUILTINS["jamba-tiny"])
    d.update(
        name="jamba-micro-tp",
        hidden=64,
        vocab=509,
        seq_len=SEQ,
        microbatch_size=1,
        pattern=d["pattern"][:10],
    )
    d["mamba1"].update(inner=128, state=8, dt_rank=8)
    d["attention"].update(heads=2, kv_heads=2, head_dim=32)
    d["mlp"].update(ffn=128)
    d["moe"].update(experts=4, expert_ffn=64, shared_ffn=64)
    return parse_model(d, "jamba-micro-tp")


SPEC = tp_spec()


def mesh_plan(
    name: str, devices: int, tp: int = 1, dp: int = 1, sp: bool | None = None, spec=SPEC
) -> Plan:
    """A generated plan (2 stages per device for V plans) with layers split evenly, on the mesh."""
    return even_mesh_plan(name, devices, spec.num_layers, dp, tp=tp, sequence_parallel=sp)


def run(plan: Plan, same_data: bool, steps: int = 3, spec=SPEC, **extra) -> dict:
    """Train `plan` (every data-parallel copy on copy 0's data with `same_data`, which makes dp 2
    train as dp 1); the losses and the first step's gradient norm (mesh.grad_norm, taken just
    before the optimizer step)."""
    with released_groups():
        engine, *_ = initialize(
            pipeline_specs(spec),
            plan,
            config=config(**extra),
            loss_fn=lm_loss,
            seed_layers=True,
            base_seed=SEED,
        )
        norms: list[float] = []
        step = engine.optimizer.step

        def recorded(*args, **kwargs):  # the gradients are reduced and not yet applied
            params = [p for p in engine.module.parameters() if p.grad is not None]
            norms.append(
                grad_norm(
                    params, engine.grid, engine.tp, engine._tied_copies(), engine.device
                ).item()
            )
            return step(*args, **kwargs)

        engine.optimizer.step = recorded
        dp_rank = 0 if same_data else engine.grid.data_parallel_id
        losses = [
            engine.train_batch(step_data(SEED, s, dp_rank, M, 1, SEQ, spec.vocab)).item()
            for s in range(steps)
        ]
    return {"losses": losses, "norm": norms[0]}


def case_tp(out_dir: Path) -> dict:
    """4 processes: tp 2 x pp 2 against tp 1 x pp 2 (run as dp 2 on the same data) for 1f1b,
    zb-h1 and zb-v, sp on and (1f1b) off; tp 2 x pp 1 x dp 2 against tp 1 x pp 2 x dp 2; and
    with gradient clipping."""
    results = []
    for name in ("1f1b", "zb-h1", "zb-v"):
        ref = run(mesh_plan(name, 2, dp=2), same_data=True)
        results.append(compare_runs(name, ref, run(mesh_plan(name, 2, tp=2), same_data=True)))
        if name == "1f1b":
            results.append(
                compare_runs("1f1b/nosp", ref, run(mesh_plan(name, 2, tp=2, sp=False), True))
            )
    ref = run(mesh_plan("1f1b", 2, dp=2), same_data=False)
    results.append(compare_runs("1f1b/pp1/dp2", ref, run(mesh_plan("1f1b", 1, tp=2, dp=2), False)))
    # gradient clipping that cuts every step (the norm is above 1): DeepSpeed's own clipping on
    # one stage (dp 4 on the same data) against the engine's at tp 2 (dp 2 on the same data)
    clip = {"gradient_clipping": 0.5}
    ref = run(mesh_plan("1f1b", 1, dp=4), same_data=True, **clip)
    results.append(
        compare_runs("1f1b/pp1/clip", ref, run(mesh_plan("1f1b", 1, tp=2, dp=2), True, **clip))
    )
    jamba = jamba_spec()
    ref = run(mesh_plan("zb-h1", 2, dp=2, spec=jamba), True, spec=jamba)
    results.append(
        compare_runs(
            "jamba/zb-h1", ref, run(mesh_plan("zb-h1", 2, tp=2, spec=jamba), True, spec=jamba)
        )
    )
    return {"results": results}


def case_refusals(out_dir: Path) -> dict:
    """2 processes: launches that do not fit, refused on every rank before any communication."""
    from launch_cases import error_of

    odd = SPEC.model_copy(
        update={
            "layers": [
                layer.model_copy(update={"ffn": 127}) if layer.kind == "mlp" else layer
                for layer in SPEC.layers
            ]
        }
    )
    found = {
        "world": error_of(
            lambda: initialize(
                pipeline_specs(SPEC), mesh_plan("1f1b", 2, tp=2), config=config(), loss_fn=lm_loss
            )
        ),
        "split": error_of(
            lambda: initialize(
                pipeline_specs(odd), mesh_plan("1f1b", 1, tp=2), config=config(), loss_fn=lm_loss
            )
        ),
    }
    everyone: list = [None] * torch.distributed.get_world_size()
    torch.distributed.all_gather_object(everyone, found)
    return {"ranks": everyone}


def case_checkpoint(out_dir: Path) -> dict:
    """4 processes: a plan saves after 2 steps; a new engine loads and trains 2 more as the first
    one continued (zb-h1: the embedding and the LM head, tied, on different ranks); the plan
    with the other tp refuses the checkpoint. At tp 2 x pp 2, and at tp 1 x pp 2 x dp 2."""
    return {
        f"tp{tp}": round_trip(
            mesh_plan("zb-h1", 2, tp=tp, dp=3 - tp),
            mesh_plan("zb-h1", 2, tp=3 - tp, dp=tp),
            out_dir / f"ck{tp}",
        )
        for tp in (2, 1)
    }


def round_trip(plan: Plan, other: Plan, where: Path) -> dict:
    from harness import TORCH_ADAMW
    from launch_cases import error_of

    folder = [str(where) if torch.distributed.get_rank() == 0 else None]
    torch.distributed.broadcast_object_list(folder, src=0)

    def build(p: Plan):
        engine, *_ = initialize(
            pipeline_specs(SPEC),
            p,
            config=config(optimizer=TORCH_ADAMW),
            loss_fn=lm_loss,
            seed_layers=True,
            base_seed=SEED,
        )
        return engine

    def steps(engine, first: int) -> list[float]:
        return [
            engine.train_batch(step_data(SEED, s, 0, M, 1, SEQ, SPEC.vocab)).item()
            for s in range(first, first + 2)
        ]

    with released_groups():
        engine = build(plan)
        steps(engine, 0)
        engine.save_checkpoint(folder[0], tag="t")
        continued = steps(engine, 2)
    with released_groups():
        again = build(plan)
        again.load_checkpoint(folder[0], tag="t")
        resumed = steps(again, 2)
    with released_groups():
        refused = error_of(lambda: build(other).load_checkpoint(folder[0], tag="t"))
    return {"continued": continued, "resumed": resumed, "other": refused}


CASES = {"tp": case_tp, "refusals": case_refusals, "checkpoint": case_checkpoint}


if __name__ == "__main__":
    main(CASES)
