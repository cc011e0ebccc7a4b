"""Megatron-LM's interleaved 1F1B loop, replayed op by op against the simulator: writes
benchmarks/published_interleaved.md.

    .venv/bin/python benchmarks/published_interleaved.py [-o benchmarks/published_interleaved.md]

The published rows run with Megatron's `forward_backward_pipelining_with_interleaving` (the
zerobubble2024 1F1B-I rows, narayanan2021, megascale2024) are simulated as octodsl plans
(`gen interleaved`) on octodsl's message model: a message leaves when its producer ends, on the
sender's send stream and the receiver's receive stream, and only its consumer waits for it
(docs/models-and-costs.md, "Pipeline messages"). This script checks that model against what the
runtime's own loop does, transcribed from ZeroBubble's Megatron-LM fork at the commit the paper
ran (sail-sg/zero-bubble-pipeline-parallelism, branch 'arxiv', commit f68d3879,
megatron/core/pipeline_parallel/schedules.py; its path without overlap is NVIDIA's of 2021,
megatron/schedules.py at 64a83fb5, in the same repository's history):

- the order of F and B per rank: warm-up `(p - rank - 1) * 2 + (v - 1) * p` forwards (all of
  them when m == p, line 502), then one forward and one backward, then the backwards
  (lines 502-510, `get_model_chunk_id` line 528);
- `overlap_p2p_comm` (on by default in that fork; lines 714-843): after each forward it posts
  isend(output) and irecv(next input), after each backward isend(input grad) and irecv(next
  output grad), unbatched (`_p2p_ops`, p2p_communication.py line 168); the handles of a forward's
  exchange (its send too) are waited on just before the next forward, a backward's before the
  next backward (lines 657, 764, 811); the cool-down's exchanges block (`send_backward_recv_
  backward` without overlap, line 942);
- without it (lines 846-910; Megatron of 2021 the same): batched, blocking exchanges, and in the
  steady state one exchange after each forward-backward pair (line 903), so a forward's output
  leaves only after the backward that follows it.

and NCCL's point-to-point semantics as PyTorch drives them: a receive is posted (enqueued after
the compute stream's work so far) where the loop posts it, and a transfer starts only when both
its send and its receive are posted (a rendezvous: the messages here are megabytes, far above
NCCL's buffers); PyTorch's ProcessGroupNCCL runs each pair of ranks' unbatched send/recv on a
communicator and stream of that pair, in the order posted (one send and one receive stream per
rank instead gives the same times on every row here); a batched exchange is one group.
Costs are the rows' own (octodsl's analytical model, the stage costs `simulate` uses), so the
two columns differ only in how messages and waits are placed.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "benchmarks"))
import published as P  # noqa: E402
from machine import check_outputs, commit, cpu_model, write_outputs  # noqa: E402

F, B = "F", "B"


@dataclass(frozen=True)
class Msg:
    """One point-to-point operation a rank posts."""

    send: bool
    peer: int
    forward: bool
    """Activations (toward the next rank) or gradients (toward the previous)."""
    boundary: int = -1
    """A send's cut: global stage s for the cut s|s+1 (stage = chunk * p + rank)."""


@dataclass
class Loop:
    """One rank's actions in Megatron's interleaved loop (module docstring): ('C', kind, k) the
    k-th forward or backward of the rank; ('post', msgs, handle, batched); ('wait', handle)."""

    p: int
    v: int
    m: int
    rank: int
    overlap: bool
    acts: list[tuple] = field(default_factory=list)

    @property
    def total(self) -> int:
        return self.m * self.v

    @property
    def warmup(self) -> int:
        if self.m == self.p:  # all forwards first (schedules.py line 502)
            return self.total
        return min((self.p - self.rank - 1) * 2 + (self.v - 1) * self.p, self.total)

    def chunk(self, k: int, forward: bool) -> int:
        c = (k % (self.p * self.v)) // self.p
        return c if forward else self.v - c - 1

    def post(self, msgs: list[Msg], *, block: bool) -> int | None:
        if not msgs:
            return None
        handle = len(self.acts)
        self.acts.append(("post", tuple(msgs), handle, not self.overlap))
        if block:
            self.acts.append(("wait", handle))
            return None
        return handle

    def wait(self, handle: int | None) -> None:
        if handle is not None:
            self.acts.append(("wait", handle))

    def compute(self, kind: str, k: int) -> None:
        self.acts.append(("C", kind, k))

    # what each exchange carries
    def send_f(self, k: int) -> list[Msg]:
        c = self.chunk(k, True)
        if self.rank == self.p - 1 and c == self.v - 1:  # the last stage sends nothing on
            return []
        return [Msg(True, (self.rank + 1) % self.p, True, c * self.p + self.rank)]

    def send_b(self, k: int) -> list[Msg]:
        c = self.chunk(k, False)
        if self.rank == 0 and c == 0:
            return []
        return [Msg(True, (self.rank - 1) % self.p, False, c * self.p + self.rank - 1)]

    def recv_f(self, want: bool) -> list[Msg]:
        return [Msg(False, (self.rank - 1) % self.p, True)] if want else []

    def recv_b(self, want: bool) -> list[Msg]:
        return [Msg(False, (self.rank + 1) % self.p, False)] if want else []

    # when a rank receives (schedules.py's recv_prev / recv_next)
    def warm_recv_prev(self, k: int) -> bool:
        if self.rank == 0 and self.chunk(k + 1, True) == 0:
            return False
        return k != self.total - 1

    def steady_recv_prev(self, k: int, fk: int, remaining: int) -> bool:
        if self.rank == 0 and self.chunk(fk - (self.p - 1), True) == self.v - 1:
            return False
        return k != remaining - 1

    def steady_recv_next(self, k: int) -> bool:
        return not (self.rank == self.p - 1 and self.chunk(k - (self.p - 1), False) == 0)

    def cool_recv_next(self, k: int) -> bool:
        if self.rank == self.p - 1 and self.chunk(k + 1, False) == self.v - 1:
            return False
        return k != self.total - 1


def _warm_up(lp: Loop) -> tuple[int | None, int | None]:
    fwd = bwd = None
    last_warm = lp.warmup - 1 if lp.warmup < lp.total else -1
    for k in range(lp.warmup):
        lp.wait(fwd)
        lp.compute(F, k)
        msgs = lp.send_f(k) + lp.recv_f(lp.warm_recv_prev(k))
        if k == last_warm and not lp.overlap:
            fwd = lp.post(msgs + lp.recv_b(lp.rank != lp.p - 1), block=True)
            continue
        fwd = lp.post(msgs, block=not lp.overlap)
        if k == last_warm:
            bwd = lp.post(lp.recv_b(lp.rank != lp.p - 1), block=False)
    return fwd, bwd


def _steady(lp: Loop, fwd: int | None, bwd: int | None) -> int | None:
    remaining = lp.total - lp.warmup
    for k in range(remaining):
        fk = k + lp.warmup
        to_next = lp.send_f(fk) + lp.recv_f(lp.steady_recv_prev(k, fk, remaining))
        to_prev = lp.send_b(k) + lp.recv_b(lp.steady_recv_next(k))
        if lp.overlap:
            lp.wait(fwd)
            lp.compute(F, fk)
            fwd = lp.post(to_next, block=False)
            lp.wait(bwd)
            lp.compute(B, k)
            bwd = lp.post(to_prev, block=False)
        else:  # one batched exchange after the pair (line 903)
            lp.compute(F, fk)
            lp.compute(B, k)
            lp.post(to_next + to_prev, block=True)
    return bwd


def megatron_loop(p: int, v: int, m: int, rank: int, overlap: bool) -> list[tuple]:
    """Rank `rank`'s actions in Megatron's interleaved loop (p > 2, p | m)."""
    lp = Loop(p, v, m, rank, overlap)
    lp.post(lp.recv_f(rank != 0), block=True)  # the first input
    fwd, bwd = _warm_up(lp)
    bwd = _steady(lp, fwd, bwd)
    lp.wait(bwd)
    if lp.warmup == lp.total:
        lp.post(lp.recv_b(rank != p - 1), block=True)
    for k in range(lp.total - lp.warmup, lp.total):
        lp.compute(B, k)
        lp.post(lp.send_b(k) + lp.recv_b(lp.cool_recv_next(k)), block=True)
    return lp.acts


def op_of(p: int, v: int, rank: int, kind: str, k: int) -> tuple[str, int, int]:
    """(kind, stage, micro-batch) of a rank's k-th forward or backward."""
    group, i = divmod(k, p * v)
    c = i // p
    if kind == B:
        c = v - c - 1
    return kind, c * p + rank, group * p + i % p


def megatron_order(p: int, v: int, m: int, rank: int) -> list[tuple[str, int, int]]:
    return [
        op_of(p, v, rank, a[1], a[2]) for a in megatron_loop(p, v, m, rank, True) if a[0] == "C"
    ]


class _Graph:
    """Start-to-end dependencies: node i ends at max(its predecessors' ends) + dur[i]."""

    def __init__(self) -> None:
        self.preds: list[list[int]] = []
        self.dur: list[float] = []

    def node(self, preds: list[int], dur: float = 0.0) -> int:
        self.preds.append(preds)
        self.dur.append(dur)
        return len(self.dur) - 1

    def ends(self) -> list[float]:
        """Every node's end; raises RuntimeError on a cycle (the loop would deadlock)."""
        nan = float("nan")
        end = [nan] * len(self.dur)
        open_ = [False] * len(self.dur)
        for root in range(len(self.dur)):
            stack = [root]
            while stack:
                n = stack[-1]
                if end[n] == end[n]:  # not NaN: done
                    stack.pop()
                    continue
                todo = [q for q in self.preds[n] if end[q] != end[q]]
                if todo:
                    if open_[n]:
                        raise RuntimeError("the loop deadlocks")
                    open_[n] = True
                    stack.extend(todo)
                    continue
                end[n] = max((end[q] for q in self.preds[n]), default=0.0) + self.dur[n]
                stack.pop()
        return end


@dataclass
class Replay:
    """One iteration of the loop: per rank its ops (kind, stage, micro-batch, start, end)."""

    time: float
    ops: list[list[tuple[str, int, int, float, float]]]


@dataclass
class _Rank:
    """What replay tracks of one rank while it reads the rank's actions."""

    r: int
    last: list[int] = field(default_factory=list)
    """The compute stream's last node (none yet: empty)."""
    streams: dict[object, int] = field(default_factory=dict)
    """Per communication stream: the completion node of its last op or group."""
    handles: dict[int, list[int]] = field(default_factory=dict)
    """Per posted exchange: its ops' completion nodes."""


class _Transfers:
    """The posted sends and receives, matched in order per (sender, receiver, direction) as
    NCCL matches them; each op has a node for when it is posted and one for when it completes."""

    def __init__(self, g: _Graph) -> None:
        self.g = g
        self.sends: dict[tuple, list[tuple[int, int, int]]] = defaultdict(list)
        self.recvs: dict[tuple, list[tuple[int, int]]] = defaultdict(list)

    def post(self, rk: _Rank, msgs: tuple[Msg, ...], batched: bool) -> list[int]:
        """One exchange: each op is posted once the compute stream's work so far and its
        stream's previous op are done (one stream per peer; a batched exchange is one group
        on one stream, done when all its ops are)."""
        g = self.g
        ids = []
        for mm in msgs:
            key = "group" if batched else mm.peer
            before = rk.streams.get(key)
            ready = g.node(rk.last + ([] if before is None else [before]))
            complete = g.node([])  # its transfer, once matched
            if mm.send:
                self.sends[(rk.r, mm.peer, mm.forward)].append((ready, complete, mm.boundary))
            else:
                self.recvs[(mm.peer, rk.r, mm.forward)].append((ready, complete))
            if not batched:
                rk.streams[key] = complete
            ids.append(complete)
        if batched:
            rk.streams["group"] = g.node(ids)
        return ids

    def match(self, msg: list[float]) -> None:
        """A transfer starts when both its send and its receive are posted (a rendezvous)."""
        assert set(self.recvs) <= set(self.sends), "a receive nobody sends"
        for key, ss in self.sends.items():
            rs = self.recvs[key]
            assert len(ss) == len(rs), f"unmatched point-to-point ops {key}"
            for (s_ready, s_done, cut), (r_ready, r_done) in zip(ss, rs, strict=True):
                x = self.g.node([s_ready, r_ready], msg[cut])
                self.g.preds[s_done] = self.g.preds[r_done] = [x]


def replay(
    p: int,
    v: int,
    m: int,
    f: list[list[float]],
    b: list[list[float]],
    msg: list[float],
    overlap: bool,
) -> Replay:
    """Megatron's loop on NCCL's semantics (module docstring). f[c][r], b[c][r]: seconds of chunk
    c's forward and (fused) backward on rank r; msg[s]: seconds of a message across cut s."""
    return replay_loops(p, v, [megatron_loop(p, v, m, r, overlap) for r in range(p)], f, b, msg)


def replay_loops(
    p: int,
    v: int,
    loops: list[list[tuple]],
    f: list[list[float]],
    b: list[list[float]],
    msg: list[float],
) -> Replay:
    """Each rank's actions (`Loop.acts`; ('host', seconds): the rank's stream waits that long
    after its work so far) on NCCL's semantics, timed as `replay` says."""
    g = _Graph()
    transfers = _Transfers(g)
    computes = []
    for r in range(p):
        rk = _Rank(r)
        mine = []
        for a in loops[r]:
            if a[0] == "C":
                kind, stage, mb = op_of(p, v, r, a[1], a[2])
                rk.last = [g.node(rk.last, (f if kind == F else b)[stage // p][r])]
                mine.append((kind, stage, mb, rk.last[0]))
            elif a[0] == "host":
                rk.last = [g.node(rk.last, a[1])]
            elif a[0] == "wait":
                rk.last = [g.node(rk.last + rk.handles[a[1]])]
            else:
                rk.handles[a[2]] = transfers.post(rk, a[1], a[3])
        computes.append(mine)
    transfers.match(msg)
    end = g.ends()
    ops = [[(k, st, mb, end[n] - g.dur[n], end[n]) for k, st, mb, n in mine] for mine in computes]
    return Replay(max(end), ops)


# -- the published rows ------------------------------------------------------------------------

MEGATRON = ("narayanan2021", "megascale2024", "zerobubble2024")
"""Sources whose interleaved rows ran Megatron-LM's loop (published_runs.yaml, each source's
`why`); Llama 3 ran Meta's own."""


def replay_inputs(row: dict, recompute: str):
    """The row as published.py simulates it (with the recompute it settled on): its setup, the
    simulation, and the replay's costs from the same stage costs: per chunk c and rank r the
    forward's and the fused backward's seconds, f[c][r] and b[c][r], and per cut a message's
    seconds as `simulate` charges it."""
    spec = P.write_spec(row["model"])
    s = P.setup(row)
    result, _ = P.simulate_row(row, spec, s, recompute)
    p, stages = row["pp"], result.costs.stages
    f = [[stages[c * p + r].f for r in range(p)] for c in range(s.vp)]
    b = [[stages[c * p + r].fused_backward for r in range(p)] for c in range(s.vp)]
    msg = list(
        result.links.cut_times([c.send_bytes for c in stages]) + result.costs.message_overhead
    )
    return s, result, f, b, msg


def row_replay(row: dict, recompute: str) -> dict:
    """The row as published.py simulates it (with the recompute it settled on), and the same
    stage costs through Megatron's loop."""
    from octodsl.sim import SimProgram

    s, result, f, b, msg = replay_inputs(row, recompute)
    prog: SimProgram = result.program
    plan = prog.plan
    p, v, m = row["pp"], s.vp, s.microbatches
    same = all(
        [f"{k}{st}:{mb}" for k, st, mb in megatron_order(p, v, m, r)]
        == [str(op).replace("BW", "B") for op in plan.schedule[r]]
        for r in range(p)
    )
    rep = replay(p, v, m, f, b, msg, plan.header.overlap_p2p_comm)
    iteration = result.iteration_time - result.pipeline_time + rep.time
    published = row["reported"]["value"]
    return {
        "id": row["id"],
        "shape": f"{p} x {v} x {m}",
        "overlap": plan.header.overlap_p2p_comm,
        "same_order": same,
        "sim": result.pipeline_time,
        "loop": rep.time,
        "error": P.counted(row, result.iteration_time, s) / published - 1,
        "error_loop": P.counted(row, iteration, s) / published - 1,
    }


def residuals(published_json: Path) -> list[str]:
    """Per zerobubble2024 model and schedule: what the measured iteration takes beyond the
    simulated one, per micro-batch (least squares over the rows' micro-batch counts) and per
    pipeline op."""
    rows = [r for r in json.loads(published_json.read_text())["rows"] if r["id"].startswith("zb")]
    groups: dict[tuple[str, str], list[tuple[int, float, int]]] = defaultdict(list)
    for r in rows:
        measured = r["global_batch"] / (r["gpus"] * r["published"])
        ops = {"1f1b": 2, "interleaved": 2 * r["vp"]}.get(r["schedule"], 3)
        key = (r["model"], r["id"].split("-m", 1)[1].split("-", 1)[1])
        groups[key].append((r["microbatches"], measured - r["iteration_time"], ops))
    out = [
        "| model | schedule | ops per micro-batch | measured - simulated: per micro-batch | per op |"
        " at the fewest micro-batches |",
        "|---|---|---|---|---|---|",
    ]
    for (model, sched), pts in sorted(groups.items()):
        if len(pts) < 2:
            continue
        n = len(pts)
        mx = sum(x for x, _, _ in pts) / n
        my = sum(y for _, y, _ in pts) / n
        slope = sum((x - mx) * (y - my) for x, y, _ in pts) / sum((x - mx) ** 2 for x, _, _ in pts)
        ops = pts[0][2]
        first = min(pts)
        out.append(
            f"| {model} | {sched} | {ops} | {1e3 * slope:.2f} ms | {1e3 * slope / ops:.2f} ms | "
            f"{1e3 * first[1]:.0f} ms at m = {first[0]} |"
        )
    return out


def report(results: list[dict], res_lines: list[str], seconds: float) -> str:
    diffs = [r["loop"] / r["sim"] - 1 for r in results]
    lines = [
        "# Megatron-LM's interleaved loop against the simulator",
        "",
        f"Made by `.venv/bin/python benchmarks/published_interleaved.py` at commit {commit()} on "
        f"{cpu_model()} in {seconds:.0f} s (the transcription of the loop and NCCL's semantics: "
        "the script's docstring).",
        "",
        f"**{len(results)} interleaved rows of the sources that ran Megatron-LM's loop: octodsl's "
        f"order is Megatron's, op by op, on {sum(r['same_order'] for r in results)} of them; the "
        f"loop replayed with its own waits moves the pipeline by {P.pct(min(diffs))} to "
        f"{P.pct(max(diffs))}.**",
        "",
        "| row | p x v x m | overlap_p2p_comm | order as Megatron's | octodsl pipeline s | "
        "Megatron's loop s | difference | row's error | with the loop's time |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        lines.append(
            f"| {r['id']} | {r['shape']} | {str(r['overlap']).lower()} | "
            f"{'same' if r['same_order'] else 'differs'} | {r['sim']:.4f} | {r['loop']:.4f} | "
            f"{P.pct(r['loop'] / r['sim'] - 1)} | {P.pct(r['error'])} | {P.pct(r['error_loop'])} |"
        )
    lines += [
        "",
        "## What the zerobubble2024 runs take beyond the simulation",
        "",
        "From benchmarks/published.json (measured iteration: global batch / (GPUs x samples per "
        "GPU per second)). A part that grows with the micro-batches at a rate proportional to "
        "the ops per micro-batch is a cost per pipeline op that the simulation leaves out; 1F1B-I "
        "runs 2v ops per micro-batch on each device, the others 2 or 3.",
        "",
        *res_lines,
        "",
    ]
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("-o", "--output", default=str(REPO / "benchmarks" / "published_interleaved.md"))
    args = ap.parse_args()
    if not check_outputs("published_interleaved.py", [args.output]):
        return 2
    recompute = P.settled_recompute()
    t0 = time.perf_counter()
    results = []
    for row in P.rows(P.load()):
        if row.get("schedule") != "interleaved" or row["source"] not in MEGATRON or row["pp"] < 3:
            continue
        r = row_replay(row, recompute[row["id"]])
        results.append(r)
        print(
            f"{r['id']:45} order {'same' if r['same_order'] else 'DIFFERS'} sim {r['sim']:.4f} "
            f"loop {r['loop']:.4f} ({P.pct(r['loop'] / r['sim'] - 1)})",
            flush=True,
        )
    text = report(results, residuals(P.DONE), time.perf_counter() - t0)
    if not write_outputs("published_interleaved.py", {Path(args.output): text}):
        return 2
    print(f"wrote {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
