"""The one dependency graph of a plan, shared by lint, the simulator and the executor.

Nodes are slots (an overlap group is one node: its ops start together). Edges:
- data: F(s,m) after F(s-1,m); B or BW (s,m) after F(s,m) and after the input-gradient
  backward (B or BW) of (s+1,m); W(s,m) after B(s,m);
- order: each device runs its nodes in the order the plan lists them.
A data edge between nodes on different devices is a message: an activation (F -> F) or an
input gradient (B/BW -> B/BW). The graph lists its messages once (`Graph.messages`); the
simulator, the executor and the calibration read them there.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np

from .gcpause import paused_collection
from .limits import MAX_OPS
from .optable import BW, B, F, OpTable, W, op_table
from .plan import Op, OpKind, Plan

BACKWARD_INPUT = (OpKind.B, OpKind.BW)


class Edge(NamedTuple):
    """`consumer` (an op of node `dst`) needs the result of `producer` (an op of node `src`).
    A tuple, not a dataclass: a large plan has tens of thousands and the tuner builds graphs
    in a loop."""

    src: int
    dst: int
    producer: Op
    consumer: Op
    msg: int
    """Its index in Graph.messages when it crosses devices, else -1."""


class Message(NamedTuple):
    """A data edge between devices: `consumer` (of node `dst_node`, on device `dst`) needs the
    result of `producer` (of node `src_node`, on device `src`)."""

    src_node: int
    dst_node: int
    src: int
    dst: int
    producer: Op
    consumer: Op
    boundary: int
    """s when it crosses the cut between stages s and s + 1 (either direction): the stage
    whose output it carries, or whose output's gradient."""

    @property
    def activation(self) -> bool:
        """An activation (F -> F), else an input gradient (B/BW -> B/BW)."""
        return self.producer.kind is OpKind.F

    @property
    def mb(self) -> int:
        return self.producer.mb


@dataclass(frozen=True, slots=True)
class Wait:
    """In a deadlock: `op` on `device` cannot start until `needs` (on `needs_device`) is done."""

    device: int
    op: Op
    needs: Op
    needs_device: int
    blocker: Op | None
    """The op at the head of `needs_device` that `needs` is queued behind (None if the same)."""


@dataclass(slots=True)
class Graph:
    plan: Plan
    node_ops: list[tuple[Op, ...]]
    node_device: list[int]
    order: list[list[int]]
    """Node ids of each device, in the device's order."""
    deps: list[list[Edge]]
    """Data edges into each node."""
    op_node: dict[tuple[OpKind, int, int], int]
    messages: list[Message]
    """The data edges that cross devices, in the order of the edges (by consumer node)."""

    @property
    def num_nodes(self) -> int:
        return len(self.node_ops)


def producers(op: Op, num_stages: int) -> list[tuple[tuple[OpKind, ...], int, int]]:
    """The ops `op` needs, as (kinds, stage, mb): any one op of those kinds satisfies it."""
    s, m = op.stage, op.mb
    if op.kind is OpKind.F:
        return [(_FORWARD, s - 1, m)] if s > 0 else []
    if op.kind is OpKind.W:
        return [(_INPUT_GRAD_SPLIT, s, m)]
    needs: list[tuple[tuple[OpKind, ...], int, int]] = [(_FORWARD, s, m)]
    if s + 1 < num_stages:
        needs.append((BACKWARD_INPUT, s + 1, m))
    return needs


_FORWARD = (OpKind.F,)
_INPUT_GRAD_SPLIT = (OpKind.B,)


_Key = tuple[OpKind, int, int]


def build_graph(plan: Plan) -> Graph:
    """Build the graph of a plan. Ops whose producer is missing get no edge for it (lint reports
    the missing op); a duplicated op maps to its first occurrence."""
    with paused_collection():
        node_ops, node_device, order, op_node, first = _nodes(plan)
        deps, messages = _edges(plan.num_stages, node_ops, node_device, op_node, first)
    return Graph(plan, node_ops, node_device, order, deps, op_node, messages)


def _nodes(
    plan: Plan,
) -> tuple[list[tuple[Op, ...]], list[int], list[list[int]], dict[_Key, int], dict[_Key, Op]]:
    """The nodes' ops and devices, each device's node ids, and the node and op of each op's
    first occurrence."""
    node_ops: list[tuple[Op, ...]] = []
    node_device: list[int] = []
    order: list[list[int]] = []
    op_node: dict[_Key, int] = {}
    first: dict[_Key, Op] = {}
    for d, slots in enumerate(plan.schedule):
        n0 = len(node_ops)
        node_ops.extend(slot.ops for slot in slots)
        node_device.extend([d] * len(slots))
        order.append(list(range(n0, len(node_ops))))
        for n, slot in enumerate(slots, n0):
            for op in slot.ops:
                key = (op.kind, op.stage, op.mb)
                if key not in op_node:
                    op_node[key] = n
                    first[key] = op
    return node_ops, node_device, order, op_node, first


def _producer_keys(op: Op, S: int, op_node: dict[_Key, int]) -> tuple[_Key, ...]:
    """`producers` resolved to the op present for each need (or the first kind, when none is):
    a tuple per op, as a plan at the op limit has two million edges."""
    kind, s, m = op.kind, op.stage, op.mb
    if kind is OpKind.F:
        return ((OpKind.F, s - 1, m),) if s > 0 else ()
    if kind is OpKind.W:
        return ((OpKind.B, s, m),)
    if s + 1 < S:
        key = (OpKind.B, s + 1, m)
        return ((OpKind.F, s, m), key if key in op_node else (OpKind.BW, s + 1, m))
    return ((OpKind.F, s, m),)


def _edges(
    S: int,
    node_ops: list[tuple[Op, ...]],
    node_device: list[int],
    op_node: dict[_Key, int],
    first: dict[_Key, Op],
) -> tuple[list[list[Edge]], list[Message]]:
    deps: list[list[Edge]] = []
    messages: list[Message] = []
    get = op_node.get
    # tuple.__new__ rather than the NamedTuples' constructors, whose argument handling costs
    # three times as much.
    new = tuple.__new__
    for n, ops in enumerate(node_ops):
        edges: list[Edge] = []
        d = node_device[n]
        for op in ops:
            for key in _producer_keys(op, S, op_node):
                src = get(key)
                if src is None:
                    continue
                producer = first[key]
                if node_device[src] == d:
                    edges.append(new(Edge, (src, n, producer, op, -1)))
                else:
                    edges.append(new(Edge, (src, n, producer, op, len(messages))))
                    messages.append(
                        new(
                            Message,
                            (src, n, node_device[src], d, producer, op, min(key[1], op.stage)),
                        )
                    )
        deps.append(edges)
    return deps, messages


def deadlock(plan: Plan) -> list[Wait] | None:
    """The wait-for cycle of `execution_order`, or None when the plan runs. Walks node ids
    alone, without the graph's edge and message objects (lint's check of a plan at the op
    limit); builds the graph only to describe a cycle.

    Where the walk stops does not depend on the order it visits the devices in (running a node
    never stops another from running), so the array walk (`_stuck`), used whenever every op is
    inside the plan's stages and micro-batches, stops where `_walk` does."""
    with paused_collection():
        pos = _stuck(plan)
        if pos is None:
            walked = _walk_ids(plan)
        elif all(p == len(slots) for p, slots in zip(pos, plan.schedule, strict=True)):
            walked = []
        else:
            walked = (_done_before(plan, pos), pos)
    if isinstance(walked, list):
        return None
    return _cycle(build_graph(plan), *walked)  # the graph's edges are these sources, in order


def _walk_ids(plan: Plan) -> list[int] | tuple[bytearray, list[int]]:
    """`_walk` over each node's producer ids (the reference the array walk keeps to)."""
    node_ops, _, order, op_node, _ = _nodes(plan)
    S, get = plan.num_stages, op_node.get
    sources = [
        [
            src
            for op in ops
            for key in _producer_keys(op, S, op_node)
            if (src := get(key)) is not None
        ]
        for ops in node_ops
    ]
    return _walk(order, sources, len(node_ops), _first_pending_id)


def _done_before(plan: Plan, pos: list[int]) -> bytearray:
    """`_walk`'s done flags for a walk stopped at `pos`: the nodes before each device's position."""
    done = bytearray()
    for p, slots in zip(pos, plan.schedule, strict=True):
        done += b"\1" * p + b"\0" * (len(slots) - p)
    return done


def _stuck(plan: Plan) -> list[int] | None:
    """Each device's position where `_walk` stops (its length when the plan runs), over integer
    arrays; None when an op's stage or micro-batch is outside the plan, or when stages x
    micro-batches exceed MAX_OPS (the node table would have 4 x S x M entries): the ids walk then."""
    table = op_table(plan)
    S, M = plan.num_stages, plan.microbatches
    keys = table.keys(S, M) if S * M <= MAX_OPS else None
    if keys is None:
        return None
    producers = _producer_nodes(table, keys, S, M)
    return _walk_arrays(table, producers)


def _producer_nodes(
    table: OpTable, keys: np.ndarray, S: int, M: int
) -> tuple[list[int], list[int], dict[int, list[int]]]:
    """The nodes each node needs done first, as `_producer_keys` resolves them: two per node
    (-1 for none), and for an overlap group the list of all its ops' (its two are then -2)."""
    found, first = np.unique(keys, return_index=True)
    node_of = np.full(4 * S * M, -1, np.int64)
    node_of[found] = table.node[first]  # a duplicated op counts at its first occurrence

    def at(kind: int, stage: np.ndarray, mb: np.ndarray) -> np.ndarray:
        return node_of[(kind * S + stage) * M + mb]

    kind, stage, mb = table.kind, table.stage, table.mb
    p1 = np.full(len(kind), -1, np.int64)
    p2 = np.full(len(kind), -1, np.int64)
    fwd = (kind == F) & (stage > 0)
    p1[fwd] = at(F, stage[fwd] - 1, mb[fwd])
    wgt = kind == W
    p1[wgt] = at(B, stage[wgt], mb[wgt])
    bwd = (kind == B) | (kind == BW)
    p1[bwd] = at(F, stage[bwd], mb[bwd])
    nxt = bwd & (stage + 1 < S)
    split = at(B, stage[nxt] + 1, mb[nxt])
    p2[nxt] = np.where(split >= 0, split, at(BW, stage[nxt] + 1, mb[nxt]))
    if len(kind) == table.num_nodes:  # one op per node
        return p1.tolist(), p2.tolist(), {}
    groups: dict[int, list[int]] = {}
    for op, n in enumerate(table.node.tolist()):
        groups.setdefault(n, []).extend(int(p) for p in (p1[op], p2[op]) if p >= 0)
    n1 = np.full(table.num_nodes, -1, np.int64)
    n2 = np.full(table.num_nodes, -1, np.int64)
    alone = np.bincount(table.node, minlength=table.num_nodes) == 1
    single = alone[table.node]
    n1[table.node[single]], n2[table.node[single]] = p1[single], p2[single]
    n1[~alone] = n2[~alone] = -2
    return n1.tolist(), n2.tolist(), {n: groups[n] for n in np.flatnonzero(~alone).tolist()}


def _walk_arrays(
    table: OpTable, producers: tuple[list[int], list[int], dict[int, list[int]]]
) -> list[int]:
    """`_walk` over the nodes' producers (nodes are numbered device by device, so a device's
    position is a node id); each device's position where it stopped."""
    p1, p2, groups = producers
    done = bytearray(table.num_nodes)
    pos = [r.start for r in table.device_nodes]
    ends = [r.stop for r in table.device_nodes]
    waiting: dict[int, list[int]] = {}
    stack = list(range(len(pos) - 1, -1, -1))
    while stack:
        d = stack.pop()
        i, end = pos[d], ends[d]
        while i < end:
            a, b = p1[i], p2[i]
            if a == -2:
                a = next((p for p in groups[i] if not done[p]), -1)
                b = -1
            if a >= 0 and not done[a]:
                waiting.setdefault(a, []).append(d)
                break
            if b >= 0 and not done[b]:
                waiting.setdefault(b, []).append(d)
                break
            done[i] = 1
            if waiting:
                woken = waiting.pop(i, None)
                if woken:
                    stack.extend(woken)
            i += 1
        pos[d] = i
    return [p - r.start for p, r in zip(pos, table.device_nodes, strict=True)]


def execution_order(g: Graph) -> list[int] | list[Wait]:
    """A topological order that respects every device's order, or the wait-for cycle.

    Returns node ids in an order in which they can run; when the devices' orders admit no
    execution, returns the cycle as a list of `Wait`s (each device waiting on the next)."""
    walked = _walk(g.order, g.deps, g.num_nodes, _first_pending)
    if isinstance(walked, list):
        return walked
    return _cycle(g, *walked)


_Pending = Callable[[Any, bytearray], int]


def _walk(
    order: list[list[int]], deps: Sequence[Any], num_nodes: int, first_pending: _Pending
) -> list[int] | tuple[bytearray, list[int]]:
    """Run each device's nodes in order while their inputs are done: the order it found, or
    where it got stuck (done, each device's position). `first_pending(deps[n], done)` is the
    first node that node n waits for, or -1."""
    done = bytearray(num_nodes)
    pos = [0] * len(order)
    waiting: dict[int, list[int]] = {}
    out: list[int] = []
    stack = list(range(len(order) - 1, -1, -1))
    while stack:
        d = stack.pop()
        seq = order[d]
        i = pos[d]
        while i < len(seq):
            n = seq[i]
            blocked = first_pending(deps[n], done)
            if blocked >= 0:
                waiting.setdefault(blocked, []).append(d)
                break
            done[n] = 1
            out.append(n)
            i += 1
            woken = waiting.pop(n, None)
            if woken:
                stack.extend(woken)
        pos[d] = i
    return out if len(out) == num_nodes else (done, pos)


def _first_pending(edges: list[Edge], done: bytearray) -> int:
    """The source of the first edge not yet done, or -1. A loop, not next() over a generator,
    which costs twice as much once per node of a plan at the op limit."""
    for e in edges:
        if not done[e.src]:
            return e.src
    return -1


def _first_pending_id(sources: list[int], done: bytearray) -> int:
    for src in sources:
        if not done[src]:
            return src
    return -1


def _cycle(g: Graph, done: bytearray, pos: list[int]) -> list[Wait]:
    """Follow 'device d waits for device d2' from a stuck device until a device repeats."""

    def step(d: int) -> tuple[Wait, int]:
        n = g.order[d][pos[d]]
        edge = next(e for e in g.deps[n] if not done[e.src])
        d2 = g.node_device[edge.src]
        head = g.node_ops[g.order[d2][pos[d2]]][0] if pos[d2] < len(g.order[d2]) else None
        blocker = None if head is None or edge.src == g.order[d2][pos[d2]] else head
        return Wait(d, edge.consumer, edge.producer, d2, blocker), d2

    start = next(d for d in range(len(g.order)) if pos[d] < len(g.order[d]))
    seen: dict[int, int] = {}
    chain: list[Wait] = []
    d = start
    while d not in seen:
        seen[d] = len(chain)
        wait, d = step(d)
        chain.append(wait)
    return chain[seen[d] :]


def describe_cycle(cycle: list[Wait]) -> str:
    """One line per wait: 'B0:2 on device 0 waits for B1:2 on device 1 (queued behind F1:5)'."""
    lines = []
    for w in cycle:
        behind = f", queued behind {w.blocker}" if w.blocker is not None else ""
        if w.needs_device == w.device:
            where = (
                f"which comes later on device {w.device}"
                if w.blocker is not None
                else "in the same overlap group"
            )
            lines.append(f"{w.op} on device {w.device} waits for {w.needs}, {where}")
        else:
            lines.append(
                f"{w.op} on device {w.device} waits for {w.needs} on device {w.needs_device}{behind}"
            )
    return "\n".join(lines)
