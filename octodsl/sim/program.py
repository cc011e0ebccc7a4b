"""`compile(plan) -> SimProgram`: the plan's dependency graph as flat integer arrays.

A program holds no costs, so one compiled plan serves any number of cost tables (a partition
change only changes costs). `compile(new_plan, like=old)` reuses `old` when only the order of
ops on some devices changed, the tuner's most common move, without rebuilding the graph.
"""

from __future__ import annotations

import functools
import itertools
from collections import OrderedDict
from dataclasses import dataclass, field, replace
from operator import attrgetter, itemgetter
from typing import NamedTuple

import numpy as np

from ..dag import build_graph
from ..gcpause import paused_collection
from ..mesh import Mesh
from ..optable import KIND_CODE, KIND_OF_CODE
from ..plan import Op, OpKind, Plan, PlanError, Slot
from .core import WalkGraph
from .jit import njit
from .links import cut_crosses_nodes, dp_rails, dp_spans_nodes

_I = np.int64
_KIND_TEXT = tuple(kind.value for kind in KIND_OF_CODE)
"""Each kind code's text in op labels."""


class CodedOrders(list):
    """A plan's device orders (`Plan.schedule`) that also hold each slot's op as arrays, as a
    list scheduler builds them: `codes` is (kind code, stage, micro-batch), device 0's slots,
    then device 1's, ... `compile(plan, like=...)` then finds the nodes of a plan whose every
    device order changed by indexing, instead of looking up each of its thousands of slots.
    Only for orders of single-op slots. A device's order is never edited in place (no plan's
    is, once compiled); a change to the list of orders itself drops `codes` (None)."""

    codes: tuple[np.ndarray, np.ndarray, np.ndarray] | None

    def __init__(self, orders, codes: tuple[np.ndarray, np.ndarray, np.ndarray]) -> None:
        super().__init__(orders)
        self.codes = codes


def _forgetting(name: str):
    """list's method `name`, dropping the orders' codes first."""
    method = getattr(list, name)

    def forget(self, *args, **kwargs):
        self.codes = None
        return method(self, *args, **kwargs)

    return forget


for _name in (
    "__setitem__",
    "__delitem__",
    "__iadd__",
    "__imul__",
    "append",
    "extend",
    "insert",
    "pop",
    "remove",
    "reverse",
    "sort",
    "clear",
):
    setattr(CodedOrders, _name, _forgetting(_name))


_PLANS = 4
"""Plans whose device orders `SlotNodes.remember` keeps."""


@dataclass(frozen=True, eq=False)
class SlotNodes:
    """The node of each slot of the plan a program was compiled from, by the slot's identity:
    the tuner's plans share their slot objects, so `compile(plan, like=...)` finds a reordered
    plan's nodes in one pass of C loops instead of hashing thousands of slots. `slots` keeps
    those objects alive, so no other object can take one of their ids."""

    slots: list[Slot]
    labels: dict[int, str] = field(default_factory=dict)
    """`SimProgram.node_label` of the nodes labelled so far: a node's ops are the same in
    every program reordered from one compile, and critical paths label thousands."""
    by_op: dict[str, np.ndarray] = field(default_factory=dict)
    """'table': [kind code, stage, micro-batch] -> node (-1: none), once `op_table` built it;
    'per_op': each op's place in `SimProgram.of_kind`'s table, once it was built."""
    orders: OrderedDict[int, tuple[list[Slot], np.ndarray]] = field(default_factory=OrderedDict)
    """The device orders of the latest programs, by identity, with their nodes: a schedule
    move copies a plan's orders but one, so a candidate shares most of its orders with a plan
    compiled before it (not always the last one, which `compile`'s `like` compares with).
    Holds the lists, so no other object can take one of their ids."""

    def remember(self, orders: list[list[Slot]], order_ptr: np.ndarray, nodes: np.ndarray) -> None:
        """Keep each device order of a compiled plan with its nodes: those of the latest
        `_PLANS` plans (orders a candidate shares with its parent come back with each of its
        siblings)."""
        for d, order in enumerate(orders):
            self.orders[id(order)] = (order, nodes[order_ptr[d] : order_ptr[d + 1]])
            self.orders.move_to_end(id(order))
        while len(self.orders) > _PLANS * len(orders):
            self.orders.popitem(last=False)

    def known(self, order: list[Slot]) -> np.ndarray | None:
        """The nodes of a device order `remember` kept, by identity; else None."""
        hit = self.orders.get(id(order))
        return hit[1] if hit is not None and hit[0] is order else None

    @classmethod
    def of(cls, slots: list[Slot]) -> SlotNodes:
        """For the slots of nodes 0, 1, ... in order."""
        return cls(slots)

    @functools.cached_property
    def by_id(self) -> dict[int, int]:
        """Slot identity -> node, made when `find` first needs it: a list-scheduled plan's
        nodes are found by their ops (`op_table`), so many programs never need it."""
        return dict(zip(map(id, self.slots), range(len(self.slots)), strict=True))

    def find(self, orders: list[list[Slot]], count: int) -> np.ndarray | None:
        """The node of each of the `count` slots of `orders` (device orders), one order after
        the other; None when some slot is none of these objects."""
        try:
            return np.fromiter(
                map(self.by_id.__getitem__, map(id, itertools.chain.from_iterable(orders))),
                _I,
                count,
            )
        except KeyError:
            return None

    def op_table(self, program: SimProgram) -> np.ndarray:
        """[kind code, stage, micro-batch] -> the node of that op in a program of single-op
        nodes compiled from the plan these slots came from (-1: none)."""
        table = self.by_op.get("table")
        if table is None:
            table = np.full((len(KIND_CODE), program.num_stages, program.microbatches), -1, _I)
            table[program.op_kind, program.op_stage, program.op_mb] = np.arange(
                program.num_nodes, dtype=_I
            )
            self.by_op["table"] = table
        return table


@njit
def _coded_nodes(table, kind, stage, mb, node_dev, old_nodes):
    """(ok, the node of each op of `kind`, `stage`, `mb` by `table` (SlotNodes.op_table)): ok
    when every op is one of the table's, and they run every node once, each in the place of a
    node of its device in `old_nodes` (a program's device orders)."""
    n = kind.shape[0]
    out = np.empty(n, np.int64)
    if n != old_nodes.shape[0]:
        return False, out
    seen = np.zeros(n, np.bool_)
    K, S, M = table.shape
    for i in range(n):
        k, s, m = kind[i], stage[i], mb[i]
        if k < 0 or k >= K or s < 0 or s >= S or m < 0 or m >= M:
            return False, out
        v = table[k, s, m]
        if v < 0 or seen[v] or node_dev[v] != node_dev[old_nodes[i]]:
            return False, out
        seen[v] = True
        out[i] = v
    return True, out


def group_seconds(compute, comm, longest):
    """An overlap group's seconds from its ops' compute summed, their communication summed and
    its longest op (`SimProgram.per_slot`'s rule, in one place). Arrays or floats."""
    return np.maximum(np.maximum(compute, comm), longest)


@dataclass(frozen=True, eq=False)
class SimProgram:
    """Nodes are the graph's nodes (one per slot; an overlap group's ops start together).
    Arrays ending in _ptr are CSR offsets: device d's nodes are
    order_nodes[order_ptr[d]:order_ptr[d + 1]], node n's ops op_ptr[n]:op_ptr[n + 1]."""

    plan: Plan
    stage_device: np.ndarray
    split: np.ndarray
    """Per stage: True when it splits its backward into B and W."""
    order_ptr: np.ndarray
    order_nodes: np.ndarray
    node_dev: np.ndarray
    op_ptr: np.ndarray
    grouped: bool
    """Whether some node is an overlap group of several ops."""
    op_kind: np.ndarray
    op_stage: np.ndarray
    op_mb: np.ndarray
    in_deg: np.ndarray
    """Data edges into each node, local and cross-device."""
    out_ptr: np.ndarray
    out_dst: np.ndarray
    out_msg: np.ndarray
    """Per out-edge: the message id when the edge crosses devices, else -1."""
    msg_src_node: np.ndarray
    msg_dst_node: np.ndarray
    msg_src_dev: np.ndarray
    msg_dst_dev: np.ndarray
    msg_hold: np.ndarray
    """Per message: the sender's node after its producer, which waits for the send to finish
    (the plan's `overlap_p2p_comm` false: blocking sends), else -1."""
    msg_kind: np.ndarray
    msg_stage: np.ndarray
    msg_mb: np.ndarray
    """Per message: the producing op (a kind code, stage, micro-batch)."""
    msg_boundary: np.ndarray
    """Per message: s when it crosses the cut between stages s and s + 1 (either direction)."""
    stream_ptr: np.ndarray
    """Per stream (2d: device d's sends, 2d + 1: its receives; core.send_stream): room for
    every message it carries."""
    cut_inter: np.ndarray
    """Per stage s: True when messages across the cut s|s+1 leave a node (links.py)."""
    dp_inter: np.ndarray
    """Per device: True when its data-parallel group spans nodes (links.py)."""
    dp_rails: np.ndarray
    """Per device: its data-parallel group's GPUs per node (links.py)."""
    slot_nodes: SlotNodes
    """Of the plan compiled from scratch; programs reordered from it share it."""

    @property
    def devices(self) -> int:
        return len(self.order_ptr) - 1

    @property
    def num_stages(self) -> int:
        return len(self.stage_device)

    @property
    def num_nodes(self) -> int:
        return len(self.node_dev)

    @property
    def num_messages(self) -> int:
        return len(self.msg_dst_node)

    @property
    def microbatches(self) -> int:
        return self.plan.microbatches

    @functools.cached_property
    def walk_graph(self) -> WalkGraph:
        """The arrays the walk reads, by name."""
        return WalkGraph(*(getattr(self, name) for name in WalkGraph._fields))

    def per_op(self, f: np.ndarray, b: np.ndarray, w: np.ndarray, bw: np.ndarray) -> np.ndarray:
        """Per op: the per-stage value of its kind (F, B, W or fused BW) at its stage."""
        return self.of_kind(np.stack([f, b, w, bw], axis=1))

    def of_kind(self, table: np.ndarray) -> np.ndarray:
        """Per op: table[its stage, its kind code], of a table with a row per stage and a
        column per kind (F, B, W, BW)."""
        at = self.slot_nodes.by_op.get("per_op")
        if at is None:  # the ops' places in the flat table, the same for every reorder
            at = self.slot_nodes.by_op["per_op"] = self.op_stage * 4 + self.op_kind
        return table.ravel().take(at)

    def per_node(self, per_op: np.ndarray) -> np.ndarray:
        """Sum a per-op array over each node's ops."""
        return np.add.reduceat(per_op, self.op_ptr[:-1]) if self.grouped else per_op

    def per_device(self, per_node: np.ndarray) -> np.ndarray:
        """Sum a per-node array over each device's nodes, in the plan's order: a program
        reused for a reordered plan (`compile(plan, like=)`) numbers its nodes as it did the
        old plan's, and a sum in their numbers' order would round otherwise than a fresh
        compile's (the tuner's choices between devices that tie must not hang on it)."""
        nodes = self.order_nodes
        return np.bincount(self.node_dev[nodes], weights=per_node[nodes], minlength=self.devices)

    def per_slot(self, seconds: np.ndarray, comm: np.ndarray) -> np.ndarray:
        """Per node: the seconds its ops take together. An op's `seconds` include `comm` of
        communication (its expert all-to-alls) that the other ops of an overlap group can hide,
        but not the op itself, whose compute waits for it: the group shares one compute stream
        and one communication stream, so it takes the longest of its compute summed, its
        communication summed and its longest op (DualPipe's rule: one micro-batch's all-to-all
        under another's compute, DeepSeek-V3 report, Sec. 3.2.1). Never more than the sum; a lone
        op takes its seconds."""
        if not self.grouped:
            return seconds
        starts = self.op_ptr[:-1]
        return group_seconds(
            np.add.reduceat(seconds - comm, starts),
            np.add.reduceat(comm, starts),
            np.maximum.reduceat(seconds, starts),
        )

    def node_labels(self, nodes: np.ndarray) -> list[str]:
        """`node_label` of each of `nodes`, the single ops' made together (a critical path
        labels hundreds)."""
        if self.grouped:
            return [self.node_label(n) for n in nodes.tolist()]
        labels = self.slot_nodes.labels
        ops = self.op_ptr[nodes]
        made = op_labels(self.op_kind[ops], self.op_stage[ops], self.op_mb[ops])
        out = []
        for n, label in zip(nodes.tolist(), made, strict=True):
            out.append(labels.setdefault(n, label))
        return out

    def msg_labels(self, msgs: np.ndarray) -> list[str]:
        """The label of each message's producer (`msg_producer`), of each of `msgs`."""
        return op_labels(self.msg_kind[msgs], self.msg_stage[msgs], self.msg_mb[msgs])

    def op(self, k: int) -> Op:
        """Op k, in the numbering of op_ptr."""
        return Op(KIND_OF_CODE[self.op_kind[k]], int(self.op_stage[k]), int(self.op_mb[k]))

    def msg_producer(self, m: int) -> Op:
        """The op whose result message m carries: F3:5 its activation, B4:5 its input gradient."""
        return Op(KIND_OF_CODE[self.msg_kind[m]], int(self.msg_stage[m]), int(self.msg_mb[m]))

    def node_label(self, n: int) -> str:
        """'F3:5', or '(F0:7 & B7:3)' for an overlap group: the node's slot as plans write it."""
        labels = self.slot_nodes.labels
        label = labels.get(n)
        if label is None:
            first, end = int(self.op_ptr[n]), int(self.op_ptr[n + 1])
            if end - first == 1:
                label = op_labels(
                    self.op_kind[first:end], self.op_stage[first:end], self.op_mb[first:end]
                )[0]
            else:
                label = str(Slot(tuple(self.op(k) for k in range(first, end))))
            labels[n] = label
        return label


def op_labels(kind: np.ndarray, stage: np.ndarray, mb: np.ndarray) -> list[str]:
    """Op.label of each op (kind codes, stages, micro-batches), without making the ops."""
    return [
        f"{_KIND_TEXT[k]}{s}:{m}"
        for k, s, m in zip(kind.tolist(), stage.tolist(), mb.tolist(), strict=True)
    ]


def compile(plan: Plan, like: SimProgram | None = None) -> SimProgram:  # noqa: A001 - the API's name
    """Compile a plan that lints clean (structure-wise; a deadlock is reported by `simulate`).
    With `like`, reuse it when the plan differs from like.plan only in the order of ops within
    devices; otherwise build from scratch. A plan is a value: its device orders are not edited
    in place once compiled (a reordered plan's order that is like.plan's very list keeps its
    nodes)."""
    if like is not None:
        reused = _reorder(plan, like)
        if reused is not None:
            return reused
    if len(plan.schedule) != plan.devices:
        raise PlanError(
            f"the schedule has {len(plan.schedule)} device blocks for {plan.devices} devices"
        )
    stage_device = np.array(plan.stage_device(), _I)
    with paused_collection():
        return _compile(plan, stage_device)


class _Graph(NamedTuple):
    """The dependency graph's arrays. Nodes are numbered in device order (device 0's slots,
    then device 1's, ...); edges run consumer node by consumer node, each node's producers in
    `dag.producers`' order, and messages are numbered in edge order (as `Graph.messages`)."""

    op_ptr: np.ndarray
    op_kind: np.ndarray
    op_stage: np.ndarray
    op_mb: np.ndarray
    src: np.ndarray
    dst: np.ndarray
    edge_msg: np.ndarray
    msg_kind: np.ndarray
    msg_stage: np.ndarray
    msg_mb: np.ndarray
    msg_boundary: np.ndarray


def _compile(plan: Plan, stage_device: np.ndarray) -> SimProgram:
    P = plan.devices
    order_ptr = np.zeros(P + 1, _I)
    order_ptr[1:] = np.cumsum([len(o) for o in plan.schedule])
    N = int(order_ptr[-1])
    order_nodes = np.arange(N, dtype=_I)
    node_dev = np.repeat(np.arange(P, dtype=_I), np.diff(order_ptr))
    slots = [slot for order in plan.schedule for slot in order]  # one per node
    g = _graph_of_ops(plan, slots, node_dev)
    if g is None:
        g = _graph(plan)
    src, dst, edge_msg = g.src, g.dst, g.edge_msg
    by_src = np.argsort(src, kind="stable")
    out_ptr = np.zeros(N + 1, _I)
    out_ptr[1:] = np.cumsum(np.bincount(src, minlength=N))

    M = len(g.msg_kind)
    is_msg = edge_msg >= 0  # in edge order, as the messages are numbered
    msg_src_node, msg_dst_node = src[is_msg], dst[is_msg]
    msg_src_dev, msg_dst_dev = node_dev[msg_src_node], node_dev[msg_dst_node]
    stream_ptr = np.zeros(2 * P + 1, _I)
    counts = np.stack(
        [np.bincount(msg_src_dev, minlength=P), np.bincount(msg_dst_dev, minlength=P)], axis=1
    )
    stream_ptr[1:] = np.cumsum(counts.ravel())
    msg_hold = np.full(M, -1, _I)
    in_deg = np.bincount(dst, minlength=N).astype(_I)
    if not plan.header.overlap_p2p_comm and M:
        after = np.full(N, -1, _I)  # each node's successor on its device
        consecutive = order_nodes[1:]
        same = np.repeat(np.arange(P), np.diff(order_ptr))
        keep = same[1:] == same[:-1]
        after[order_nodes[:-1][keep]] = consecutive[keep]
        msg_hold = after[msg_src_node]
        in_deg += np.bincount(msg_hold[msg_hold >= 0], minlength=N).astype(_I)
    split = np.zeros(plan.num_stages, bool)
    # as Plan.split_stages, from the arrays
    split[g.op_stage[g.op_kind == KIND_CODE[OpKind.W]]] = True
    mesh = Mesh.of(plan.header)
    slot_nodes = SlotNodes.of(slots)
    slot_nodes.remember(plan.schedule, order_ptr, order_nodes)
    return SimProgram(
        plan=plan,
        stage_device=stage_device,
        split=split,
        order_ptr=order_ptr,
        order_nodes=order_nodes,
        node_dev=node_dev,
        op_ptr=g.op_ptr,
        grouped=len(g.op_kind) > N,
        op_kind=g.op_kind,
        op_stage=g.op_stage,
        op_mb=g.op_mb,
        in_deg=in_deg,
        out_ptr=out_ptr,
        out_dst=dst[by_src],
        out_msg=edge_msg[by_src],
        msg_src_node=msg_src_node,
        msg_dst_node=msg_dst_node,
        msg_src_dev=msg_src_dev,
        msg_dst_dev=msg_dst_dev,
        msg_hold=msg_hold,
        msg_kind=g.msg_kind,
        msg_stage=g.msg_stage,
        msg_mb=g.msg_mb,
        msg_boundary=g.msg_boundary,
        stream_ptr=stream_ptr,
        cut_inter=cut_crosses_nodes(mesh, stage_device),
        dp_inter=dp_spans_nodes(mesh),
        dp_rails=dp_rails(mesh),
        slot_nodes=slot_nodes,
    )


def _graph(plan: Plan) -> _Graph:
    """The arrays of `dag.build_graph`'s graph: any plan (overlap groups, missing or repeated
    ops)."""
    g = build_graph(plan)
    N = g.num_nodes
    op_ptr = np.zeros(N + 1, _I)
    op_ptr[1:] = np.cumsum([len(ops) for ops in g.node_ops])
    flat = [op for ops in g.node_ops for op in ops]
    K = len(flat)
    edges = [e for es in g.deps for e in es]
    E = len(edges)
    messages = g.messages
    M = len(messages)
    return _Graph(
        op_ptr,
        np.fromiter((KIND_CODE[op.kind] for op in flat), _I, K),
        np.fromiter((op.stage for op in flat), _I, K),
        np.fromiter((op.mb for op in flat), _I, K),
        np.fromiter((e.src for e in edges), _I, E),
        np.fromiter((e.dst for e in edges), _I, E),
        np.fromiter((e.msg for e in edges), _I, E),
        np.fromiter((KIND_CODE[m.producer.kind] for m in messages), _I, M),
        np.fromiter((m.producer.stage for m in messages), _I, M),
        np.fromiter((m.producer.mb for m in messages), _I, M),
        np.fromiter((m.boundary for m in messages), _I, M),
    )


_F, _B, _W, _BW = (KIND_CODE[k] for k in (OpKind.F, OpKind.B, OpKind.W, OpKind.BW))


def _graph_of_ops(plan: Plan, slots: list[Slot], node_dev: np.ndarray) -> _Graph | None:
    """`_graph` for a plan whose every slot is one op, each op of its stages and micro-batches
    once (every plan the tuner makes), from arrays: thirty times faster than building the
    graph's objects. None for any other plan. It mirrors `dag._producer_keys` (F after the F
    of the stage before, W after its B, B after its F and the input gradient of the stage
    after; tests/sim/test_program.py holds the two equal)."""
    N, S, M = len(slots), plan.num_stages, plan.microbatches
    codes = getattr(plan.schedule, "codes", None)
    if codes is not None and all(len(c) == N for c in codes):
        kind, stage, mb = codes  # a list scheduler's (CodedOrders): single ops, at hand
    else:
        ops = list(map(attrgetter("ops"), slots))
        if (np.fromiter(map(len, ops), _I, N) != 1).any():
            return None
        single = list(map(itemgetter(0), ops))
        kind = np.fromiter(map(KIND_CODE.__getitem__, map(attrgetter("kind"), single)), _I, N)
        stage = np.fromiter(map(attrgetter("stage"), single), _I, N)
        mb = np.fromiter(map(attrgetter("mb"), single), _I, N)
    ok, *g = _op_graph(kind, stage, mb, node_dev, S, M, len(KIND_CODE))
    if not ok:
        return None
    return _Graph(np.arange(N + 1, dtype=_I), kind, stage, mb, *g)


@njit
def _op_graph(kind, stage, mb, node_dev, S, M, K):
    """(ok, `_graph_of_ops`' edges and messages) in one pass (a numpy expression for each took
    most of compiling a plan); not ok (and no edges) when some op is out of range or there
    twice."""
    N = kind.shape[0]
    none = np.empty(0, np.int64)
    node_of = np.full((K, S + 1, M), -1, np.int64)  # stage S: none, for s + 1 below
    for n in range(N):
        k, s, m = kind[n], stage[n], mb[n]
        if k < 0 or k >= K or s < 0 or s >= S or m < 0 or m >= M or node_of[k, s, m] >= 0:
            return False, none, none, none, none, none, none, none
        node_of[k, s, m] = n
    # each node's first producer, then its second (a backward's input gradient from s + 1)
    src = np.empty(2 * N, np.int64)
    dst = np.empty(2 * N, np.int64)
    p_kind = np.empty(2 * N, np.int64)
    p_stage = np.empty(2 * N, np.int64)
    E = 0
    for n in range(N):
        k, s, m = kind[n], stage[n], mb[n]
        first_kind = _B if k == _W else _F
        first_stage = s - 1 if k == _F else s
        if first_stage >= 0 and node_of[first_kind, first_stage, m] >= 0:
            src[E], dst[E] = node_of[first_kind, first_stage, m], n
            p_kind[E], p_stage[E] = first_kind, first_stage
            E += 1
        if (k == _B or k == _BW) and s + 1 < S:
            later = node_of[_B, s + 1, m]
            second_kind = _B
            if later < 0:
                later, second_kind = node_of[_BW, s + 1, m], _BW
            if later >= 0:
                src[E], dst[E] = later, n
                p_kind[E], p_stage[E] = second_kind, s + 1
                E += 1
    edge_msg = np.full(E, -1, np.int64)
    M_ = 0
    for e in range(E):
        if node_dev[src[e]] != node_dev[dst[e]]:
            edge_msg[e] = M_
            M_ += 1
    msg_kind = np.empty(M_, np.int64)
    msg_stage = np.empty(M_, np.int64)
    msg_mb = np.empty(M_, np.int64)
    msg_boundary = np.empty(M_, np.int64)
    for e in range(E):
        i = edge_msg[e]
        if i >= 0:
            msg_kind[i], msg_stage[i], msg_mb[i] = p_kind[e], p_stage[e], mb[dst[e]]
            msg_boundary[i] = min(p_stage[e], stage[dst[e]])
    return True, src[:E].copy(), dst[:E].copy(), edge_msg, msg_kind, msg_stage, msg_mb, msg_boundary


def _reorder(plan: Plan, like: SimProgram) -> SimProgram | None:
    """`like` with the device orders of `plan`, when every device runs the same slots as in
    like.plan (same partition, placement and mesh); None when anything else changed."""
    old = like.plan
    if not plan.header.overlap_p2p_comm or not old.header.overlap_p2p_comm:
        return None  # which node a send holds back depends on the order
    if (
        Mesh.of(plan.header) != Mesh.of(old.header)
        or plan.devices != old.devices
        or plan.num_stages != old.num_stages
        or plan.microbatches != old.microbatches
        or sorted((p.device, p.stages) for p in plan.placement)
        != sorted((p.device, p.stages) for p in old.placement)
        or len(plan.schedule) != len(old.schedule)
    ):
        return None
    if [len(slots) for slots in plan.schedule] != np.diff(like.order_ptr).tolist():
        return None
    # A device whose order is the very list of like.plan keeps its nodes (a schedule move
    # edits one device's order and shares the others').
    changed = [
        d for d, (a, b) in enumerate(zip(plan.schedule, old.schedule, strict=True)) if a is not b
    ]
    codes = getattr(plan.schedule, "codes", None)
    if codes is not None and not like.grouped and len(changed) == plan.devices:
        # a list scheduler's orders: every device's changed, and the ops are at hand
        ok, order_nodes = _coded_nodes(
            like.slot_nodes.op_table(like), *codes, like.node_dev, like.order_nodes
        )
        return _reordered(plan, like, order_nodes) if ok else None
    order_nodes = like.order_nodes.copy()
    known = like.slot_nodes.known
    unknown = []
    for d in changed:
        nodes = known(plan.schedule[d])
        if nodes is None or len(nodes) != like.order_ptr[d + 1] - like.order_ptr[d]:
            unknown.append(d)
        else:
            order_nodes[like.order_ptr[d] : like.order_ptr[d + 1]] = nodes
    found = like.slot_nodes.find(
        [plan.schedule[d] for d in unknown],
        int(sum(like.order_ptr[d + 1] - like.order_ptr[d] for d in unknown)),
    )
    if found is not None:
        at = 0
        for d in unknown:
            lo, hi = like.order_ptr[d], like.order_ptr[d + 1]
            order_nodes[lo:hi] = found[at : at + hi - lo]
            at += hi - lo
    else:  # slots made elsewhere (a parsed plan's): by value
        for d, (slots, old_slots) in enumerate(zip(plan.schedule, old.schedule, strict=True)):
            lo, hi = like.order_ptr[d], like.order_ptr[d + 1]
            node_of = dict(zip(old_slots, like.order_nodes[lo:hi].tolist(), strict=True))
            try:
                order_nodes[lo:hi] = [node_of[s] for s in slots]
            except KeyError:
                return None
    return _checked(plan, like, order_nodes)


def _checked(plan: Plan, like: SimProgram, order_nodes: np.ndarray) -> SimProgram | None:
    """`like` with `plan` and its device orders `order_nodes`, when they run every node once,
    each on its own device."""
    if (like.node_dev[order_nodes] != like.node_dev[like.order_nodes]).any() or (
        np.bincount(order_nodes, minlength=like.num_nodes) != 1
    ).any():
        return None
    return _reordered(plan, like, order_nodes)


def _reordered(plan: Plan, like: SimProgram, order_nodes: np.ndarray) -> SimProgram:
    """`like` with `plan` and its device orders `order_nodes` (checked)."""
    like.slot_nodes.remember(plan.schedule, like.order_ptr, order_nodes)
    return replace(like, plan=plan, order_nodes=order_nodes)
