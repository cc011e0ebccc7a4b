"""What the tuner is asked: a model's per-layer costs, devices, micro-batches, a memory limit and
a link; and the one way it turns a layout and a schedule into a Plan."""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

import numpy as np
from pydantic import ValidationError

from .. import limits
from ..costs.devices import get_link
from ..costs.resolve import cost_table
from ..costs.table import CostTable, Link, StageCost
from ..errors import OctoError
from ..plan import Header, Plan, Slot
from ..units import size
from .layout import StageLayout


def check_size(model: str, num_layers: int, devices: int, microbatches: int) -> None:
    """OctoError unless the tuner can work on this many devices and micro-batches: a pipeline
    of 2 or more devices (one device has nothing to partition or place), each holding at
    least one layer, and plans within MAX_OPS with one stage per device and split backwards
    (the fewest ops of the plans it tries)."""
    if devices < 2:
        raise OctoError(f"tune needs at least 2 devices (a pipeline), not {devices}; a single "
                        "device runs every layer in one stage: `octodsl gen 1f1b -p 1 -m "
                        f"{microbatches} --model {model}` writes that plan")
    if devices > num_layers:
        raise OctoError(f"{model} has {num_layers} layers: tune takes 2 to {num_layers} devices "
                        f"(each device holds at least one layer), not {devices}")
    ops = 3 * devices * microbatches
    if ops > limits.MAX_OPS:
        raise OctoError(f"{devices} devices x {microbatches} micro-batches make at least {ops:,} "
                        f"ops per plan, more than octodsl's limit of {limits.MAX_OPS:,}; use "
                        f"at most {limits.MAX_OPS // (3 * devices):,} micro-batches")


@dataclass
class Problem:
    table: CostTable
    header: Header
    """Header of every plan the tuner writes: devices, micro-batches, model, memory limit."""
    link: Link
    work: np.ndarray = field(init=False, repr=False)
    """F + B + W seconds of each layer."""

    def __post_init__(self) -> None:
        self.work = np.array([l.f + l.b + l.w for l in self.table.layers])

    @classmethod
    def create(cls, model: str, devices: int, microbatches: int, *, device: str = "H800",
               memory: int | None = None, link: str | Link = "nvlink",
               microbatch_size: int | None = None, seq_len: int | None = None,
               name: str | None = None) -> Problem:
        """Analytical costs of a model (built-in name or spec path) on a built-in device.
        Raises OctoError with a message for the user."""
        try:
            table = cost_table(model=model, device=device, microbatch_size=microbatch_size,
                               seq_len=seq_len)
            check_size(model, len(table.layers), devices, microbatches)
            header = Header(name=name or f"tuned-{model}-p{devices}-m{microbatches}",
                            devices=devices, microbatches=microbatches, model=model,
                            microbatch_size=microbatch_size, seq_len=seq_len, memory=memory)
        except ValidationError as e:  # a value out of the plan header's (or the spec's) range
            first = e.errors()[0]
            raise OctoError(f"{'.'.join(map(str, first['loc']))}: {first['msg']} (given "
                            f"{first['input']!r})") from None
        return cls(table, header, link if isinstance(link, Link) else get_link(link))

    @property
    def devices(self) -> int:
        return self.header.devices

    @property
    def microbatches(self) -> int:
        return self.header.microbatches

    @property
    def num_layers(self) -> int:
        return len(self.table.layers)

    @property
    def memory(self) -> int | None:
        return self.header.memory

    def lower_bound(self) -> float:
        """No plan runs faster than the largest of: all work spread evenly over the devices; the
        heaviest layer times the micro-batches (a layer is never split); one micro-batch's path
        through every layer (all forwards, the input-gradient backwards down to some layer, its
        W), messages left out since a plan may keep layers together. Unlike the simulator's
        bound, which is a plan's (its stages, its messages), this one holds for every plan of
        the problem, so all are measured against the same number."""
        layers = self.table.layers
        b_from = np.cumsum([l.b for l in reversed(layers)])[::-1]
        path = sum(l.f for l in layers) + float(np.max(b_from + [l.w for l in layers]))
        return max(float(self.work.sum()) * self.microbatches / self.devices,
                   float(self.work.max()) * self.microbatches, path)

    def tight_lower_bound(self) -> float:
        """lower_bound() made tighter by the wait of each layer's device and by the memory limit
        (memory_lower_bound()). The wait: no op of a layer can start before the forwards of the
        layers before it (for the first micro-batch), and after the layer's last input-gradient
        backward come either its remaining W or the backwards of the layers before it. So per
        layer: forwards before + M x (F + B) + max(M x W, backwards before). Where one layer
        outweighs a device's fair share (an LM head on 16 devices), this is what even a perfect
        plan needs, and lower_bound() cannot be reached."""
        f, b, w = (np.array([getattr(l, k) for l in self.table.layers]) for k in "fbw")
        before_f = np.cumsum(f) - f
        before_b = np.cumsum(b) - b
        m = self.microbatches
        layer = before_f + m * (f + b) + np.maximum(m * w, before_b)
        return max(self.lower_bound(), float(layer.max()), self.memory_lower_bound())

    def memory_lower_bound(self) -> float:
        """No plan within the memory limit runs faster than this (0 without a limit, inf when
        the static bytes alone overflow the devices). A micro-batch holds a layer's activations
        from the start of its forward to the end of its input-gradient backward, at least the F
        and B of that layer and of every later one, and the part kept for W through W too. In
        an iteration of T seconds the devices offer T x (P x limit - all static bytes)
        byte-seconds beside the static bytes, so T >= M x (byte-seconds held per micro-batch) /
        (P x limit - all static bytes). It binds when the memory left beside the parameters
        throttles the micro-batches in flight (nemotron-h-56b on 16 devices of 80 GiB)."""
        if self.memory is None:
            return 0.0
        layers = self.table.layers
        f, b, w, act, act_w, static = (np.array([getattr(l, k) for l in layers], float)
                                       for k in ("f", "b", "w", "act", "act_w", "static"))
        later = np.cumsum((f + b)[::-1])[::-1]  # F + B of each layer and all after it
        held = self.microbatches * float((act * later + act_w * w).sum())
        room = self.devices * float(self.memory) - float(static.sum())
        if held == 0:
            return 0.0
        return held / room if room > 0 else math.inf

    def why_no_plan_fits(self) -> str | None:
        """Why no partition can fit the memory limit, for the user; None when some may. A
        device holds its layers' static bytes all the time and, while its deepest stage runs
        the first micro-batch's forward, that micro-batch's activations of all its layers
        (their backwards come later): so the static bytes and one micro-batch's activations of
        all layers must fit in all the devices' memory together, and each layer's in one
        device's. (memory_lower_bound() is finite whenever this is None.)"""
        limit = self.memory
        if limit is None:
            return None
        layers = self.table.layers
        P = self.devices
        static = sum(l.static for l in layers)
        act = sum(l.act for l in layers)
        if static + act > P * limit:
            return (f"no plan fits in {size(limit)} per device: on {P} devices the parameters, "
                    f"gradients and optimizer state take {size(static / P)} per device and one "
                    f"micro-batch's activations {size(act / P)} more; use at least "
                    f"{math.ceil((static + act) / limit)} devices, a larger memory limit or "
                    "smaller micro-batches")
        i = max(range(len(layers)), key=lambda k: layers[k].static + layers[k].act)
        if layers[i].static + layers[i].act > limit:
            return (f"no plan fits in {size(limit)} per device: layer {i} ({layers[i].kind}) "
                    f"alone holds {size(layers[i].static + layers[i].act)} with one "
                    "micro-batch's activations; use a larger memory limit or smaller "
                    "micro-batches")
        return None

    def skeleton(self, layout: StageLayout) -> Plan:
        """A plan with the layout's partition and placement and an empty schedule."""
        return Plan(self.header.model_copy(), layout.stages(), layout.placement(self.devices),
                    [[] for _ in range(self.devices)])

    def stage_costs(self, plan: Plan) -> list[StageCost]:
        return self.table.stage_costs(plan)

    def with_schedule(self, plan: Plan, schedule: list[list[Slot]]) -> Plan:
        return replace(plan, schedule=schedule)
