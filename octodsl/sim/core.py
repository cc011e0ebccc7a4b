"""The walk: times every compute node and every message of a compiled plan.

Model (docs in octodsl/sim/__init__.py):
- compute: each device runs its nodes in the plan's order on one compute stream; a node starts
  when the device is free and every message into it has arrived (a producer on the same device
  ran earlier in the order, so it never delays the start); with blocking sends (the plan's
  `overlap_p2p_comm` false) also when the sends of the node before it have finished;
- communication: each device has two communication streams, separate from compute: one for
  what it sends and one for what it receives (links are full duplex, and every runtime we model
  posts sends and receives on their own: docs/models-and-costs.md, "Pipeline messages"). A
  message occupies the sender's send stream and the receiver's receive stream for its whole
  transfer time, so the receive ends exactly when the send does; two sends of one device (to
  two peers) take turns on its link, as do two receives. Streams take messages in the order
  they become ready (producer finished), ties broken by the consumer's place in the plan's
  order, then by message id: the walk pops messages from a heap keyed so, which makes it
  deterministic and the same for a plan however its program was compiled. Popping in time order also makes each
  stream's reservations first-come first-served, whatever order the devices are visited in.

Everything here is plain loops over integer and float arrays so numba can compile it; the
arrays travel in named tuples (numba compiles attribute access on them to a field load).
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from .jit import njit

NO_PRED = -1
"""pred[n] when node n started at time 0 with nothing before it."""


class WalkGraph(NamedTuple):
    """The arrays of a compiled plan that the walk reads: SimProgram's fields of these names
    (`SimProgram.walk_graph`)."""

    order_ptr: np.ndarray
    order_nodes: np.ndarray
    node_dev: np.ndarray
    in_deg: np.ndarray
    out_ptr: np.ndarray
    out_dst: np.ndarray
    out_msg: np.ndarray
    msg_dst_node: np.ndarray
    msg_src_dev: np.ndarray
    msg_dst_dev: np.ndarray
    msg_hold: np.ndarray
    stream_ptr: np.ndarray
    """Stream 2d is device d's send stream, 2d + 1 its receive stream (`send_stream`)."""


@njit
def send_stream(d):
    """The stream of device d's sends; its receives are on the next one."""
    return 2 * d


class Timeline(NamedTuple):
    """What the walk computes. `done` < the number of nodes means the plan deadlocks."""

    done: int
    start: np.ndarray
    """Per node, seconds."""
    end: np.ndarray
    pred: np.ndarray
    """Per node: the previous node on its device when the device was what it waited for, else
    the message that arrived last (msg_pred_code), or NO_PRED."""
    msg_start: np.ndarray
    msg_end: np.ndarray
    msg_pred: np.ndarray
    """Per message: -1 when it started as soon as its producer finished, else the message
    before it on a busy stream."""
    stream_log: np.ndarray
    """Each stream's messages in order, in slices stream_ptr[k]:stream_ptr[k + 1] (stream 2d:
    device d's sends, 2d + 1: its receives)."""
    dev_free: np.ndarray
    """Per device: when its compute stream is done."""
    comm_free: np.ndarray
    """Per device: when its communication streams are done (the later of the two)."""


@njit
def msg_pred_code(m):
    """pred[n] encodes 'held back by message m' as a negative number below NO_PRED; the same
    function decodes it."""
    return -2 - m


@njit(refcounts=False, inline=True)
def _before(t1, m1, t2, m2, key):
    """Whether message m1, ready at t1, goes before m2, ready at t2: by time, then by its
    consumer's place in the plan's order (`key`), then by id."""
    if t1 != t2:
        return t1 < t2
    if key[m1] != key[m2]:
        return key[m1] < key[m2]
    return m1 < m2


@njit(refcounts=False)
def _heap_push(ht, hm, n, t, m, key):
    i = n
    while i > 0:
        parent = (i - 1) >> 1
        if _before(ht[parent], hm[parent], t, m, key):
            break
        ht[i] = ht[parent]
        hm[i] = hm[parent]
        i = parent
    ht[i] = t
    hm[i] = m
    return n + 1


@njit(refcounts=False)
def _heap_pop(ht, hm, n, key):
    """Removes the root; returns the new size (the caller reads the root before)."""
    n -= 1
    t = ht[n]
    m = hm[n]
    i = 0
    while True:
        c = 2 * i + 1
        if c >= n:
            break
        if c + 1 < n and _before(ht[c + 1], hm[c + 1], ht[c], hm[c], key):
            c += 1
        if _before(t, m, ht[c], hm[c], key):
            break
        ht[i] = ht[c]
        hm[i] = hm[c]
        i = c
    ht[i] = t
    hm[i] = m
    return n


@njit(refcounts=False)
def _arrive(g, n, m, e, remaining, ready, ready_by, pos, stack, sn):
    """Message m, ended at e, is one of node n's waits: count it, and queue n's device when n
    is its next node and has nothing left to wait for. Returns the stack's new size."""
    remaining[n] -= 1
    if e > ready[n] or ready_by[n] < 0:
        ready[n] = e
        ready_by[n] = m
    d = g.node_dev[n]
    if remaining[n] == 0 and pos[d] < g.order_ptr[d + 1] and g.order_nodes[pos[d]] == n:
        stack[sn] = d
        sn += 1
    return sn


@njit
def walk(g, dur, msg_dur):
    """The Timeline of WalkGraph `g` with node durations `dur` and message durations
    `msg_dur` (seconds)."""
    P = g.order_ptr.shape[0] - 1
    N = dur.shape[0]
    M = msg_dur.shape[0]
    start = np.zeros(N)
    end = np.zeros(N)
    pred = np.full(N, NO_PRED, np.int64)
    msg_start = np.zeros(M)
    msg_end = np.zeros(M)
    msg_pred = np.full(M, -1, np.int64)
    stream_log = np.zeros(g.stream_ptr[2 * P], np.int64)
    log_pos = g.stream_ptr[: 2 * P].copy()
    remaining = g.in_deg.copy()
    ready = np.zeros(N)
    ready_by = np.full(N, -1, np.int64)
    dev_free = np.zeros(P)
    last_node = np.full(P, -1, np.int64)
    stream_free = np.zeros(2 * P)
    last_msg = np.full(2 * P, -1, np.int64)
    pos = g.order_ptr[:P].copy()
    heap_t = np.zeros(max(M, 1))
    heap_m = np.zeros(max(M, 1), np.int64)
    # Ties go by the consumer's place in the plan's order: a fresh compile numbers messages
    # so, a program reused for a reordered plan (`compile(plan, like=)`) keeps the old
    # numbering, and both must time the plan alike.
    place = np.empty(N, np.int64)
    for i in range(N):
        place[g.order_nodes[i]] = i
    key = np.empty(M, np.int64)
    for k in range(M):
        key[k] = place[g.msg_dst_node[k]]
    hn = 0
    stack = np.zeros(P, np.int64)
    sn = 0
    for d in range(P - 1, -1, -1):
        stack[sn] = d
        sn += 1
    done = 0
    while True:
        # Run every device as far as its order allows.
        while sn > 0:
            sn -= 1
            d = stack[sn]
            while pos[d] < g.order_ptr[d + 1]:
                n = g.order_nodes[pos[d]]
                if remaining[n] > 0:
                    break
                if ready[n] > dev_free[d]:
                    s = ready[n]
                    pred[n] = msg_pred_code(ready_by[n])
                else:
                    s = dev_free[d]
                    pred[n] = last_node[d]
                e = s + dur[n]
                start[n] = s
                end[n] = e
                dev_free[d] = e
                last_node[d] = n
                pos[d] += 1
                done += 1
                for k in range(g.out_ptr[n], g.out_ptr[n + 1]):
                    m = g.out_msg[k]
                    if m < 0:
                        remaining[g.out_dst[k]] -= 1
                    else:
                        hn = _heap_push(heap_t, heap_m, hn, e, m, key)
        if hn == 0:
            break
        # Start the message that became ready first on both its streams.
        t = heap_t[0]
        m = heap_m[0]
        hn = _heap_pop(heap_t, heap_m, hn, key)
        a = send_stream(g.msg_src_dev[m])
        b = send_stream(g.msg_dst_dev[m]) + 1
        s = t
        if stream_free[a] > s:
            s = stream_free[a]
            msg_pred[m] = last_msg[a]
        if stream_free[b] > s:
            s = stream_free[b]
            msg_pred[m] = last_msg[b]
        e = s + msg_dur[m]
        msg_start[m] = s
        msg_end[m] = e
        stream_free[a] = e
        stream_free[b] = e
        last_msg[a] = m
        last_msg[b] = m
        stream_log[log_pos[a]] = m
        log_pos[a] += 1
        stream_log[log_pos[b]] = m
        log_pos[b] += 1
        sn = _arrive(g, g.msg_dst_node[m], m, e, remaining, ready, ready_by, pos, stack, sn)
        if g.msg_hold[m] >= 0:  # a blocking send: its sender's next node waits for it too
            sn = _arrive(g, g.msg_hold[m], m, e, remaining, ready, ready_by, pos, stack, sn)
    comm_free = np.maximum(stream_free[0::2], stream_free[1::2])
    return Timeline(
        done, start, end, pred, msg_start, msg_end, msg_pred, stream_log, dev_free, comm_free
    )


@njit
def comm_overlap(g, t):
    """Per node of WalkGraph `g`: seconds of Timeline `t` during which its device's
    communication streams carry messages (a second that both streams are busy counts twice). A
    device's nodes and each stream's messages are disjoint and in time order, so one merge per
    stream suffices."""
    out = np.zeros(t.start.shape[0])
    P = g.order_ptr.shape[0] - 1
    for k_stream in range(2 * P):
        d = k_stream // 2
        j = g.stream_ptr[k_stream]
        j1 = g.stream_ptr[k_stream + 1]
        for i in range(g.order_ptr[d], g.order_ptr[d + 1]):
            n = g.order_nodes[i]
            j, out[n] = _overlap_of(t, j, j1, t.start[n], t.end[n], out[n])
    return out


@njit
def hidden_comm(g, t):
    """Per device: communication time, and the part of it under the device's own compute
    (the sum of comm_overlap over its nodes: one pass over a device's nodes merging both of
    its streams, which adds each node's overlaps in comm_overlap's order, so the same sums)."""
    P = g.order_ptr.shape[0] - 1
    comm = np.zeros(P)
    hidden = np.zeros(P)
    for d in range(P):
        for j in range(g.stream_ptr[send_stream(d)], g.stream_ptr[send_stream(d) + 2]):
            comm[d] += t.msg_end[t.stream_log[j]] - t.msg_start[t.stream_log[j]]
        js = g.stream_ptr[send_stream(d)]
        js1 = g.stream_ptr[send_stream(d) + 1]
        jr = js1
        jr1 = g.stream_ptr[send_stream(d) + 2]
        for i in range(g.order_ptr[d], g.order_ptr[d + 1]):
            n = g.order_nodes[i]
            a = t.start[n]
            b = t.end[n]
            under = 0.0
            js, under = _overlap_of(t, js, js1, a, b, under)
            jr, under = _overlap_of(t, jr, jr1, a, b, under)
            hidden[d] += under
    return comm, hidden


@njit
def _overlap_of(t, j, j1, a, b, acc):
    """The merge step for a node running from a to b over one stream's messages
    stream_log[j:j1] (those that end by `a` skipped for good): the new j, and `acc` plus the
    node's overlaps with them."""
    while j < j1 and t.msg_end[t.stream_log[j]] <= a:
        j += 1
    k = j
    while k < j1 and t.msg_start[t.stream_log[k]] < b:
        lo = max(a, t.msg_start[t.stream_log[k]])
        hi = min(b, t.msg_end[t.stream_log[k]])
        if hi > lo:
            acc += hi - lo
        k += 1
    return j, acc
