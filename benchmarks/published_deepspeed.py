"""DeepSpeed's stock pipeline schedule, replayed op by op against the simulator: writes
benchmarks/published_deepspeed.md.

    .venv/bin/python benchmarks/published_deepspeed.py [-o benchmarks/published_deepspeed.md]

The published rows that ran on DeepSpeed's pipeline engine (published_runs.yaml: the sources
whose `engine` is DeepSpeed's, BLOOM's logs and MT-NLG 530B) are simulated as octodsl 1F1B plans
on octodsl's message model: a message leaves when its producer ends and only its consumer waits
for it; with the plans' blocking sends the sender waits for its send too (docs/models-and-
costs.md, "Pipeline messages"). This script checks that against what the engine itself runs,
transcribed from DeepSpeed 0.4.0 to 0.6.7 (the releases of those runs; the same in each),
deepspeed/runtime/pipe/schedule.py, `TrainSchedule.steps`:

- 2 (m + p - 1) steps per stage, forward and backward steps alternating (even stages forward on
  even steps), each micro-batch's forward and backward in order;
- a forward step: RecvActivation (of its micro-batch, from the previous stage), SendGrad (of
  the backward before it, to the previous stage), then the forward; a backward step:
  SendActivation (of the forward before it, to the next stage), RecvGrad (of its micro-batch),
  then the backward (B and W together);
- each send and receive blocking, in the order issued: p2p.py's `send`/`recv` are
  `dist.send`/`dist.recv` (torch >= 1.8), on one NCCL communicator and stream per pair of
  ranks, and a transfer starts only when both its send and its receive are posted (a
  rendezvous: the messages here are megabytes); so a stage waits out every transfer it takes
  part in, its receives as well as its sends;
- `PipelineEngine._exec_forward_pass` starts `tput_timer`, whose `ThroughputTimer.start` calls
  `torch.cuda.synchronize()` (deepspeed/utils/timer.py, after its first steps): before each
  forward the host waits for the GPU, so the forward's kernels start a host's reaction later.
  How long that is was not measured; the table gives the seconds each millisecond of it adds.

Messages cost what `simulate` charges for them on the row's links; the stage costs are the
rows' own (octodsl's analytical model), so the columns differ only in how the engine orders and
waits. The replay engine is benchmarks/published_interleaved.py's.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "benchmarks"))
import published as P  # noqa: E402
import published_interleaved as I  # noqa: E402
from machine import check_outputs, commit, cpu_model, write_outputs  # noqa: E402

ENGINE = "DeepSpeed's pipeline engine"
"""The `engine` of the sources replayed here (published_runs.yaml)."""

HOST = 1e-3
"""Host seconds per forward for the sensitivity column (a unit, not an estimate)."""


def _step(stage: int, stages: int, step: int) -> tuple[int, bool]:
    """TrainSchedule._step_to_micro_batch: (micro-batch, whether a forward step)."""
    if step % 2 == stage % 2:  # a forward step
        return (step - stage % 2) // 2 - stage // 2, True
    if step % 2 == 0:  # even step of an odd stage
        return step // 2 - stages + (stage + 1) // 2, False
    return (step - 1) // 2 - stages + 1 + stage // 2, False


def train_schedule(p: int, m: int, rank: int, host: float = 0.0) -> list[tuple]:
    """Rank `rank`'s actions in DeepSpeed's TrainSchedule (module docstring), in the actions of
    published_interleaved's replay; `host`: seconds before each forward (the synchronization)."""
    acts: list[tuple] = []

    def blocking(msg: I.Msg) -> None:
        handle = len(acts)
        acts.append(("post", (msg,), handle, False))
        acts.append(("wait", handle))

    prev = -1
    forwards = backwards = 0
    for step in range(2 * (m + p - 1)):
        mb, forward = _step(rank, p, step)
        valid, valid_prev = 0 <= mb < m, 0 <= prev < m
        if forward:
            if valid and rank > 0:
                blocking(I.Msg(False, rank - 1, True))  # RecvActivation
            if valid_prev and rank > 0:
                blocking(I.Msg(True, rank - 1, False, rank - 1))  # SendGrad
            if valid:
                if host:
                    acts.append(("host", host))
                acts.append(("C", I.F, forwards))
                forwards += 1
        else:
            if valid_prev and rank < p - 1:
                blocking(I.Msg(True, rank + 1, True, rank))  # SendActivation
            if valid and rank < p - 1:
                blocking(I.Msg(False, rank + 1, False))  # RecvGrad
            if valid:
                acts.append(("C", I.B, backwards))
                backwards += 1
        prev = mb
    assert forwards == backwards == m, (rank, forwards, backwards)
    return acts


def row_replay(row: dict, recompute: str) -> dict:
    """The row as published.py simulates it, and the same stage costs through TrainSchedule."""
    s, result, f, b, msg = I.replay_inputs(row, recompute)
    p, m = row["pp"], s.microbatches
    free = I.replay_loops(p, 1, [train_schedule(p, m, r) for r in range(p)], f, b, [0.0] * p)
    engine = I.replay_loops(p, 1, [train_schedule(p, m, r) for r in range(p)], f, b, msg)
    synced = I.replay_loops(p, 1, [train_schedule(p, m, r, HOST) for r in range(p)], f, b, msg)
    tail = result.iteration_time - result.pipeline_time
    published = row["reported"]["value"]
    return {
        "id": row["id"],
        "shape": f"{p} x {m}",
        "sim": result.pipeline_time,
        "free": free.time,
        "engine": engine.time,
        "per_host_ms": synced.time - engine.time,
        "error": P.counted(row, result.iteration_time, s) / published - 1,
        "error_engine": P.counted(row, tail + engine.time, s) / published - 1,
    }


def report(results: list[dict], seconds: float) -> str:
    diffs = [r["engine"] / r["sim"] - 1 for r in results]
    mean_before = sum(abs(r["error"]) for r in results) / len(results)
    mean_after = sum(abs(r["error_engine"]) for r in results) / len(results)
    lines = [
        "# DeepSpeed's pipeline schedule against the simulator",
        "",
        f"Made by `.venv/bin/python benchmarks/published_deepspeed.py` at commit {commit()} on "
        f"{cpu_model()} in {seconds:.0f} s (the transcription of TrainSchedule and NCCL's "
        "semantics: the script's docstring).",
        "",
        f"**{len(results)} rows of the sources that ran DeepSpeed's pipeline engine: its "
        f"schedule, replayed with its blocking sends and receives on the rows' own costs, moves "
        f"the pipeline by {P.pct(min(diffs))} to {P.pct(max(diffs))} against octodsl's simulation; "
        f"the rows' mean |error| would go from {100 * mean_before:.1f}% to "
        f"{100 * mean_after:.1f}%.** So the engine's order and its waits on messages are not what "
        'makes these runs slower than simulated (benchmarks/published.md, "By the software that '
        'ran the pipeline"); the synchronization before each forward would have to take tens of '
        "milliseconds of host time (the gap over `per host ms`), which was not measured.",
        "",
        "`free messages`: TrainSchedule with messages that take no time (equal stages give "
        "1F1B's time exactly: the lockstep of its rendezvous costs nothing by itself). "
        "`per host ms`: what each millisecond between the synchronization before a forward and "
        "the forward's start adds to the pipeline (the cost is that many milliseconds times this).",
        "",
        "| row | p x m | octodsl pipeline s | TrainSchedule, free messages s | TrainSchedule s | "
        "difference | per host ms: s | row's error | with TrainSchedule's time |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        lines.append(
            f"| {r['id']} | {r['shape']} | {r['sim']:.3f} | {r['free']:.3f} | "
            f"{r['engine']:.3f} | {P.pct(r['engine'] / r['sim'] - 1)} | {r['per_host_ms']:.3f} | "
            f"{P.pct(r['error'])} | {P.pct(r['error_engine'])} |"
        )
    return "\n".join(lines) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("-o", "--output", default=str(REPO / "benchmarks" / "published_deepspeed.md"))
    args = ap.parse_args()
    if not check_outputs("published_deepspeed.py", [args.output]):
        return 2
    data = P.load()
    recompute = P.settled_recompute()
    t0 = time.perf_counter()
    results = []
    for row in P.rows(data):
        if data["sources"][row["source"]]["engine"] != ENGINE:
            continue
        r = row_replay(row, recompute[row["id"]])
        results.append(r)
        print(
            f"{r['id']:50} sim {r['sim']:.3f} engine {r['engine']:.3f} "
            f"({P.pct(r['engine'] / r['sim'] - 1)})",
            flush=True,
        )
    text = report(results, time.perf_counter() - t0)
    if not write_outputs("published_deepspeed.py", {Path(args.output): text}):
        return 2
    print(f"wrote {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
