"""Compile a plan into one rank's DeepSpeed instructions, from the plan's one DAG.

Every message is a cross-device data edge of `octodsl.dag` (an activation F -> F, or an input
gradient B/BW -> B/BW); nothing here re-derives dependencies. Why the instruction order cannot
deadlock, for any plan whose DAG admits an execution (what lint checks):
- a send is an isend issued right after its producer op and never waited on before the end of
  the step, so a sender never blocks;
- the messages from one device to another form a FIFO stream, in the order the sender runs
  their producers; the receiver posts its receives of that stream in the same order, before it
  needs them (a window ahead of the consumer), so each posted receive matches its own send;
- a rank blocks only waiting for a message its next op needs, whose producer comes earlier
  in the DAG's execution order. A cycle of such waits would be a cycle in the DAG plus the
  devices' orders, which lint has ruled out.
An overlap group whose ops run at once (RunGroup, lanes.py) is one node of the DAG: its
messages are all received before it starts and sent once both ops end, so the same holds.
Posting receives a few slots ahead and sending at once overlaps communication with compute
and keeps each message's span short.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from deepspeed.runtime.pipe import schedule as ds

from ..dag import Graph, build_graph
from ..plan import Op, OpKind, Plan, Slot

LOOKAHEAD = 2
"""Slots ahead of the current one whose incoming messages are posted."""


@dataclass(frozen=True, slots=True)
class Message:
    """A message of the plan's graph (octodsl.dag.Message) as the executor sends it: the result
    of `producer` on device `src`, which `consumer` on device `dst` needs. `id` orders the
    messages of each (src, dst) stream as sent."""

    id: int
    src: int
    dst: int
    producer: Op
    consumer: Op
    act: bool
    """An activation (else an input gradient)."""
    boundary: int
    """The stage whose output this carries (or whose output's gradient)."""

    @property
    def mb(self) -> int:
        return self.producer.mb


def plan_messages(g: Graph) -> list[Message]:
    """Every message of the plan, numbered stream by stream in each sender's order."""
    pos = {n: i for order in g.order for i, n in enumerate(order)}
    sent = sorted(
        g.messages,
        key=lambda m: (m.src, m.dst, pos[m.src_node], g.node_ops[m.src_node].index(m.producer)),
    )
    return [
        Message(i, m.src, m.dst, m.producer, m.consumer, m.activation, m.boundary)
        for i, m in enumerate(sent)
    ]


# Instructions (run by OctoPipeEngine through DeepSpeed's instruction map).
class LoadMicroBatch(ds.PipeInstruction):
    """Draw micro-batch `mb` from the data iterator (inputs and/or labels)."""


class PostRecvs(ds.PipeInstruction):
    """Post the receives of messages `ids` (and those before them on their streams)."""


class Recv(ds.PipeInstruction):
    """Wait for message `msg` and hand its tensors to the consumer."""


class Send(ds.PipeInstruction):
    """isend message `msg` (its producer has just run)."""


class RunOp(ds.PipeInstruction):
    """Compute `op`: F, B, W or BW of one stage and micro-batch."""


class RunGroup(ds.PipeInstruction):
    """Compute the ops of an overlap group at once (`ops`: a forward and a backward; lanes.py)."""


class FinishSends(ds.PipeInstruction):
    """Wait until every send of the step has completed."""


def forward_only(plan: Plan) -> Plan:
    """The plan's forwards in the same orders (eval): removing backward ops keeps the orders
    executable, since forwards depend on forwards only."""
    schedule = [
        [
            Slot(tuple(op for op in slot.ops if op.kind is OpKind.F), slot.span)
            for slot in slots
            if any(op.kind is OpKind.F for op in slot.ops)
        ]
        for slots in plan.schedule
    ]
    return Plan(plan.header, plan.stages, plan.placement, schedule)


class PlanSchedule(ds.PipeSchedule):
    """One rank's instructions for one step of `plan`, a list per slot of the plan.

    Each slot: post the receives of the next LOOKAHEAD slots, wait for this slot's messages,
    draw the micro-batches its forwards need, run its ops and send their results. After the
    last slot: wait for the sends; in training, reduce tied and data-parallel gradients and
    step the optimizer. An overlap group that `at_once` accepts is one RunGroup, after the
    micro-batches of its forwards are drawn and before its ops' sends; any other group runs its
    ops in turn, each op as a slot of its own would."""

    def __init__(
        self,
        plan: Plan,
        device: int,
        train: bool,
        at_once: Callable[[tuple[Op, ...]], bool] = lambda ops: False,
    ):
        super().__init__(micro_batches=plan.microbatches, stages=plan.num_stages, stage_id=device)
        self.plan = plan if train else forward_only(plan)
        self.graph = build_graph(self.plan)
        self.messages = plan_messages(self.graph)
        self.train = train
        self._at_once = at_once
        self._steps = self._compile(device)

    def num_pipe_buffers(self) -> int:
        return 0  # the engine keeps its own per-(stage, micro-batch) state

    def steps(self):
        yield from self._steps

    def _compile(self, d: int) -> list[list[ds.PipeInstruction]]:
        g = self.graph
        steps = []
        last = self.plan.num_stages - 1
        recv_at: dict[int, list[Message]] = {}
        send_of: dict[tuple, Message] = {}
        for m in self.messages:
            if m.dst == d:
                recv_at.setdefault(g.op_node[m.consumer.key()], []).append(m)
            if m.src == d:
                send_of[m.producer.key()] = m
        order = g.order[d]
        drawn = 0
        for i, node in enumerate(order):
            cmds: list[ds.PipeInstruction] = []
            ahead = [m.id for n in order[i : i + 1 + LOOKAHEAD] for m in recv_at.get(n, ())]
            if ahead:
                cmds.append(PostRecvs(ids=tuple(ahead)))
            cmds += [Recv(msg=m) for m in recv_at.get(node, ())]
            ops = g.node_ops[node]
            at_once = len(ops) > 1 and self._at_once(ops)
            for op in ops:
                if op.kind is OpKind.F and op.stage in (0, last):
                    while drawn <= op.mb:  # micro-batches come from the iterator in order
                        cmds.append(LoadMicroBatch(mb=drawn))
                        drawn += 1
                if not at_once:
                    cmds.append(RunOp(op=op))
                    if op.key() in send_of:
                        cmds.append(Send(msg=send_of[op.key()]))
            if at_once:
                cmds.append(RunGroup(ops=ops))
                cmds += [Send(msg=send_of[op.key()]) for op in ops if op.key() in send_of]
            steps.append(cmds)
        cmds = [FinishSends()]
        if self.train:
            cmds += [ds.ReduceTiedGrads(), ds.ReduceGrads(), ds.OptimizerStep()]
        return steps + [cmds]
