"""What activation recomputation saves: each rank's measured peak memory on the executor, with
and without recompute, against the simulator's prediction for the same plans.

    .venv/bin/python benchmarks/recompute_memory.py [--profile PROFILE.json] [-o benchmarks/recompute_memory.md]

The model is the tiny hybrid, nemotron-h-tiny (24 layers: Mamba2, MLP and attention; 2 x 256
tokens per micro-batch, fp32), trained by the plan zb-h1 on 2 devices (layers 0..11 and 12..23,
4 micro-batches, B and W split) under the deepspeed launcher on this CPU (gloo), once per
recompute choice of PLANS. Without --profile, the per-layer costs come from `octodsl profile
--model nemotron-h-tiny` run first on this machine.

What is measured, per rank: the bytes that torch's CPU allocator has handed out and not yet
taken back. torch.profiler with `profile_memory=True` reports every allocation and free of that
allocator (on the rank's thread, which runs its forwards and backwards on CPU); the highest
running sum over one training step (after one warm-up step) is what the step added at its
peak: activations and what recompute brings back, the gradients, the messages, and the
kernels' temporaries. Added to it is what the rank held when the step began (the tensors of
its parameters and optimizer state). Resident-set sampling would see the allocator's cached
pages and the shared-memory segments, not the tensors.

Predicted: `octodsl.sim.simulate` on `SimCosts.from_table(table, plan)`, the simulator's peak
per device (static bytes: 16 per fp32 parameter with Adam, plus the activations its memory
model holds, with the plan's recompute), for the profile's table and for the analytical cost
model of the same shape.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

from machine import (  # benchmarks/machine.py: scripts run from their folder
    ROOT,
    check_outputs,
    commit,
    cpu_model,
    write_outputs,
)

MODEL = "nemotron-h-tiny"
MICROBATCHES = 4
SEED = 11
PLANS = {
    "none": ("none", "none"),
    "full": ("full", "full"),
    "selective": ("selective", "selective"),
    "full + selective": ("full", "selective"),
}
"""What each stage of the plan recomputes, per run."""
MiB = 2**20


def plan(modes: tuple[str, ...]):
    """zb-h1 on 2 devices, 12 layers per stage, with the stages' recompute."""
    from octodsl.gen import generate
    from octodsl.plan import Plan, Recompute, Stage

    base = generate("zb-h1", devices=2, microbatches=MICROBATCHES, model=MODEL)
    stages = [
        Stage(0, 11, recompute=Recompute(modes[0])),
        Stage(12, 23, recompute=Recompute(modes[1])),
    ]
    return Plan(base.header, stages, base.placement, base.schedule)


# The worker: one process per rank, under the deepspeed launcher.
def held_bytes(engine) -> int:
    """Bytes of the distinct storages of the rank's parameters, their gradients and the
    optimizer's state."""
    import torch

    seen: dict[int, int] = {}

    def add(t) -> None:
        if isinstance(t, torch.Tensor):
            st = t.untyped_storage()
            seen[st.data_ptr()] = st.nbytes()

    for p in engine.module.parameters():
        add(p)
        add(p.grad)
    optimizer = engine.optimizer
    while optimizer is not None:
        for state in getattr(optimizer, "state", {}).values():
            for v in state.values() if isinstance(state, dict) else ():
                add(v)
        optimizer = getattr(optimizer, "optimizer", None)
    return sum(seen.values())


def step_peak(engine, data) -> tuple[float, int]:
    """The loss of one training step and the highest number of bytes the CPU allocator had
    handed out during it beyond what it held when the step began."""
    import torch

    with torch.profiler.profile(
        activities=[torch.profiler.ProfilerActivity.CPU], profile_memory=True
    ) as prof:
        loss = engine.train_batch(data).item()
    events = sorted(
        (e.start_ns(), i, e.nbytes())
        for i, e in enumerate(prof.profiler.kineto_results.events())
        if e.name() == "[memory]" and e.device_type() == torch.autograd.DeviceType.CPU
    )
    level = peak = 0
    for _, _, nbytes in events:
        level += nbytes
        peak = max(peak, level)
    return loss, peak


def worker(out: str) -> None:
    import torch

    sys.path.insert(0, str(ROOT / "examples"))
    from deepspeed import comm as dist
    from train import step_data

    from octodsl.deepspeed_ext import (
        init_distributed,
        initialize,
        released_groups,
        shutdown,
    )
    from octodsl.layers import lm_loss, pipeline_specs
    from octodsl.models import load_model

    torch.set_num_threads(1)
    init_distributed("gloo")
    spec = load_model(MODEL)
    config = {"optimizer": {"type": "AdamW", "params": {"lr": 1e-3}}, "steps_per_print": 10**9}
    rows = []
    for name, modes in PLANS.items():
        with released_groups():
            engine, *_ = initialize(
                pipeline_specs(spec),
                plan(modes),
                config=config,
                loss_fn=lm_loss,
                seed_layers=True,
                base_seed=SEED,
                microbatch_size=spec.microbatch_size,
            )
            dp = engine.grid.data_parallel_id

            def data(step: int, dp: int = dp):
                return step_data(
                    SEED, step, dp, MICROBATCHES, spec.microbatch_size, spec.seq_len, spec.vocab
                )

            engine.train_batch(data(0))  # warm-up: optimizer state, message shapes
            gc.collect()
            held = held_bytes(engine)
            loss, peak = step_peak(engine, data(1))
            del engine
            gc.collect()
        gathered: list = [None] * dist.get_world_size()
        torch.distributed.all_gather_object(gathered, {"held": held, "step_peak": peak})
        rows.append({"plan": name, "modes": modes, "loss": loss, "ranks": gathered})
    if dist.get_rank() == 0:  # the step's loss reaches every rank (DeepSpeed broadcasts it)
        Path(out).write_text(json.dumps(rows))
    shutdown()


# The driver: profile, launch the worker, simulate, write the table.
def run_profile(path: Path) -> None:
    subprocess.run(
        [
            str(Path(sys.executable).parent / "octodsl"),
            "profile",
            "--model",
            MODEL,
            "-o",
            str(path),
        ],
        check=True,
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
    )


def launch(out: Path) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    env = {
        **os.environ,
        "DS_ACCELERATOR": "cpu",
        "OMP_NUM_THREADS": "1",
        "PYTHONPATH": str(ROOT),
        "PYTHONWARNINGS": "ignore",
    }
    proc = subprocess.run(
        [
            str(Path(sys.executable).parent / "deepspeed"),
            "--num_gpus",
            "2",
            "--master_port",
            str(port),
            __file__,
            "--worker",
            str(out),
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
    )
    if proc.returncode != 0:
        sys.exit(proc.stdout[-3000:] + proc.stderr[-3000:])


def predicted(table, modes: tuple[str, ...]) -> list[float]:
    """The simulator's peak bytes per device for the plan with these recompute modes."""
    from octodsl.costs.devices import get_link
    from octodsl.sim import SimCosts, simulate

    p = plan(modes)
    return [
        float(x)
        for x in simulate(p, SimCosts.from_table(table, p), get_link("loopback")).peak_memory
    ]


def report(rows: list[dict], profile_path: str, command: str) -> str:
    from octodsl.costs.profile import load_profile
    from octodsl.costs.resolve import cost_table

    tables = {
        "profile": load_profile(profile_path),
        "analytical": cost_table(model=MODEL, device="cpu"),
    }
    pred = {
        name: {row["plan"]: predicted(t, tuple(row["modes"])) for row in rows}
        for name, t in tables.items()
    }
    measured = {row["plan"]: [r["held"] + r["step_peak"] for r in row["ranks"]] for row in rows}
    none_loss = rows[0]["loss"]
    lines = [
        "# Activation recomputation: measured peak memory per rank against the simulator",
        "",
        f"`{command}` on {cpu_model()} ({os.cpu_count()} cores), commit {commit()}.",
        "",
        f"{MODEL} (2 x 256 tokens per micro-batch, fp32), plan zb-h1 on 2 devices (layers 0..11 and "
        f"12..23), {MICROBATCHES} micro-batches, B and W split; one run per recompute choice, each "
        "rank's peak over the second training step. **Measured**: the bytes torch's CPU allocator "
        "had handed out at the step's peak (torch.profiler's memory events) plus the parameters' and "
        "optimizer state's tensors the rank held when the step began. **Predicted**: "
        "`octodsl.sim.simulate` with `SimCosts.from_table`, from the `octodsl profile` table (measured "
        "F, B, W and activation bytes of the torch layers) and from the analytical cost model (which "
        "assumes fused GPU kernels). Savings are against the plan without recompute. MiB.",
        "",
        "| recompute (stage 0, 1) | rank | measured peak | of which the step | predicted (profile) "
        "| predicted (analytical) | measured saving | predicted saving (profile) | predicted saving "
        "(analytical) | loss = none's |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        name = row["plan"]
        for d, r in enumerate(row["ranks"]):
            m = measured[name][d]
            cells = [
                f"{name} ({', '.join(row['modes'])})" if d == 0 else "",
                str(d),
                f"{m / MiB:.1f}",
                f"{r['step_peak'] / MiB:.1f}",
                f"{pred['profile'][name][d] / MiB:.1f}",
                f"{pred['analytical'][name][d] / MiB:.1f}",
                f"{(measured['none'][d] - m) / MiB:.1f}",
                f"{(pred['profile']['none'][d] - pred['profile'][name][d]) / MiB:.1f}",
                f"{(pred['analytical']['none'][d] - pred['analytical'][name][d]) / MiB:.1f}",
                ("yes" if row["loss"] == none_loss else f"no ({row['loss']!r})") if d == 0 else "",
            ]
            lines.append("| " + " | ".join(cells) + " |")
    lines += ["", NOTES]
    return "\n".join(lines) + "\n"


NOTES = """Reading the table:
- Every run's losses equal the plan's without recompute bit for bit (the recomputation runs the
  same operations on the same values).
- Only rank 0 saves. zb-h1 runs each device's W late, and what W needs stays held from B until
  W whether F dropped it or not (for these torch layers `octodsl profile` measures `act_w` =
  `act`: W's autograd state holds the layer's graph); recompute lowers what a forward holds
  until its B, so it pays where forwards run ahead of their backwards: rank 0 runs two before
  its first B, the last stage none. Where selective reads above none (rank 1), the difference
  is the recomputation's own temporaries during B, which the memory model leaves out (the last
  stage's layers alone, one micro-batch's F, B and W, peak a few MiB higher under selective).
- The profile's selective figures are `octodsl profile`'s: per layer, the bytes a forward inside
  `octodsl.layers.recompute.dropping()` no longer keeps (`sel_act`) and the B time it adds
  (`sel_f`), measured on the torch layers the executor runs. The analytical model's activations
  are those of fused GPU kernels (flash attention, Mamba's scan kernels), smaller than these
  eager torch layers', so its column shows the cost model's proportions, not this run's bytes.
- The measured peak is above the predicted one by what the memory model leaves out: the
  kernels' temporaries at the peak op (the LM head's logits and their gradient on rank 1), the
  messages in flight, and DeepSpeed's own buffers."""


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--profile",
        help="a profile of nemotron-h-tiny at its default shape (default: "
        "run `octodsl profile` first)",
    )
    ap.add_argument("-o", "--output", default=str(ROOT / "benchmarks" / "recompute_memory.md"))
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    ap.add_argument("--local_rank", type=int, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        worker(args.worker)
        return 0
    if not check_outputs("recompute_memory.py", [args.output]):
        return 2
    command = "python benchmarks/recompute_memory.py" + (
        f" --profile {args.profile}" if args.profile else ""
    )
    with tempfile.TemporaryDirectory() as tmp:
        profile = args.profile or str(Path(tmp) / "profile.json")
        if not args.profile:
            run_profile(Path(profile))
        out = Path(tmp) / "rows.json"
        launch(out)
        text = report(json.loads(out.read_text()), profile, command)
    if not write_outputs("recompute_memory.py", {Path(args.output): text}):
        return 2
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
