"""Point-to-point messages between any two ranks of a pipeline, as FIFO streams.

Each ordered pair of devices (a -> b) that exchanges messages gets its own two-rank process
group, so the two directions never queue behind each other (NCCL serialises the operations of
one communicator). Within a stream, sends and receives match in posting order; the program
(program.py) makes both sides post them in the sender's order.

On CUDA (NCCL), receives and sends are enqueued on two side streams of this rank's, not on the
compute stream. ProcessGroupNCCL makes its own stream wait for the *current* stream before a
send or receive starts (so that the buffer is ready): a receive posted ahead on the compute
stream would wait for every kernel enqueued before it, while one posted on the receive stream
(its buffer allocated there) starts at once and overlaps the compute; a send waits, through an
event, for the compute that produced its tensor. Consuming a received tensor makes the compute
stream wait for the receive's end event (`Work.wait`), and each tensor is recorded on the stream
that uses it, so the caching allocator reuses no buffer still in flight. On the CPU (gloo)
there are no streams and nothing changes.

Shapes are exchanged once: the first activation across each stage boundary is preceded on its
stream by a small meta message (dtypes and shapes), cached by both sides from then on. The
gradient coming back has the float entries of the activation, which its receiver sent itself.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import Tensor

from ..trace import TimedSpan, comm_span
from .program import Message
from .watchdog import Watchdog

META_SIZE = 256
_DTYPES = [
    torch.float32,
    torch.float64,
    torch.float16,
    torch.bfloat16,
    torch.uint8,
    torch.int8,
    torch.int16,
    torch.int32,
    torch.int64,
    torch.bool,
]


@dataclass(frozen=True, slots=True)
class Spec:
    """What a message carries: one tensor or a tuple, and each entry's shape and dtype."""

    is_tensor: bool
    entries: tuple[tuple[tuple[int, ...], torch.dtype], ...]

    def grads(self) -> Spec:
        return Spec(False, tuple(e for e in self.entries if e[1].is_floating_point))

    def encode(self, device: torch.device) -> Tensor:
        flat = [int(self.is_tensor), len(self.entries)]
        for shape, dtype in self.entries:
            flat += [_DTYPES.index(dtype), len(shape), *shape]
        if len(flat) > META_SIZE:
            raise ValueError(f"stage output too complex to describe in {META_SIZE} integers")
        return torch.tensor(flat + [0] * (META_SIZE - len(flat)), dtype=torch.int64, device=device)

    @staticmethod
    def decode(buf: Tensor) -> Spec:
        flat = buf.tolist()
        entries, i = [], 2
        for _ in range(flat[1]):
            dtype, ndim = _DTYPES[flat[i]], flat[i + 1]
            entries.append((tuple(flat[i + 2 : i + 2 + ndim]), dtype))
            i += 2 + ndim
        return Spec(bool(flat[0]), tuple(entries))

    @staticmethod
    def of(value) -> Spec:
        tensors = [value] if torch.is_tensor(value) else list(value)
        return Spec(torch.is_tensor(value), tuple((tuple(t.shape), t.dtype) for t in tensors))


def _isend(t: Tensor, peer: int, group) -> dist.Work:
    work = dist.isend(t, peer, group=group)
    assert work is not None, "torch returns None only to a rank outside the group"
    return work


def _irecv(t: Tensor, peer: int, group) -> dist.Work:
    work = dist.irecv(t, peer, group=group)
    assert work is not None, "torch returns None only to a rank outside the group"
    return work


def flat(value) -> list[Tensor]:
    return [value] if torch.is_tensor(value) else list(value)


class Streams:
    """The side streams messages are enqueued on (CUDA), or nothing (CPU)."""

    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"
        self.recv = torch.cuda.Stream(device) if self.cuda else None
        self.send = torch.cuda.Stream(device) if self.cuda else None

    def receiving(self):
        """Around allocating receive buffers and posting their receives."""
        return torch.cuda.stream(self.recv) if self.cuda else nullcontext()

    def received(self, tensors: list[Tensor]) -> None:
        """Received tensors (their receive already waited for) now used on the compute stream."""
        if self.cuda:
            compute = torch.cuda.current_stream()
            for t in tensors:
                t.record_stream(compute)

    @contextmanager
    def sending(self, tensors: list[Tensor]) -> Iterator[None]:
        """Around posting the sends of `tensors`, produced on the compute stream."""
        if not self.cuda:
            yield
            return
        assert self.send is not None
        self.send.wait_stream(torch.cuda.current_stream())  # an event: what made the tensors
        for t in tensors:
            t.record_stream(self.send)
        with torch.cuda.stream(self.send):
            yield


@dataclass(slots=True)
class _Posted:
    works: list[dist.Work]
    tensors: list[Tensor]
    start: float


class P2P:
    """One rank's message endpoint. `begin(messages)` starts a step; `post`, `recv` and `send`
    follow the program; `finish` waits for the step's sends."""

    def __init__(
        self,
        device: int,
        rank_of: Callable[[int], int],
        groups: dict[tuple[int, int], dist.ProcessGroup],
        torch_device: torch.device,
        watchdog: Watchdog,
        trace_pid: int | None,
    ):
        self.device = device
        self.rank_of = rank_of
        self.groups = groups
        self.torch_device = torch_device
        self.watchdog = watchdog
        self.trace_pid = trace_pid
        self.streams = Streams(torch_device)
        self.spans: list[TimedSpan] = []
        self.specs: dict[int, Spec] = {}
        """Per stage boundary, the activation it carries (both sides learn it once)."""
        self._sent_meta: set[int] = set()
        self._meta: dict[int, tuple[dist.Work, Tensor]] = {}
        self._streams: dict[int, list[Message]] = {}
        self._next: dict[int, int] = {}
        self._posted: dict[int, _Posted] = {}
        self._index: dict[int, int] = {}
        self._by_id: dict[int, Message] = {}
        self._sends: list[tuple[Message, list[dist.Work], list[Tensor], float]] = []

    def reset_shapes(self) -> None:
        self.specs.clear()
        self._sent_meta.clear()

    def begin(self, messages: list[Message]) -> None:
        self._streams = {}
        for m in messages:  # already in stream order
            if m.dst == self.device:
                self._streams.setdefault(m.src, []).append(m)
        self._next = {src: 0 for src in self._streams}
        self._index = {m.id: i for q in self._streams.values() for i, m in enumerate(q)}
        self._by_id = {m.id: m for q in self._streams.values() for m in q}

    # receiving
    def post(self, ids: tuple[int, ...]) -> None:
        """Post receives through each of `ids` in stream order, without blocking: a stream
        stops at a message whose shapes are not known yet."""
        for i in ids:
            self._post_through(self._by_id[i], block=False)

    def recv(self, msg: Message):
        """The message's value: a tensor or tuple (activations; floats require grad) or the
        list of gradients."""
        self._post_through(msg, block=True)
        posted = self._posted.pop(msg.id)
        for w in posted.works:
            self.watchdog.wait(w, f"the {_what(msg)} from device {msg.src}", self._peer(msg.src))
        self.streams.received(posted.tensors)
        self._record(msg, "recv", msg.src, posted.start)
        if not msg.act:
            return posted.tensors
        for t in posted.tensors:
            t.requires_grad_(t.is_floating_point())
        return posted.tensors[0] if self.specs[msg.boundary].is_tensor else tuple(posted.tensors)

    def _post_through(self, msg: Message, block: bool) -> None:
        q, src = self._streams[msg.src], msg.src
        group, peer = self.groups[(src, self.device)], self.rank_of(src)
        while self._next[src] <= self._index[msg.id]:
            m = q[self._next[src]]
            spec = self._spec(m, group, peer, block)
            if spec is None:
                return
            with (
                self.streams.receiving(),
                self.watchdog.watching(self._peer(src), f"the {_what(m)} from device {src}"),
            ):
                tensors = [
                    torch.empty(shape, dtype=dtype, device=self.torch_device)
                    for shape, dtype in spec.entries
                ]
                works = [_irecv(t, peer, group) for t in tensors]
            self._posted[m.id] = _Posted(works, tensors, time.time())
            self._next[src] += 1

    def _spec(self, m: Message, group, peer: int, block: bool) -> Spec | None:
        if not m.act:  # the gradient of an activation this rank sent
            spec = self.specs.get(m.boundary)
            return None if spec is None else spec.grads()
        if m.boundary in self.specs:
            return self.specs[m.boundary]
        what = f"the shapes of the {_what(m)} from device {m.src}"
        if m.boundary not in self._meta:
            with self.streams.receiving(), self.watchdog.watching(self._peer(m.src), what):
                buf = torch.empty(META_SIZE, dtype=torch.int64, device=self.torch_device)
                self._meta[m.boundary] = (_irecv(buf, peer, group), buf)
        work, buf = self._meta[m.boundary]
        if not block and not work.is_completed():
            return None
        self.watchdog.wait(work, what, self._peer(m.src))
        self.streams.received([buf])
        del self._meta[m.boundary]
        self.specs[m.boundary] = Spec.decode(buf.cpu())
        return self.specs[m.boundary]

    # sending
    def send(self, msg: Message, value) -> None:
        group, peer = self.groups[(self.device, msg.dst)], self.rank_of(msg.dst)
        tensors = [t.detach().contiguous() for t in flat(value)]
        if msg.act and msg.boundary not in self._sent_meta:
            self.specs[msg.boundary] = Spec.of(value)
            tensors.insert(0, self.specs[msg.boundary].encode(self.torch_device))  # meta goes first
            self._sent_meta.add(msg.boundary)
        with (
            self.streams.sending(tensors),
            self.watchdog.watching(
                self._peer(msg.dst), f"device {msg.dst} to receive the {_what(msg)}"
            ),
        ):
            works = [_isend(t, peer, group) for t in tensors]
        self._sends.append((msg, works, tensors, time.time()))
        self.poll()

    def finish(self) -> None:
        for msg, works, _, start in self._sends:
            for w in works:
                self.watchdog.wait(
                    w, f"device {msg.dst} to receive the {_what(msg)}", self._peer(msg.dst)
                )
            self._record(msg, "send", msg.dst, start)
        self._sends = []

    def poll(self) -> None:
        """Forget sends that have completed (their end time is when this notices)."""
        keep = []
        for entry in self._sends:
            if all(w.is_completed() for w in entry[1]):
                self._record(entry[0], "send", entry[0].dst, entry[3])
            else:
                keep.append(entry)
        self._sends = keep

    def _peer(self, device: int) -> str:
        return f"rank {self.rank_of(device)} (device {device})"

    def _record(self, msg: Message, direction: str, peer: int, start: float) -> None:
        if self.trace_pid is not None:
            p = msg.producer
            self.spans.append(
                comm_span(
                    self.trace_pid, direction, p.kind.value, p.stage, p.mb, peer, start, time.time()
                )
            )


def _what(m: Message) -> str:
    return (
        f"activation of {m.producer} (for {m.consumer})"
        if m.act
        else f"gradient of {m.producer} (for {m.consumer})"
    )
