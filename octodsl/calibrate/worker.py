"""One calibration launch, run on every rank by the deepspeed launcher (`runner.py` starts it):

    deepspeed --num_gpus N octodsl/calibrate/worker.py JOB.json

JOB.json (written by the runner) names the model, the DeepSpeed config, the plans to run and
where to write. For each plan the worker builds the executor (`octodsl.deepspeed_ext.initialize`),
runs `steps` training steps with tracing on, and rank 0 writes the executor's Chrome trace
(`engine.write_trace`: op and message spans, an "optimizer" span per rank and step, the first
step's memory counters, deepspeed_ext/memory.py) with the run's plan, model and process count in
its otherData. A plan whose stages name no layers (an imported PyTorch schedule) gets the split
examples/train.py gives it (`deepspeed_ext.partition.default_layer_costs`).

Before the plans, with `link_probe`, ranks 0 and 1 time blocking gloo send/recv round trips
of several sizes (the link between two processes of this machine).

Rank 0 prints one JSON line per event on standard output (`{"event": ...}`) for the runner's
progress display, and writes a summary JSON at the end.
"""

from __future__ import annotations

import gc
import json
import os
import statistics
import sys
import time
from pathlib import Path

os.environ.setdefault("DS_ACCELERATOR", "cpu")
# Run as a script, this file's folder heads sys.path: keep its modules (compare, fit, ...) from
# shadowing top-level ones.
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]

import torch  # noqa: E402

from octodsl.synthetic import get_task, sequences  # noqa: E402

PROBE_SIZES = (1 << 10, 1 << 14, 1 << 17, 1 << 19, 1 << 20, 1 << 22)
"""Message bytes of the link probe."""
PROBE_REPEATS = 9


def _say(**event) -> None:
    if os.environ.get("RANK", "0") == "0":
        print(json.dumps({"event": event.pop("event"), **event}), flush=True)


def synthetic_batch(seed: int, step: int, mb: int, batch: int, seq: int, vocab: int):
    """The data of examples/train.py (each next token a fixed function of the last)."""
    g = torch.Generator().manual_seed(((seed * 1009 + step) * 1009 + 0) * 1009 + mb)
    return sequences(get_task("affine"), g, batch, seq, vocab)


def probe_link(sizes=PROBE_SIZES, repeats: int = PROBE_REPEATS) -> list[tuple[int, float]]:
    """(bytes, one-way seconds) medians of blocking send/recv round trips between ranks 0 and 1
    (empty with one rank). Every rank takes part in the barriers."""
    import torch.distributed as dist

    rank, world = dist.get_rank(), dist.get_world_size()
    out = []
    for size in sizes:
        buf = torch.zeros(size // 4, dtype=torch.float32)
        times = []
        dist.barrier()
        for _ in range(repeats + 2):
            if rank == 0 and world > 1:
                start = time.perf_counter()
                dist.send(buf, 1)
                dist.recv(buf, 1)
                times.append((time.perf_counter() - start) / 2)
            elif rank == 1:
                dist.recv(buf, 0)
                dist.send(buf, 0)
        if times:
            out.append((size, statistics.median(times[2:])))
    dist.barrier()
    return out


def run_plan(job: dict, run: dict, spec) -> dict:
    import torch.distributed as dist

    from octodsl.deepspeed_ext import initialize
    from octodsl.deepspeed_ext.partition import default_layer_costs
    from octodsl.lang import parse_plan
    from octodsl.layers import lm_loss, pipeline_specs

    plan = parse_plan(run["plan"], run["name"])
    config = dict(job["config"])
    config["train_micro_batch_size_per_gpu"] = spec.microbatch_size
    config["gradient_accumulation_steps"] = plan.microbatches
    config.pop("train_batch_size", None)
    config["octo"] = {"trace": True, "timeout": job.get("timeout", 300)}
    costs = default_layer_costs(spec) if all(st.abstract for st in plan.stages) else None
    engine = initialize(
        pipeline_specs(spec),
        plan,
        config=config,
        loss_fn=lm_loss,
        layer_costs=costs,
        seed_layers=True,
        base_seed=job["seed"],
    )[0]
    seconds = []
    for step in range(job["steps"]):
        data = iter(
            [
                synthetic_batch(
                    job["seed"], step, m, spec.microbatch_size, spec.seq_len, spec.vocab
                )
                for m in range(plan.microbatches)
            ]
        )
        start = time.perf_counter()
        engine.train_batch(data)
        seconds.append(time.perf_counter() - start)
        _say(event="step", run=run["name"], step=step, seconds=seconds[-1])
    memory = engine.write_trace(
        run["trace"],
        info={
            "octodsl": "calibration run",
            "plan": plan.header.name,
            "model": spec.name,
            "steps": job["steps"],
            "processes": dist.get_world_size(),
            "threads": torch.get_num_threads(),
        },
    )
    result = {"name": run["name"], "trace": run["trace"], "step_seconds": seconds}
    if memory is not None:
        result["memory"] = memory
    del engine
    gc.collect()
    return result


def main() -> int:
    args = [a for a in sys.argv[1:] if not a.startswith("--local_rank")]
    job = json.loads(Path(args[0]).read_text())
    torch.set_num_threads(int(job.get("threads", 1)))
    import torch.distributed as dist

    from octodsl.deepspeed_ext import init_distributed, released_groups, shutdown
    from octodsl.fileio import write_atomic
    from octodsl.models import parse_model

    init_distributed("gloo")
    spec = parse_model(job["model"], "calibration job")
    runs: list[dict] = []
    out = {"processes": dist.get_world_size(), "runs": runs, "link": []}
    if job.get("link_probe") and dist.get_world_size() > 1:
        _say(event="probe")
        out["link"] = probe_link()
    for run in job["runs"]:
        _say(event="run", run=run["name"])
        with released_groups():  # else each plan's groups slow down the plans after it
            runs.append(run_plan(job, run, spec))
        _say(event="done", run=run["name"])
    if dist.get_rank() == 0:
        write_atomic(job["out"], json.dumps(out, indent=1, allow_nan=False))
    shutdown()  # else a rank may abort in the interpreter's teardown
    return 0


if __name__ == "__main__":
    sys.exit(main())
