"""`simulate(program, stage_costs, link) -> SimResult`: cost a compiled plan and walk it."""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import replace

import numpy as np

from ..costs.levers import Zero
from ..costs.table import Link, StageCost, uniform_stage_costs
from ..dag import build_graph, describe_cycle, execution_order
from ..mesh import Mesh
from ..plan import DEEPSPEED, Header, Op, OpKind, Plan, PlanError, Slot, Stage, placement_loop
from .bounds import ring_reduction_time
from .core import Timeline, WalkGraph, comm_overlap, walk
from .costs import SimCosts
from .dpcomm import TiedReduce, buckets, dp_comm
from .links import Links, cut_crosses_nodes, dp_overlap_slowdown, dp_rails, dp_spans_nodes
from .memory import memory
from .program import KIND_CODE, SimProgram, compile
from .result import Deferred, SimResult
from .sharing import ROUNDS, TOLERANCE, Sharing, shared_phase, stretch

_F = KIND_CODE[OpKind.F]


class SimDeadlock(PlanError):
    """The plan's device orders admit no execution; `cycle` is the wait-for cycle lint reports."""

    def __init__(self, cycle):
        self.cycle = cycle
        super().__init__("the schedule deadlocks:\n" + describe_cycle(cycle))


def simulate(
    program: SimProgram | Plan,
    costs: SimCosts | Sequence[StageCost],
    link: Link,
    *,
    inter_link: Link | None = None,
    dp: int | None = None,
    dp_link: Link | None = None,
) -> SimResult:
    """Simulate one training iteration.

    costs: a StageCost per stage (per micro-batch), or SimCosts with what a cost table adds
    (gradient bytes for the data-parallel reduction, the heaviest layer, tokens per
    micro-batch). link carries the pipeline's messages inside a node, inter_link those between
    nodes (default: link; where ranks sit is the plan's mesh, links.py). dp: data-parallel
    copies (default: the plan's; the static bytes in `costs` stay sharded as they were built,
    SimCosts.dp); dp_link carries their collectives (default: inter_link for a group that
    spans nodes, else link), under the plan's `zero` (dpcomm.py).
    Raises SimDeadlock when the plan cannot run."""
    t0 = time.perf_counter()
    p = program if isinstance(program, SimProgram) else compile(program)
    costs = SimCosts.of(costs)
    stage_costs = costs.stages
    if len(stage_costs) != p.num_stages:
        raise ValueError(f"{len(stage_costs)} stage costs for {p.num_stages} stages")
    column = costs.column
    op_dur = p.per_op(column("f"), column("b"), column("w"), column("fused_backward"))
    ep_f, ep_b = column("ep_f"), column("ep_b")
    # only an overlap group's ops may hide their all-to-alls (`per_slot`)
    op_comm = p.per_op(ep_f, ep_b, np.zeros_like(ep_f), ep_b) if p.grouped else None
    work = op_dur if op_comm is None else p.per_slot(op_dur, op_comm)
    ranks = dp if dp is not None else p.plan.header.dp
    cut_inter, dp_inter, rails = p.cut_inter, p.dp_inter, p.dp_rails
    if ranks != p.plan.header.dp:  # another mesh than the one compiled: place its ranks
        mesh = replace(Mesh.of(p.plan.header), dp=ranks)
        cut_inter, dp_inter = cut_crosses_nodes(mesh, p.stage_device), dp_spans_nodes(mesh)
        rails = dp_rails(mesh)
    links = Links.of(cut_inter, dp_inter, rails, link, inter_link, dp_link)
    cut_time = links.cut_times(column("send_bytes")) + costs.message_overhead
    msg_dur = cut_time[p.msg_boundary]

    sharing = costs.sharing if costs.sharing is not None and costs.sharing.active else None
    g = p.walk_graph
    dur = work
    for _ in range(ROUNDS if sharing is not None else 1):
        t = walk(g, dur, msg_dur)
        if t.done < p.num_nodes:
            raise _deadlock(p.plan)
        if sharing is None:
            break
        new = _shared_durations(p, g, sharing, work, t)
        if np.all(np.abs(new - dur) <= TOLERANCE * np.maximum(dur, 1e-12)):
            break
        dur = 0.5 * (dur + new)
    op_seconds = op_dur
    if p.grouped or sharing is not None:  # each op of an overlap group keeps its share of the slot
        summed = p.per_node(op_dur)
        op_dur = op_dur * np.repeat(
            np.divide(dur, summed, out=np.ones_like(dur), where=summed > 0), np.diff(p.op_ptr)
        )
    pipeline_time = float(t.end.max()) if p.num_nodes else 0.0

    # The data-parallel end of the iteration (dpcomm.py): gradient reduction, the optimizer
    # step once every device is done (DeepSpeed synchronises the pipeline there: the
    # gradient-norm all-reduce, the loss broadcast), under ZeRO the parameters' all-gather,
    # then the step's fixed overhead.
    grads = (
        np.zeros(p.num_stages) if costs.grad_bytes is None else np.asarray(costs.grad_bytes, float)
    )
    update = shared_phase(
        np.bincount(p.stage_device, weights=column("update"), minlength=p.devices),
        sharing,
    )
    h = p.plan.header
    params = grads / costs.grad_reduce_bytes
    forward = None  # what an overlapped all-gather hides under; only then worth summing
    if h.overlap_param_gather and Zero(h.zero).gathers_parameters:
        forward = p.per_device(p.per_node(np.where(p.op_kind == _F, op_dur, 0.0)))
    weights = costs.param_bytes.weights if costs.param_bytes else costs.grad_reduce_bytes
    dpc = dp_comm(
        p,
        t,
        grads,
        h.zero,
        ranks,
        links.dp,
        pipeline_time,
        update,
        buckets(params, ranks),
        h.overlap_grad_reduce,
        h.overlap_param_gather,
        forward,
        params * weights,
        h.reduce_scatter,
        _expert_share(costs, grads),
        costs.ep,
        _tied(p, costs, links, ranks),
        dp_overlap_slowdown(costs.comm_sms, costs.sms, dp_inter, rails),
    )
    iteration_time = dpc.update_start + (
        float((update + dpc.gather_exposed).max(initial=0.0)) + costs.step_overhead
    )

    return SimResult(
        program=p,
        costs=costs,
        iteration_time=iteration_time,
        pipeline_time=pipeline_time,
        dp_comm=dpc,
        memory=memory(p, costs),
        seconds=time.perf_counter() - t0,
        op_dur=op_dur,
        node_dur=dur,
        start=t.start,
        end=t.end,
        pred=t.pred,
        msg_start=t.msg_start,
        msg_end=t.msg_end,
        msg_pred=t.msg_pred,
        stream_log=t.stream_log,
        update=update,
        links=links,
        deferred=Deferred(op_seconds, work, cut_time, op_comm is not None and bool(op_comm.any())),
    )


def _expert_share(costs: SimCosts, grads: np.ndarray) -> np.ndarray | None:
    """Per stage, the fraction of its gradient bytes that are routed experts' (None without
    expert parallelism)."""
    if costs.ep == 1 or costs.expert_grad_bytes is None:
        return None
    expert = np.asarray(costs.expert_grad_bytes, float)
    return np.divide(expert, grads, out=np.zeros_like(expert), where=grads > 0)


def _tied(p: SimProgram, costs: SimCosts, links: Links, ranks: int) -> TiedReduce | None:
    """The tied embeddings' all-reduce (dpcomm.py; None without a copy): a ring of two ranks
    on the link between the embedding's device and the head's (each tp rank reduces its own
    vocabulary slice), before the data-parallel reduction under DeepSpeed."""
    if costs.tied_stage < 0 or costs.tied_bytes <= 0:
        return None
    a, b = int(p.stage_device[0]), int(p.stage_device[costs.tied_stage])
    mesh = replace(Mesh.of(p.plan.header), dp=ranks)
    link = links.inter if mesh.crosses_nodes(a, b) else links.intra
    seconds = float(ring_reduction_time(np.array([costs.tied_bytes]), 2, link, 0)[0])
    first = costs.param_bytes is not None and costs.param_bytes.runtime == DEEPSPEED
    return TiedReduce(seconds, (a, b), first, link.name)


def _shared_durations(
    p: SimProgram, g: WalkGraph, sharing: Sharing, work: np.ndarray, t: Timeline
) -> np.ndarray:
    """Node durations under processor sharing given the last walk's Timeline `t` (sharing.py)."""
    if sharing.overlap_slowdown > 0 and p.num_messages:
        busy = comm_overlap(g, t)
        span = t.end - t.start
        work = work * (
            1
            + sharing.overlap_slowdown
            * np.divide(busy, span, out=np.zeros_like(span), where=span > 0)
        )
    cores = -1.0 if sharing.cores is None else float(sharing.cores)
    return stretch(t.start, t.end, work, cores, sharing.contention, sharing.oversubscription)


def warm_up() -> None:
    """Load the compiled walk and critical path (compile them, on a machine's first run: a few
    seconds, then cached on disk), so that timing a simulation afterwards times the
    simulation alone."""
    # zero 2 over two copies: every compiled loop runs, zero 2's reductions included.
    plan = Plan(
        Header(name="warm-up", devices=2, microbatches=1, dp=2, zero=2),
        [Stage(), Stage()],
        placement_loop(2, 2),
        [[Slot((Op(kind, d, 0),)) for kind in (OpKind.F, OpKind.BW)] for d in range(2)],
    )
    simulate(plan, uniform_stage_costs(2, 1.0, 1.0, 1.0), Link("warm-up", 1.0, 0.0)).critical_path()


def _deadlock(plan: Plan) -> SimDeadlock:
    result = execution_order(build_graph(plan))
    if result and isinstance(result[0], int):
        raise AssertionError("the walk stalled on a plan the dependency graph can run")
    return SimDeadlock(result)
