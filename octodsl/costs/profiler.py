"""Measure per-layer costs with the torch layers on the local device (`octodsl profile`).

Each distinct layer (identical configurations are measured once) is built alone and run on a
random micro-batch of the spec's shape: F is a plain forward (the LM head's includes the loss);
B and W go through `octodsl.layers.split_backward` (`backward_input`, `backward_weight`),
the split the executor runs. Times are medians of `repeats` runs after `warmup` runs, taken
round-robin over the layers (a slow spell of a shared machine costs each layer one sample).

Activation memory: on CPU, saved-tensor hooks record every distinct non-parameter storage
autograd saves in F (`act`); after B, the bytes still held are those saved storages still alive
plus the tensors the W state holds (`act_w`, capped at `act`). On CUDA, allocator deltas around F
and after B give the same two numbers.

Selective recompute (`octodsl.layers.recompute`): the layer runs its F once more inside
`dropping()`, and what it then keeps for the backward, measured the same way, is `act - sel_act`;
`sel_f` is the median B with the forward so run minus the median B without (B brings the
dropped tensors back first), taken in the same rounds.
"""

from __future__ import annotations

import gc
import platform
import statistics
import time
import weakref
from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import fields, is_dataclass
from datetime import datetime, timezone
from typing import Literal

import torch

from ..errors import OctoError
from ..layers import TORCH_DTYPES, TiedHead, build_layers, lm_loss
from ..layers.recompute import dropping
from ..layers.split_backward import backward_input, backward_weight
from ..models.spec import ModelSpec
from ..version import version
from .analytical import BYTES_PER_PARAM
from .profile import MeasuredLayer, Profile
from .work import layer_work

Progress = Callable[[int, int, str], None]
"""progress(done, total, label): called before each layer is measured and once at the end."""


def distinct_layers(spec: ModelSpec) -> list[list[int]]:
    """Indices of the spec's layers grouped by identical configuration, in first-seen order."""
    groups: dict[object, list[int]] = {}
    for i, layer in enumerate(spec.layers):
        groups.setdefault(layer, []).append(i)
    return list(groups.values())


def _storage(t: torch.Tensor) -> tuple[int, int]:
    st = t.untyped_storage()
    return st.data_ptr(), st.nbytes()


def _tensors(obj, seen: set[int] | None = None):
    """Tensors inside lists, tuples, dicts and dataclasses (the W state), depth first."""
    seen = set() if seen is None else seen
    if id(obj) in seen:
        return
    seen.add(id(obj))
    if isinstance(obj, torch.Tensor):
        yield obj
    elif isinstance(obj, (list, tuple)):
        for item in obj:
            yield from _tensors(item, seen)
    elif isinstance(obj, dict):
        for item in obj.values():
            yield from _tensors(item, seen)
    elif is_dataclass(obj) and not isinstance(obj, type):
        for f in fields(obj):
            yield from _tensors(getattr(obj, f.name), seen)


class _LayerRun:
    """One layer with its inputs: runs F, B and W and measures them."""

    def __init__(self, spec: ModelSpec, index: int, device: torch.device):
        self.device = device
        self.kind = spec.layers[index].kind
        module = build_layers(spec, device=device, seed=index, layers=range(index, index + 1))[0]
        self.module = module
        owner = module.shared if isinstance(module, TiedHead) else module
        self.params = list(owner.parameters())
        shape = (spec.microbatch_size, spec.seq_len)
        dtype = TORCH_DTYPES[spec.dtype]
        if self.kind == "embedding":
            self.x0 = torch.randint(0, spec.vocab, shape, device=device)
        else:
            self.x0 = torch.randn(*shape, spec.hidden, device=device, dtype=dtype)
        self.labels = torch.randint(0, spec.vocab, shape, device=device)
        self.dy = (
            None
            if self.kind == "lm_head_loss"
            else torch.randn(*shape, spec.hidden, device=device, dtype=dtype)
        )

    def _input(self) -> torch.Tensor:
        return self.x0 if self.kind == "embedding" else self.x0.detach().requires_grad_()

    def _forward(
        self,
        x: torch.Tensor,
        selective: bool = False,
        observe: Callable[[torch.Tensor], object] | None = None,
    ) -> torch.Tensor:
        """F; with `selective`, dropping what selective recompute drops (`observe`: see
        `dropping`)."""
        with dropping(observe) if selective else nullcontext():
            out = self.module(x)
            return lm_loss(out, self.labels) if self.kind == "lm_head_loss" else out

    def _backward_input(self, out: torch.Tensor, x: torch.Tensor):
        return backward_input([out], [self.dy], [x] if x.requires_grad else [])

    def _sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def time_once(self, selective: bool = False) -> tuple[float, float, float]:
        """Seconds of F, B and W for one micro-batch (with `selective`, F drops and B brings
        back what selective recompute drops)."""
        x = self._input()
        self._sync()
        t0 = time.perf_counter()
        out = self._forward(x, selective)
        self._sync()
        t1 = time.perf_counter()
        _, state = self._backward_input(out, x)
        self._sync()
        t2 = time.perf_counter()
        backward_weight(state, self.params)
        self._sync()
        t3 = time.perf_counter()
        return t1 - t0, t2 - t1, t3 - t2

    def memory(self, selective: bool = False) -> tuple[float, float]:
        """(bytes held from F until B, bytes held from B until W); with `selective`, of a
        forward that drops what selective recompute drops."""
        saved = _SavedStorages(exclude={_storage(p)[0] for p in self.params})
        cuda = self.device.type == "cuda"
        x = self._input()
        x_ptr, x_bytes = _storage(x)
        self._sync()
        before = torch.cuda.memory_allocated(self.device) if cuda else 0
        with torch.autograd.graph.saved_tensors_hooks(saved.pack, lambda t: t):
            out = self._forward(x, selective, saved.pack)
        if cuda:
            # x's storage belongs to x0 and was allocated before F: add it when saved
            self._sync()
            out_ptr, out_bytes = _storage(out)
            act = (
                torch.cuda.memory_allocated(self.device)
                - before
                - (0 if out_ptr in saved.nbytes else out_bytes)
                + (x_bytes if x_ptr in saved.nbytes else 0)
            )
        else:
            act = sum(saved.nbytes.values())
        in_grads, state = self._backward_input(out, x)
        del out, in_grads, x
        gc.collect()
        alive = saved.alive()
        if cuda:
            self._sync()
            act_w = (
                torch.cuda.memory_allocated(self.device)
                - before
                + (x_bytes if x_ptr in alive else 0)
            )
        else:
            for t in _tensors(state):
                ptr, nbytes = _storage(t)
                if ptr not in saved.exclude:
                    alive.setdefault(ptr, nbytes)
            act_w = sum(alive.values())
        backward_weight(state, self.params)
        return float(max(act, 0)), float(min(max(act_w, 0), max(act, 0)))


class _SavedStorages:
    """Saved-tensor hooks' bookkeeping: the distinct storages autograd saves (parameters
    excluded), and weak references to the saved tensors to tell which are still held."""

    def __init__(self, exclude: set[int]):
        self.exclude = exclude
        self.nbytes: dict[int, int] = {}
        self.refs: dict[int, list[weakref.ref]] = {}

    def pack(self, t: torch.Tensor) -> torch.Tensor:
        # Keep a detached alias: a saved output returned as itself would reference its own
        # grad_fn, a cycle through C++ that keeps a retained graph alive forever.
        t = t.detach()
        ptr, nbytes = _storage(t)
        if ptr not in self.exclude:
            self.nbytes[ptr] = nbytes
            self.refs.setdefault(ptr, []).append(weakref.ref(t))
        return t

    def alive(self) -> dict[int, int]:
        """Storages some saved tensor of which is still referenced, with their bytes."""
        return {
            ptr: self.nbytes[ptr]
            for ptr, refs in self.refs.items()
            if any(r() is not None for r in refs)
        }


def _device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "cpu"


def profile_model(
    spec: ModelSpec,
    device: str = "cpu",
    threads: int | None = 1,
    warmup: int = 2,
    repeats: int = 5,
    progress: Progress | None = None,
) -> Profile:
    """Measure every distinct layer of `spec` at its shape on `device` (`cpu` or `cuda`).

    On CPU torch runs with `threads` threads (the executor's per-rank count; None keeps torch's
    setting), restored afterwards. Raises NotImplementedError for layer kinds without a torch
    layer, an OctoError for an unusable device."""
    if device not in ("cpu", "cuda"):
        raise OctoError(f"device must be cpu or cuda, not {device!r}")
    if device == "cuda" and not torch.cuda.is_available():
        raise OctoError("no CUDA device is available here; profile with --device cpu")
    dev = torch.device(device)
    old_threads = torch.get_num_threads()
    if dev.type == "cpu" and threads is not None:
        torch.set_num_threads(threads)
    cpu_threads = torch.get_num_threads() if dev.type == "cpu" else None
    groups = distinct_layers(spec)
    measured = []
    try:
        runs = [_LayerRun(spec, indices[0], dev) for indices in groups]
        for run in runs:
            for _ in range(warmup):
                run.time_once()
        # Round-robin, one sample of every layer per round: a slow spell of the machine (a
        # shared host) then costs each layer one sample, which the median drops, instead of
        # all the samples of one layer.
        samples: list[list[tuple[float, float, float]]] = [[] for _ in runs]
        selective_b: list[list[float]] = [[] for _ in runs]
        for r in range(repeats):
            if progress:
                progress(r, repeats, f"round {r + 1} of {repeats} over {len(runs)} layers")
            for run, mine, sel in zip(runs, samples, selective_b, strict=True):
                mine.append(run.time_once())
                sel.append(run.time_once(selective=True)[1])
        for indices, run, mine, sel in zip(groups, runs, samples, selective_b, strict=True):
            fs, bs, ws = (list(col) for col in zip(*mine, strict=True))
            act, act_w = run.memory()
            kept, _ = run.memory(selective=True)
            b = statistics.median(bs)
            measured.append(
                MeasuredLayer(
                    layers=indices,
                    kind=spec.layers[indices[0]].kind,
                    f=statistics.median(fs),
                    b=b,
                    w=statistics.median(ws),
                    f_samples=fs,
                    b_samples=bs,
                    w_samples=ws,
                    act=act,
                    act_w=act_w,
                    params=spec.layer_params(indices[0]),
                    out_bytes=layer_work(spec, spec.layers[indices[0]]).out,
                    sel_f=max(0.0, statistics.median(sel) - b),
                    sel_act=max(0.0, act - kept),
                )
            )
        del runs
        if progress:
            progress(repeats, repeats, "done")
    finally:
        torch.set_num_threads(old_threads)
    kind: Literal["cpu", "cuda"] = "cuda" if device == "cuda" else "cpu"  # checked above
    return Profile(
        model=spec,
        device=kind,
        device_name=_device_name(dev),
        threads=cpu_threads,
        memory_method=(
            "CUDA allocator deltas around F and after B"
            if dev.type == "cuda"
            else "saved-tensor hooks: distinct non-parameter storages saved by F; after B, "
            "those still alive plus tensors held by the W state"
        ),
        warmup=warmup,
        repeats=repeats,
        bytes_per_param=BYTES_PER_PARAM,
        torch_version=torch.__version__,
        octodsl_version=version(),
        created=datetime.now(timezone.utc).isoformat(),
        layers=measured,
    )
