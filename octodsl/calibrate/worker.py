"""One calibration launch, run on every rank by the deepspeed launcher (`runner.py` starts it):

    deepspeed --num_gpus N octodsl/calibrate/worker.py JOB.json

JOB.json (written by the runner) names the model, the DeepSpeed config, the plans to run and
where to write. For each plan the worker builds the executor (`octodsl.deepspeed_ext.initialize`),
runs `steps` training steps with tracing on, and rank 0 writes a Chrome trace in the executor's
layout (octodsl/trace.py) with two additions:

- an "optimizer" span on each rank's compute thread per step: the optimizer's update of the
  rank's parameters (`optimizer.step()`, without the gradient-norm all-reduce before it);
- measured memory, per rank, as a "memory" counter track (the simulator's name), taken during
  the first step with the accounting the profiler uses (octodsl/costs/profiler.py):
  static bytes = the bytes of the rank's parameters, of their gradients (as they stand before
  the optimizer step) and of the optimizer's state tensors; activation bytes = the distinct
  non-parameter storages autograd saved in the rank's forwards that are still alive, plus the
  tensors held by the weight-gradient state of split backwards, sampled after every op.
  The first step pays for the bookkeeping; timing uses the later steps.

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
import weakref
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


class MemoryMeter:
    """The profiler's accounting, on a running engine (see the module docstring)."""

    def __init__(self, engine):
        from octodsl.costs.profiler import _storage

        self.engine = engine
        self._storage = _storage
        self.params = [p for s in engine.local_stages for p in engine._stage_params[s]]
        self.exclude = {_storage(p)[0] for p in self.params}
        self.nbytes: dict[int, int] = {}
        self.refs: dict[int, list[weakref.ref]] = {}
        self.samples: list[tuple[float, float]] = []
        self.static = 0.0
        self.grad_bytes = 0.0
        self.active = True

    def pack(self, t: torch.Tensor) -> torch.Tensor:
        t = t.detach()  # an alias, as the profiler keeps (no cycle through the grad_fn)
        ptr, nbytes = self._storage(t)
        if ptr not in self.exclude:
            self.nbytes[ptr] = nbytes
            self.refs.setdefault(ptr, []).append(weakref.ref(t))
        return t

    def activations(self) -> float:
        from octodsl.costs.profiler import _tensors

        alive = {ptr: self.nbytes[ptr] for ptr, refs in self.refs.items()
                 if any(r() is not None for r in refs)}
        for saved in self.engine._saved.values():
            if saved.weight is not None:
                for t in _tensors(saved.weight):
                    ptr, nbytes = self._storage(t)
                    if ptr not in self.exclude:
                        alive.setdefault(ptr, nbytes)
        return float(sum(alive.values()))

    def sample(self) -> None:
        self.samples.append((time.time(), self.activations()))

    def before_optimizer(self) -> None:
        self.grad_bytes = float(sum(p.grad.untyped_storage().nbytes() if p.grad is not None
                                    else 0 for p in self.params))

    def after_optimizer(self) -> None:
        state_bytes = 0
        seen = set()
        for p in self.params:
            for v in self.engine.optimizer.state.get(p, {}).values():
                if torch.is_tensor(v) and v.untyped_storage().data_ptr() not in seen:
                    seen.add(v.untyped_storage().data_ptr())
                    state_bytes += v.untyped_storage().nbytes()
        param_bytes = sum(p.untyped_storage().nbytes() for p in self.params)
        self.static = float(param_bytes + self.grad_bytes + state_bytes)
        self.active = False


def instrument(engine, meter: MemoryMeter | None, spans: list):
    """Give this engine instance (only) instruction handlers that measure memory in the first
    step, and time its optimizer's update."""
    from deepspeed.runtime.pipe import schedule as ds

    from octodsl.deepspeed_ext import program
    from octodsl.trace import TimedSpan

    table = dict(type(engine)._INSTRUCTION_MAP)
    run_op = table[program.RunOp]
    step = table[ds.OptimizerStep]
    pid = engine.stage_id

    def exec_run(self, op):
        if meter is not None and meter.active:
            with torch.autograd.graph.saved_tensors_hooks(meter.pack, lambda t: t):
                run_op(self, op)
            meter.sample()
        else:
            run_op(self, op)

    def exec_step(self, **kwargs):
        if meter is not None and meter.active:
            meter.before_optimizer()
        step(self, **kwargs)
        if meter is not None and meter.active:
            meter.after_optimizer()

    table[program.RunOp] = exec_run
    table[ds.OptimizerStep] = exec_step
    engine._INSTRUCTION_MAP = table

    update = engine.optimizer.step

    def timed_update(*args, **kwargs):
        start = time.time()
        out = update(*args, **kwargs)
        spans.append(TimedSpan(pid, 0, "optimizer", start, time.time(), {"kind": "optimizer"}))
        return out

    engine.optimizer.step = timed_update


def run_plan(job: dict, run: dict, spec) -> dict:
    import torch.distributed as dist

    from octodsl.deepspeed_ext import initialize
    from octodsl.fileio import write_atomic
    from octodsl.trace import chrome_trace
    from octodsl.lang import parse_plan
    from octodsl.layers import lm_loss, pipeline_specs

    plan = parse_plan(run["plan"], run["name"])
    config = dict(job["config"])
    config["train_micro_batch_size_per_gpu"] = spec.microbatch_size
    config["gradient_accumulation_steps"] = plan.microbatches
    config.pop("train_batch_size", None)
    config["octo"] = {"trace": True, "timeout": job.get("timeout", 300)}
    engine = initialize(pipeline_specs(spec), plan, config=config, loss_fn=lm_loss,
                        seed_layers=True, base_seed=job["seed"])[0]
    meter = MemoryMeter(engine) if job.get("memory", True) else None
    extra: list = []
    instrument(engine, meter, extra)
    seconds = []
    for step in range(job["steps"]):
        data = iter([synthetic_batch(job["seed"], step, m, spec.microbatch_size, spec.seq_len,
                                     spec.vocab) for m in range(plan.microbatches)])
        start = time.perf_counter()
        engine.train_batch(data)
        seconds.append(time.perf_counter() - start)
        _say(event="step", run=run["name"], step=step, seconds=seconds[-1])
    spans = engine.trace_spans() + extra
    mem = None
    if meter is not None:
        mem = {"static": meter.static, "samples": meter.samples}
    gathered: list = [None] * dist.get_world_size()  # all_gather_object: each rank's (spans, mem)
    dist.all_gather_object(gathered, (spans, mem))
    result = {"name": run["name"], "trace": run["trace"], "step_seconds": seconds}
    if dist.get_rank() == 0:
        all_spans = [s for sp, _ in gathered for s in sp]
        trace = chrome_trace(all_spans)
        t0 = min(s.start for s in all_spans)
        events = trace["traceEvents"]
        memory = {}
        for rank, (_, m) in enumerate(gathered):
            if m is None:
                continue
            static = m["static"]
            events.append({"ph": "C", "pid": rank, "name": "memory", "ts": 0.0,
                           "args": {"bytes": static}})
            for t, act in m["samples"]:
                events.append({"ph": "C", "pid": rank, "name": "memory", "ts": (t - t0) * 1e6,
                               "args": {"bytes": static + act}})
            memory[rank] = {"static": static,
                            "activations": max((a for _, a in m["samples"]), default=0.0)}
        trace["otherData"].update({
            "octodsl": "calibration run", "plan": plan.header.name, "model": spec.name,
            "steps": job["steps"], "processes": dist.get_world_size(),
            "threads": torch.get_num_threads(),
            "memory_method": "profiler accounting (saved-tensor hooks + W state; parameters, "
                             "gradients, optimizer state), first step",
            "memory": {str(k): v for k, v in memory.items()},
        })
        write_atomic(run["trace"], json.dumps(trace, allow_nan=False))
        result["memory"] = memory
    del engine, meter
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
