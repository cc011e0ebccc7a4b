"""What the tuner is asked: a model's per-layer costs (one GPU's share at the header's tp),
devices, micro-batches, a memory limit, the links inside and between nodes and the memory levers
it may pull (ZeRO over dp copies in the header, recompute, what of a given plan it must keep);
and the one way it turns a layout and a schedule into a Plan. Its lower bounds are in
bounds.py, what it tells the user when no plan fits in advice.py."""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field, replace
from operator import attrgetter
from typing import Literal

import numpy as np
from pydantic import ValidationError

from .. import limits
from ..costs.devices import INTER_NODE_LINK, get_device, get_link
from ..costs.param_bytes import StaticBytes
from ..costs.resolve import cost_table, header_costing
from ..costs.table import CostTable, Link, StageCost
from ..errors import OctoError
from ..mesh import Mesh
from ..models import load_model
from ..plan import Header, Plan, Recompute, Slot
from ..sim.costs import SimCosts
from .pipeline.layout import SAVING, StageLayout

_COSTS_KEPT = 1 << 14
"""Layouts whose costs `Problem.sim_costs` keeps (a few MB); it starts again when full."""

_STAGE_KEY = attrgetter("first", "last", "symbols", "recompute")
"""What of a stage its costs depend on (`Problem.sim_costs`' key)."""

AUTO: Literal["auto"] = "auto"
"""`--recompute auto`: the tuner picks each stage's mode."""
RecomputeChoice = Recompute | Literal["auto"]


def recompute_everywhere(plan: Plan, mode: Recompute) -> Plan:
    """`plan` with every stage recomputing `mode`."""
    return replace(plan, stages=[replace(s, recompute=mode) for s in plan.stages])


@dataclass(frozen=True)
class Keep:
    """What of a given plan the tuner must not change (`--keep`)."""

    cuts: tuple[int, ...]
    """The partition: every plan has exactly these stages."""
    devices: tuple[int, ...] | None = None
    """The placement too (None: searched)."""

    @classmethod
    def of(cls, plan: Plan, placement: bool) -> Keep:
        layout = StageLayout.of(plan)
        return cls(layout.cuts, layout.devices if placement else None)

    def allows(self, layout: StageLayout) -> bool:
        return layout.cuts == self.cuts and self.devices in (None, layout.devices)


def check_size(model: str, num_layers: int, devices: int, microbatches: int) -> None:
    """OctoError unless the tuner can work on this many devices and micro-batches: a pipeline
    of 2 or more devices (one device has nothing to partition or place), each holding at
    least one layer, and plans within MAX_OPS with one stage per device and split backwards
    (the fewest ops of the plans it tries)."""
    if devices < 2:
        raise OctoError(
            f"tune needs at least 2 devices (a pipeline), not {devices}; a single "
            "device runs every layer in one stage: `octodsl gen 1f1b -p 1 -m "
            f"{microbatches} --model {model}` writes that plan"
        )
    if devices > num_layers:
        raise OctoError(
            f"{model} has {num_layers} layers: tune takes 2 to {num_layers} devices "
            f"(each device holds at least one layer), not {devices}"
        )
    ops = 3 * devices * microbatches
    if ops > limits.MAX_OPS:
        raise OctoError(
            f"{devices} devices x {microbatches} micro-batches make at least {ops:,} "
            f"ops per plan, more than octodsl's limit of {limits.MAX_OPS:,}; use "
            f"at most {limits.MAX_OPS // (3 * devices):,} micro-batches"
        )


@dataclass
class Problem:
    table: CostTable
    """Per layer, one GPU's share at the header's tp (and sequence parallelism)."""
    header: Header
    """Header of every plan the tuner writes: devices, micro-batches, model, memory limit, the
    mesh (dp, tp, gpus_per_node) and ZeRO."""
    link: Link
    """Between pipeline devices of one node (and the dp collectives of a group in one node)."""
    recompute: RecomputeChoice = AUTO
    """What the stages may recompute: AUTO, the tuner picks per stage; a mode, every stage
    recomputes that way (`none` never)."""
    keep: Keep | None = None
    """What every plan keeps of a given one (None: everything is searched)."""
    inter_link: Link | None = None
    """Between nodes: pipeline messages and dp collectives that leave a node (None: `link`)."""
    work: np.ndarray = field(init=False, repr=False)
    """F + B + W seconds of each layer, less its expert all-to-alls (`LayerCost.ep_f`, `ep_b`):
    the least its ops keep a device busy, since an overlap group may run them under another
    op's compute (`SimProgram.per_slot`)."""
    _costs: dict[tuple, SimCosts] = field(init=False, repr=False, default_factory=dict)
    """`sim_costs` by partition, recompute modes and header."""
    _columns: dict[str, np.ndarray] = field(init=False, repr=False, default_factory=dict)
    """`column` by field."""
    rebalanced: tuple[Header | None, dict[tuple, StageLayout]] = field(
        init=False, repr=False, default_factory=lambda: (None, {})
    )
    """`partition.rebalance`'s results by layout, seed and rounds (a function of them for the
    problem), and the header they were found under (a problem given another header starts
    again): the rounds of one state value a layout in several phases, and each search of a
    tune starts from the same layouts with seeds an earlier one used."""

    fill_models: tuple[Header | None, OrderedDict] = field(
        init=False, repr=False, default_factory=lambda: (None, OrderedDict())
    )
    """`partition._model`'s fill models by placement and recompute modes, and the header they
    were built under."""
    fill_layers: tuple[Header | None, object] = field(
        init=False, repr=False, default_factory=lambda: (None, None)
    )
    """`estimate._layer_part`'s arrays, and the header they were built under."""
    schedules: OrderedDict[tuple, tuple[SimCosts, list[list[Slot]]]] = field(
        init=False, repr=False, default_factory=OrderedDict
    )
    """`schedule.rebuild`'s latest orders by stage costs (by identity: `sim_costs` gives one
    object per partition, modes and header), placement and `w_gap`."""

    def __post_init__(self) -> None:
        # A pipeline's ops wait for messages, so each pays the host's launch time: in the
        # layers' F and B here, for the bounds and estimates as for the simulator
        self.table = self.table.pipelined()
        self.work = np.array([l.f + l.b + l.w - l.ep_f - l.ep_b for l in self.table.layers])

    def column(self, name: str) -> np.ndarray:
        """Each layer's `name` (a LayerCost field) as a read-only array, built once: the bounds
        read the same columns for every configuration a search ranks."""
        a = self._columns.get(name)
        if a is None:
            a = np.array([getattr(l, name) for l in self.table.layers], float)
            a.flags.writeable = False
            self._columns[name] = a
        return a

    @classmethod
    def create(
        cls,
        model: str,
        devices: int,
        microbatches: int,
        *,
        device: str = "H800",
        memory: int | None = None,
        link: str | Link | None = None,
        microbatch_size: int | None = None,
        seq_len: int | None = None,
        name: str | None = None,
        dp: int = 1,
        zero: int = 0,
        recompute: RecomputeChoice = AUTO,
        inter_link: str | Link | None = INTER_NODE_LINK,
        **mesh,
    ) -> Problem:
        """Analytical costs of a model (built-in name or spec path) on a built-in device, one GPU's
        share at `tp` with the tp collectives on `link` (default: the device's node link); `dp`,
        `zero` and `mesh` (header fields: tp, sequence_parallel, gpus_per_node, the runtime
        fields) go into the header of every plan.
        Pipeline messages and dp collectives that leave a node take `inter_link` (None: `link`).
        Raises OctoError with a message for the user."""
        try:
            intra = (
                link if isinstance(link, Link) else get_link(link or get_device(device).node_link)
            )
            header = Header(
                name=name or f"tuned-{model}-p{devices}-m{microbatches}",
                devices=devices,
                microbatches=microbatches,
                model=model,
                microbatch_size=microbatch_size,
                seq_len=seq_len,
                memory=memory,
                dp=dp,
                zero=zero,
                **mesh,
            )
            table = cost_table(model=model, device=device, tp_link=intra, **header_costing(header))
            check_size(model, len(table.layers), devices, microbatches)
            why = unsplit_sequence(seq_len or load_model(model).seq_len, header.tp, header.sp)
            if why is not None:
                raise OctoError(why)
        except ValidationError as e:  # a value out of the plan header's (or the spec's) range
            first = e.errors()[0]
            raise OctoError(
                f"{'.'.join(map(str, first['loc']))}: {first['msg']} (given {first['input']!r})"
            ) from None
        inter = (
            inter_link
            if isinstance(inter_link, Link) or inter_link is None
            else get_link(inter_link)
        )
        return cls(table, header, intra, recompute, inter_link=inter)

    @property
    def mesh(self) -> Mesh:
        return Mesh.of(self.header)

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

    def layer_static(self) -> np.ndarray:
        """Each layer's static bytes on its device, ZeRO applied over the header's dp copies
        (the routed experts' over dp / ep: `CostTable.layer_statics`). Only what reads
        `LayerCost.static` itself applies it: `CostTable.stage_costs` shards by the plan's
        header already."""
        h = self.header
        return np.array(self.table.layer_statics(h.zero, h.dp, self.held), float)

    @property
    def held(self) -> StaticBytes:
        """Bytes per parameter as the header's runtime holds them, and the dtypes it
        accumulates and reduces the gradients in (`CostTable.plan_bytes`)."""
        return self.table.plan_bytes(self.header)

    def accumulation(self) -> np.ndarray:
        """Each layer's gradient-accumulation pass as every plan of the problem runs it, in
        seconds per micro-batch: the table's `grad_acc` scaled to the runtime's accumulator, 0
        when the header fuses it into the GEMM (`StaticBytes.accumulation`)."""
        return self.column("grad_acc") * self.held.accumulation(
            self.header.grad_accumulation_fusion
        )

    @property
    def modes(self) -> tuple[Recompute, ...]:
        """The recompute modes a stage may have, least saving first."""
        return SAVING if self.recompute == AUTO else (Recompute(self.recompute),)

    def modes_of(self, layout: StageLayout) -> tuple[Recompute, ...]:
        """What each stage of `layout` recomputes in the plan `skeleton` makes of it: its own
        modes under AUTO, else the problem's mode everywhere."""
        if self.recompute == AUTO:
            return layout.recompute
        return (Recompute(self.recompute),) * layout.num_stages

    # The problem's headline figures, which the CLI, the whole-cluster search and the
    # benchmarks read off a problem; the arithmetic is in bounds.py and advice.py.
    def lower_bound(self) -> float:
        """`bounds.lower_bound`: what the tuner's efficiency is measured against."""
        from .bounds import lower_bound

        return lower_bound(self)

    def tight_lower_bound(self) -> float:
        """`bounds.tight_lower_bound`: the largest bound, what configurations are ranked by."""
        from .bounds import tight_lower_bound

        return tight_lower_bound(self)

    def why_no_plan_fits(self, advice: bool = True) -> str | None:
        """`advice.why_no_plan_fits`: why no plan can fit the memory limit, None when some may."""
        from .advice import why_no_plan_fits

        return why_no_plan_fits(self, advice)

    def allows(self, layout: StageLayout) -> bool:
        """Whether the tuner may produce a plan of this layout (`keep`)."""
        return self.keep is None or self.keep.allows(layout)

    def adopt(self, plan: Plan) -> Plan:
        """`plan` with the problem's recompute mode on every stage (as is under AUTO)."""
        return (
            plan
            if self.recompute == AUTO
            else recompute_everywhere(plan, Recompute(self.recompute))
        )

    def at_tp(self, tp: int) -> Problem:
        """This problem at a larger tensor-parallel degree: its costs again at that tp (sequence
        parallelism as the header says, by default on), the same levers. OctoError when the
        model does not split over `tp`."""
        h = self.header.model_copy(update={"tp": tp})
        m = self.table.meta
        table = cost_table(
            model=h.model, device=m["device"], tp_link=self.link, **header_costing(h)
        )
        return replace(self, table=table, header=h)

    def skeleton(self, layout: StageLayout) -> Plan:
        """A plan with the layout's partition, placement and recompute (`modes_of`) and an
        empty schedule."""
        stages = layout.with_recompute(self.modes_of(layout)).stages()
        return Plan(
            self.header.model_copy(),
            stages,
            layout.placement(self.devices),
            [[] for _ in range(self.devices)],
        )

    def stage_costs(self, plan: Plan) -> list[StageCost]:
        return list(self.sim_costs(plan).stages)

    def sim_costs(self, plan: Plan) -> SimCosts:
        """`SimCosts.from_table` of the problem's costs for `plan`: remembered, since a search
        costs the same few hundred layouts thousands of times (summing a stage's layers took
        longer than simulating it). Raises PlanError as from_table does."""
        key = (
            tuple(map(_STAGE_KEY, plan.stages)),
            plan.header.model_dump_json(exclude={"name"}),
            self.table.tied_copy(plan),  # tied embeddings: whether the LM head holds a copy
        )
        costs = self._costs.get(key)
        if costs is None:
            if len(self._costs) >= _COSTS_KEPT:
                self._costs.clear()
            costs = self._costs[key] = SimCosts.from_table(self.table, plan)
        return costs

    def with_schedule(self, plan: Plan, schedule: list[list[Slot]]) -> Plan:
        return replace(plan, schedule=schedule)


def unsplit_sequence(seq_len: int, tp: int, sequence_parallel: bool) -> str | None:
    """Why sequence parallelism cannot split a sequence over the tp group (lint's E703), or
    None: its length must be a multiple of tp."""
    if tp == 1 or not sequence_parallel or seq_len % tp == 0:
        return None
    return (
        f"sequence parallelism splits the sequence over tp {tp}, but its length {seq_len} "
        f"is not a multiple of {tp} (give a --seq-len that is, or --sequence-parallel false)"
    )
