"""Selective activation recomputation: the forward drops chosen tensors, the backward computes
them again when it first needs them and keeps them until the graph is freed, so that a split
backward's W, run after B, finds what B brought back without a second recomputation (PyTorch's
non-reentrant checkpoint recomputes per backward call and frees each tensor at its first use).

A layer marks what selective recompute drops (docs/models-and-costs.md, per layer kind) by
computing it as `recomputable(fn, *args)`: the tensors autograd saves inside `fn` that are
neither its arguments nor parameters, and `fn`'s outputs wherever a later op saves them (the
norm output that the next projection saves for its weight gradient). Outside `dropping()`, or
without grad, it is `fn(*args)`. Inside `dropping()` (the executor's forward of a stage that
recomputes selectively) saved-tensor hooks replace those tensors by handles; the first handle
unpacked runs `fn` again on the kept arguments (themselves handles where they are another
region's outputs) and records what autograd saves, in the same order as the forward did. The
same operations on the same values: the backward sees the same numbers, bit for bit.

`fn` must take every tensor it uses that is not a parameter as an argument, return fresh
tensors (not views of its arguments), and run the same operations each time (no randomness).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch import Tensor
from torch.multiprocessing.reductions import StorageWeakRef

_scope: _Scope | None = None
"""The `dropping()` in effect (forwards run on one thread)."""


def _ptr(t: Tensor) -> int:
    return t.untyped_storage().data_ptr()


class _Region:
    """One `recomputable` call: what it needs to run again, and (once run) what it brought back."""

    def __init__(self, fn: Callable, args: tuple, grads: tuple[bool, ...]):
        self.fn = fn
        self.args: tuple | None = args
        """The arguments, each tensor packed as the scope packs a saved tensor."""
        self.grads = grads
        """Which arguments required grad (the recomputation saves what the forward saved)."""
        self.dropped: list[int] = []
        """Positions, among the tensors autograd saved inside `fn`, of those dropped."""
        self.saved: dict[int, Tensor] = {}
        self.outputs: tuple[Tensor, ...] | None = None

    def materialize(self) -> None:
        """Run `fn` again (once) and keep the dropped tensors and the outputs."""
        if self.outputs is not None:
            return
        assert self.args is not None
        args = [_unpack(a) if isinstance(a, (Tensor, _Handle)) else a for a in self.args]
        args = [
            a.detach().requires_grad_(g) if isinstance(a, Tensor) else a
            for a, g in zip(args, self.grads, strict=True)
        ]
        wanted = set(self.dropped)
        count = 0

        def record(t: Tensor) -> None:  # the k-th save of the forward is the k-th save again
            nonlocal count
            if count in wanted:
                self.saved[count] = t.detach()
            count += 1

        with torch.enable_grad(), torch.autograd.graph.saved_tensors_hooks(record, _never):
            out = self.fn(*args)
        self.outputs = tuple(t.detach() for t in _as_tuple(out))
        self.args = None  # what the recomputation read is no longer needed


class _Handle:
    """A dropped saved tensor: the region that brings it back, and which of its tensors."""

    __slots__ = ("region",)

    def __init__(self, region: _Region):
        self.region = region

    def value(self) -> Tensor:
        raise NotImplementedError


class _Inner(_Handle):
    """The k-th tensor autograd saved inside the region."""

    __slots__ = ("k",)

    def __init__(self, region: _Region, k: int):
        super().__init__(region)
        self.k = k

    def value(self) -> Tensor:
        self.region.materialize()
        return self.region.saved[self.k]


class _Output(_Handle):
    """A view (size, stride, offset) of the region's j-th output, saved by a later op."""

    __slots__ = ("j", "geometry")

    def __init__(self, region: _Region, j: int, t: Tensor):
        super().__init__(region)
        self.j = j
        self.geometry = (t.size(), t.stride(), t.storage_offset())

    def value(self) -> Tensor:
        self.region.materialize()
        assert self.region.outputs is not None
        return self.region.outputs[self.j].as_strided(*self.geometry)


def _unpack(packed: Tensor | _Handle) -> Tensor:
    return packed if isinstance(packed, Tensor) else packed.value()


def _never(_: Any) -> Tensor:
    raise AssertionError("a recomputation's own graph is never differentiated")


class _Scope:
    """The outputs of the regions run so far, by storage: a later op that saves one of them
    saves a handle instead."""

    def __init__(self, observe: Callable[[Tensor], Any] | None = None) -> None:
        self.observe = observe
        """Called with every tensor kept for the backward (the profiler counts them)."""
        self.outputs: dict[int, tuple[StorageWeakRef, torch.dtype, int, _Region, int]] = {}
        """Storage pointer -> (the storage, the output's dtype and version, region, index)."""
        self.recording: _Region | None = None
        """The region whose `fn` is running (a `recomputable` inside it is part of it)."""

    def pack(self, t: Tensor) -> Tensor | _Handle:
        entry = self.outputs.get(_ptr(t))
        if entry is not None:
            ref, dtype, version, region, j = entry
            # the same storage (alive, so its address not reused) in the same dtype, not
            # modified in place since the region made it
            if (
                not ref.expired()
                and ref == StorageWeakRef(t.untyped_storage())
                and t.dtype == dtype
                and t._version == version
            ):
                return _Output(region, j, t)
        return self.keep(t)

    def keep(self, t: Tensor) -> Tensor:
        if self.observe is not None:
            self.observe(t)
        # a detached alias: a saved output kept as itself would reference its own grad_fn, a
        # cycle through C++ that would keep a retained graph alive
        return t.detach()

    def run(self, fn: Callable, args: tuple) -> Any:
        grads = tuple(isinstance(a, Tensor) and a.requires_grad for a in args)
        region = _Region(
            fn, tuple(self.pack(a) if isinstance(a, Tensor) else a for a in args), grads
        )
        arg_ptrs = {_ptr(a) for a in args if isinstance(a, Tensor)}
        count = 0

        def pack_inner(t: Tensor) -> Tensor | _Handle:
            nonlocal count
            k, count = count, count + 1
            if _ptr(t) in arg_ptrs:  # an argument (or a view of one): kept, as outside
                return self.pack(t)
            base = t if t._base is None else t._base
            if base.grad_fn is None:  # a parameter, a view of one, a constant
                return self.keep(t)
            region.dropped.append(k)
            return _Inner(region, k)

        self.recording = region
        try:
            with torch.autograd.graph.saved_tensors_hooks(pack_inner, _unpack):
                out = fn(*args)
        finally:
            self.recording = None
        for j, o in enumerate(_as_tuple(out)):
            self.outputs[_ptr(o)] = (
                StorageWeakRef(o.untyped_storage()),
                o.dtype,
                o._version,
                region,
                j,
            )
        return out


def _as_tuple(out: Tensor | tuple) -> tuple[Tensor, ...]:
    return out if isinstance(out, tuple) else (out,)


def recomputable(fn: Callable, *args: Any) -> Any:
    """`fn(*args)`; inside `dropping()`, with its saved tensors and outputs dropped after the
    forward and brought back by the backward (see the module's docstring)."""
    scope = _scope
    if scope is None or scope.recording is not None or not torch.is_grad_enabled():
        return fn(*args)
    return scope.run(fn, args)


@contextmanager
def dropping(observe: Callable[[Tensor], Any] | None = None) -> Iterator[None]:
    """Forwards run inside drop what `recomputable` marks (a stage's F under selective
    recompute); their backward, whenever it runs, brings it back. `observe(t)` is called with
    every tensor kept for the backward instead (saved by autograd, or an argument a region
    keeps to run again)."""
    global _scope
    assert _scope is None, "dropping() does not nest"
    scope = _scope = _Scope(observe)
    try:
        with torch.autograd.graph.saved_tensors_hooks(scope.pack, _unpack):
            yield
    finally:
        _scope = None
