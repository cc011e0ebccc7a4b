"""Measured memory of a running engine, counted as the profiler counts it
(octodsl/costs/profiler.py), so a trace's peak compares with the simulated one:

- static bytes: the rank's parameters, their gradients as they stand before the optimizer step
  and the optimizer's state tensors after it;
- activation bytes: the distinct non-parameter storages autograd saved in the rank's forwards
  that are still alive, plus the tensors held by the weight-gradient state of split backwards,
  sampled after every op.

The engine meters the first step of a traced run only (the bookkeeping costs time; timing uses
the later steps) and writes the level after each op as a "memory" counter track per rank.
Temporaries inside an op and received tensors that no layer saves are not counted (nor are they
in the profile).
"""

from __future__ import annotations

import time
import weakref

import torch

from ..costs.profiler import _storage, _tensors

METHOD = (
    "profiler accounting (saved-tensor hooks + W state; parameters, gradients, optimizer "
    "state), first step"
)
"""What a trace's memory counters measure (its otherData's memory_method)."""


class MemoryMeter:
    """The accounting above, on one rank's engine (see the module docstring)."""

    def __init__(self, engine):
        self.engine = engine
        self.params = [p for s in engine.local_stages for p in engine._stage_params[s]]
        self.exclude = {_storage(p)[0] for p in self.params}
        self.nbytes: dict[int, int] = {}
        self.refs: dict[int, list[weakref.ref]] = {}
        self.samples: list[tuple[float, float]] = []
        """(time.time(), activation bytes) after each op of the first step."""
        self.static = 0.0
        self.grad_bytes = 0.0
        self.active = True
        """Until the first step's optimizer step is done."""

    def pack(self, t: torch.Tensor) -> torch.Tensor:
        """saved_tensors_hooks' pack: note the storage, keep the tensor as autograd would."""
        t = t.detach()  # an alias, as the profiler keeps (no cycle through the grad_fn)
        ptr, nbytes = _storage(t)
        if ptr not in self.exclude:
            self.nbytes[ptr] = nbytes
            self.refs.setdefault(ptr, []).append(weakref.ref(t))
        return t

    def activations(self) -> float:
        alive = {
            ptr: self.nbytes[ptr]
            for ptr, refs in self.refs.items()
            if any(r() is not None for r in refs)
        }
        for saved in self.engine._saved.values():
            if saved.weight is not None:
                for t in _tensors(saved.weight):
                    ptr, nbytes = _storage(t)
                    if ptr not in self.exclude:
                        alive.setdefault(ptr, nbytes)
        return float(sum(alive.values()))

    def sample(self) -> None:
        self.samples.append((time.time(), self.activations()))

    def before_optimizer(self) -> None:
        self.grad_bytes = float(
            sum(p.grad.untyped_storage().nbytes() if p.grad is not None else 0 for p in self.params)
        )

    def after_optimizer(self) -> None:
        state_bytes = 0
        seen = set()
        for state in _torch_optimizer(self.engine.optimizer).state.values():
            for v in state.values():
                if torch.is_tensor(v) and v.untyped_storage().data_ptr() not in seen:
                    seen.add(v.untyped_storage().data_ptr())
                    state_bytes += v.untyped_storage().nbytes()
        param_bytes = sum(p.untyped_storage().nbytes() for p in self.params)
        self.static = float(param_bytes + self.grad_bytes + state_bytes)
        self.active = False

    def report(self) -> dict:
        """What write_trace gathers: the static bytes and the activation samples."""
        return {"static": self.static, "samples": self.samples}


def _torch_optimizer(optimizer) -> torch.optim.Optimizer:
    """The torch optimizer inside DeepSpeed's wrappers (a ZeRO optimizer holds the rank's
    partition in its inner one): its state is this rank's alone."""
    while not isinstance(optimizer, torch.optim.Optimizer) and hasattr(optimizer, "optimizer"):
        optimizer = optimizer.optimizer
    return optimizer


def counter_events(pid: int, report: dict, t0: float) -> list[dict]:
    """A rank's "memory" counter track (Chrome "C" events, microseconds from `t0`): the static
    bytes at 0, then static + activations after each metered op."""
    static = report["static"]
    return [{"ph": "C", "pid": pid, "name": "memory", "ts": 0.0, "args": {"bytes": static}}] + [
        {
            "ph": "C",
            "pid": pid,
            "name": "memory",
            "ts": max(t - t0, 0.0) * 1e6,
            "args": {"bytes": static + act},
        }
        for t, act in report["samples"]
    ]


def summary(report: dict) -> dict:
    """{"static", "activations"}: the static bytes and the activations' peak."""
    return {
        "static": report["static"],
        "activations": max((a for _, a in report["samples"]), default=0.0),
    }
