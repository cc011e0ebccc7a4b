"""The walk: times every compute node and every message of a compiled plan.

Model (docs in octodsl/sim/__init__.py):
- compute: each device runs its nodes in the plan's order on one compute stream; a node starts
  when the device is free and every message into it has arrived (a producer on the same device
  ran earlier in the order, so it never delays the start);
- communication: each device has one communication stream, separate from compute. A message
  occupies the sender's and the receiver's stream for its whole transfer time, so the receive
  ends exactly when the send does. Streams take messages in the order they become ready
  (producer finished), ties broken by message id: the walk pops messages from a heap keyed
  (ready time, id), so it is deterministic. Popping in time order also makes each stream's
  reservations first-come first-served, whatever order the devices are visited in.

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
    stream_ptr: np.ndarray


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
    """Each device's messages in stream order, in slices stream_ptr[d]:stream_ptr[d + 1]."""
    dev_free: np.ndarray
    """Per device: when its compute stream is done."""
    comm_free: np.ndarray
    """Per device: when its communication stream is done."""


@njit
def msg_pred_code(m):
    """pred[n] encodes 'held back by message m' as a negative number below NO_PRED; the same
    function decodes it."""
    return -2 - m


@njit
def _heap_push(ht, hm, n, t, m):
    i = n
    while i > 0:
        parent = (i - 1) >> 1
        if ht[parent] < t or (ht[parent] == t and hm[parent] < m):
            break
        ht[i] = ht[parent]
        hm[i] = hm[parent]
        i = parent
    ht[i] = t
    hm[i] = m
    return n + 1


@njit
def _heap_pop(ht, hm, n):
    """Removes the root; returns the new size (the caller reads the root before)."""
    n -= 1
    t = ht[n]
    m = hm[n]
    i = 0
    while True:
        c = 2 * i + 1
        if c >= n:
            break
        if c + 1 < n and (ht[c + 1] < ht[c] or (ht[c + 1] == ht[c] and hm[c + 1] < hm[c])):
            c += 1
        if t < ht[c] or (t == ht[c] and m < hm[c]):
            break
        ht[i] = ht[c]
        hm[i] = hm[c]
        i = c
    ht[i] = t
    hm[i] = m
    return n


@njit
def walk(g, dur, msg_dur):
    """(Timeline, comm, hidden) of WalkGraph `g` with node durations `dur` and message
    durations `msg_dur` (seconds): comm and hidden as hidden_comm says (computed here, so that
    the Timeline does not travel back into numba from Python, which costs more than this)."""
    P = g.order_ptr.shape[0] - 1
    N = dur.shape[0]
    M = msg_dur.shape[0]
    start = np.zeros(N)
    end = np.zeros(N)
    pred = np.full(N, NO_PRED, np.int64)
    msg_start = np.zeros(M)
    msg_end = np.zeros(M)
    msg_pred = np.full(M, -1, np.int64)
    stream_log = np.zeros(g.stream_ptr[P], np.int64)
    log_pos = g.stream_ptr[:P].copy()
    remaining = g.in_deg.copy()
    ready = np.zeros(N)
    ready_by = np.full(N, -1, np.int64)
    dev_free = np.zeros(P)
    last_node = np.full(P, -1, np.int64)
    comm_free = np.zeros(P)
    last_msg = np.full(P, -1, np.int64)
    pos = g.order_ptr[:P].copy()
    heap_t = np.zeros(max(M, 1))
    heap_m = np.zeros(max(M, 1), np.int64)
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
                        hn = _heap_push(heap_t, heap_m, hn, e, m)
        if hn == 0:
            break
        # Start the message that became ready first on both its streams.
        t = heap_t[0]
        m = heap_m[0]
        hn = _heap_pop(heap_t, heap_m, hn)
        a = g.msg_src_dev[m]
        b = g.msg_dst_dev[m]
        s = t
        if comm_free[a] > s:
            s = comm_free[a]
            msg_pred[m] = last_msg[a]
        if comm_free[b] > s:
            s = comm_free[b]
            msg_pred[m] = last_msg[b]
        e = s + msg_dur[m]
        msg_start[m] = s
        msg_end[m] = e
        comm_free[a] = e
        comm_free[b] = e
        last_msg[a] = m
        last_msg[b] = m
        stream_log[log_pos[a]] = m
        log_pos[a] += 1
        stream_log[log_pos[b]] = m
        log_pos[b] += 1
        n = g.msg_dst_node[m]
        remaining[n] -= 1
        if e > ready[n] or ready_by[n] < 0:
            ready[n] = e
            ready_by[n] = m
        d = g.node_dev[n]
        if remaining[n] == 0 and pos[d] < g.order_ptr[d + 1] and g.order_nodes[pos[d]] == n:
            stack[sn] = d
            sn += 1
    t = Timeline(done, start, end, pred, msg_start, msg_end, msg_pred, stream_log, dev_free,
                 comm_free)
    comm, hidden = hidden_comm(g, t)
    return t, comm, hidden


@njit
def comm_overlap(g, t):
    """Per node of WalkGraph `g`: seconds of Timeline `t` during which its device's
    communication stream is busy. A device's nodes and its stream's messages are each disjoint
    and in time order, so one merge per device suffices."""
    out = np.zeros(t.start.shape[0])
    P = g.order_ptr.shape[0] - 1
    for d in range(P):
        j = g.stream_ptr[d]
        j1 = g.stream_ptr[d + 1]
        for i in range(g.order_ptr[d], g.order_ptr[d + 1]):
            n = g.order_nodes[i]
            a = t.start[n]
            b = t.end[n]
            while j < j1 and t.msg_end[t.stream_log[j]] <= a:
                j += 1
            k = j
            while k < j1 and t.msg_start[t.stream_log[k]] < b:
                lo = max(a, t.msg_start[t.stream_log[k]])
                hi = min(b, t.msg_end[t.stream_log[k]])
                if hi > lo:
                    out[n] += hi - lo
                k += 1
    return out


@njit
def hidden_comm(g, t):
    """Per device: communication time, and the part of it under the device's own compute."""
    under = comm_overlap(g, t)
    P = g.order_ptr.shape[0] - 1
    comm = np.zeros(P)
    hidden = np.zeros(P)
    for d in range(P):
        for j in range(g.stream_ptr[d], g.stream_ptr[d + 1]):
            comm[d] += t.msg_end[t.stream_log[j]] - t.msg_start[t.stream_log[j]]
        for i in range(g.order_ptr[d], g.order_ptr[d + 1]):
            hidden[d] += under[g.order_nodes[i]]
    return comm, hidden
