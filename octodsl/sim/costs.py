"""`SimCosts`: what `simulate` needs to know about costs, beyond each stage's StageCost."""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass, field
from operator import attrgetter

import numpy as np

from ..costs import levers
from ..costs.devices import CommSms
from ..costs.param_bytes import ParamBytes, StaticBytes
from ..costs.table import CostTable, StageCost
from ..models.ep import ep_problem
from ..models.spec import DTYPE_BYTES
from ..plan import Header, Plan, PlanError
from .sharing import Sharing

_SIMULATED = (
    "f",
    "b",
    "w",
    "fused_backward",
    "act",
    "act_w",
    "act_b",
    "static",
    "send_bytes",
    "update",
    "ep_f",
    "ep_b",
)
"""The StageCost columns every simulation reads (`SimCosts.column`)."""


@dataclass(frozen=True)
class SimCosts:
    stages: tuple[StageCost, ...]
    """Per stage, per micro-batch."""
    grad_bytes: tuple[float, ...] | None = None
    """Per stage: gradient bytes each data-parallel copy all-reduces (None: unknown, 0)."""
    layer_work: float | None = None
    """F + B + W of the heaviest single layer, for the lower bound (None: heaviest stage)."""
    tokens_per_microbatch: int | None = None
    """For the throughput (None: unknown)."""
    source: str = ""
    """Where the numbers came from, for reports."""
    sharing: Sharing | None = None
    """Devices that share processors (a calibrated CPU machine); None: each has its own."""
    step_overhead: float = 0.0
    """Seconds per iteration after every device is done (synchronising at the step)."""
    param_bytes: StaticBytes | None = None
    """Bytes per parameter behind the stages' static bytes, as the plan's runtime holds them
    (None: unknown)."""
    zero: int = 0
    dp: int = 1
    """The ZeRO stage and data-parallel copies the stages' static bytes are sharded over."""
    grad_reduce_bytes: float = 2.0
    """Bytes per parameter in `grad_bytes` (the parameters' all-gather under ZeRO moves
    `param_bytes.weights` each)."""
    message_overhead: float = 0.0
    """Seconds each pipeline message costs beyond its link's time (the device's
    `Overheads.message_seconds`; 0 for measured costs, whose link is fitted)."""
    expert_grad_bytes: tuple[float, ...] | None = None
    """Per stage: of `grad_bytes`, the routed experts' (None: none), which under expert
    parallelism are reduced over dp / ep copies (dpcomm.py)."""
    ep: int = 1
    """The expert-parallel degree the costs are for."""
    tied_stage: int = -1
    """The stage that holds its own copy of tied word embeddings (`CostTable.tied_copy`; -1:
    none). Its gradient is all-reduced with stage 0's (dpcomm.py)."""
    tied_bytes: float = 0.0
    """Bytes that all-reduce moves on each of the two devices: the embedding's gradient in
    the runtime's accumulation dtype (DeepSpeed's BF16 optimizer's fp32 `_hp_grad` or the
    model's dtype `.grad`; Megatron-LM's `main_grad`)."""
    comm_sms: CommSms = CommSms()
    """The SMs a collective holds while it runs under compute, of `sms` (the device's
    `Device.comm_sms`; none for measured costs)."""
    sms: int = 0
    """The device's SMs (0: unknown, or a CPU)."""
    _columns: dict[str, np.ndarray] = field(
        default_factory=dict, init=False, repr=False, compare=False
    )
    """`column` by name (the costs are frozen; `replace` starts a new one)."""

    def column(self, name: str) -> np.ndarray:
        """Per stage, StageCost's `name` (a field, or `fused_backward`) as a read-only array:
        built once per costs, which the tuner simulates many times (`Problem.sim_costs` keeps
        each layout's); the columns every simulation reads all at the first of them, in one
        pass over the stages."""
        got = self._columns.get(name)
        if got is None:
            names = _SIMULATED if name in _SIMULATED else (name,)
            rows = list(map(attrgetter(*names), self.stages)) if len(names) > 1 else None
            table = (
                np.array(rows, float).reshape(len(self.stages), len(names)).T.copy()
                if rows is not None
                else np.array([[getattr(c, name) for c in self.stages]], float)
            )
            table.flags.writeable = False
            self._columns.update(zip(names, table, strict=True))
            got = self._columns[name]
        return got

    @functools.cached_property
    def op_bytes(self) -> tuple[np.ndarray, np.ndarray]:
        """`levers.op_bytes` of the stages' activations: per stage and kind code, the bytes an
        op allocates and releases; built once per costs (read-only: simulations share them)."""
        tables = levers.op_bytes(*(self.column(k) for k in ("act", "act_w", "act_b")))
        for t in tables:
            t.flags.writeable = False
        return tables

    def static_parts(self, stage: int) -> ParamBytes | None:
        """The stage's static bytes on one copy split into weights, gradients and optimizer
        state, after sharding (None when the per-parameter bytes are unknown)."""
        pb = self.param_bytes
        if pb is None:
            return None
        mine = pb.sharded(self.zero, self.dp)
        if self.ep > 1 and self.expert_grad_bytes is not None and self.grad_bytes:
            # the experts' parameters are sharded over their own dp / ep copies: the mix by part
            x = (
                self.expert_grad_bytes[stage] / self.grad_bytes[stage]
                if self.grad_bytes[stage]
                else 0.0
            )
            experts = pb.sharded(self.zero, max(1, self.dp // self.ep))
            mine = ParamBytes(
                *((1 - x) * a + x * b for a, b in zip(_parts(mine), _parts(experts), strict=True))
            )
        scale = self.stages[stage].static / mine.total if mine.total > 0 else 0.0
        return ParamBytes(mine.weights * scale, mine.grads * scale, mine.optimizer * scale)

    @classmethod
    def of(cls, costs: SimCosts | Sequence[StageCost]) -> SimCosts:
        return costs if isinstance(costs, SimCosts) else cls(tuple(costs))

    @classmethod
    def from_table(cls, table: CostTable, plan: Plan) -> SimCosts:
        """Stage costs of the plan's partition (for a plan that names no layers, the split the
        executor runs: `CostTable.stage_ranges`), with the plan's recompute and ZeRO sharding
        of the bytes the plan's runtime holds, its gradients reduced in the dtype that runtime
        reduces them in (`CostTable.plan_bytes`). Raises PlanError when the partition does
        not fit the table's layers, when the table is costed at another tensor-parallel
        degree (or sequence parallelism) than the plan's, or when the runtime does not
        accumulate in the plan's `grad_accum_dtype`."""
        h = plan.header
        check_tp(table, h)
        check_ep(table, h)
        ranges = table.stage_ranges(plan)
        held = table.plan_bytes(h)
        stages = table.stage_costs(plan, ranges)
        per = held.reduce_bytes
        grads = [table.grad_params(a, b) * per for a, b in ranges]
        copy = table.tied_copy(plan)
        if copy is not None:  # the LM head's stage reduces its copy of the tied embeddings too
            grads[copy] += table.grad_params(0, 0) * per
        expert = (
            tuple(table.expert_grad_params(a, b) * per for a, b in ranges) if h.ep > 1 else None
        )
        cal = table.calibration
        sharing = (
            None
            if cal is None
            else Sharing(cal.cores, cal.contention, cal.overlap_slowdown, cal.oversubscription)
        )
        return cls(
            tuple(stages),
            tuple(grads),
            max(layer.f + layer.b + layer.w for layer in table.layers),
            table.tokens_per_microbatch or None,
            table.source,
            sharing,
            0.0 if cal is None else cal.step_overhead,
            held,
            h.zero,
            h.dp,
            held.reduce_bytes,
            float(table.meta.get("message_overhead", 0.0)),
            expert,
            h.ep,
            -1 if copy is None else copy,
            0.0 if copy is None else table.grad_params(0, 0) * DTYPE_BYTES[held.accum_dtype],
            CommSms(**table.meta.get("comm_sms", {})),
            int(table.meta.get("sms", 0)),
        )


def _parts(pb: ParamBytes) -> tuple[float, float, float]:
    return pb.weights, pb.grads, pb.optimizer


class TpMismatch(PlanError):
    """A cost table costed at another tensor-parallel (or expert-parallel) degree than the plan
    runs."""


def check_ep(table: CostTable, h: Header) -> None:
    """TpMismatch unless `table` is costed at the header's expert-parallel degree (meta "ep",
    default 1), and that ep divides the header's dp (`octodsl.models.ep.ep_problem`)."""
    if table.ep != h.ep:
        raise TpMismatch(
            f"the costs ({table.source or 'the cost table'}) are for ep {table.ep}, the plan "
            f"runs ep {h.ep}: cost the plan with its own header (the analytical model, "
            "--model, costs any ep)"
        )
    problem = ep_problem(None, h.ep, h.dp)
    if problem is not None:
        raise TpMismatch(problem[1])


def check_tp(table: CostTable, h: Header) -> None:
    """TpMismatch unless `table` holds one GPU's share at the header's tensor-parallel degree
    (and, for tp > 1, with its sequence parallelism, its collectives under the GEMMs or not, its
    messages scattered or not): the table's meta "tp" (default 1), "sp", "overlap_tp_comm" and
    "scatter_gather_messages"."""
    tp, sp = h.tp, h.sp
    own = int(table.meta.get("tp", 1))
    own_sp = bool(table.meta.get("sp", own > 1))
    if own == tp and (tp == 1 or own_sp == sp):
        for field, applies in (
            ("overlap_tp_comm", tp > 1),
            ("scatter_gather_messages", tp > 1 and not sp),
        ):
            theirs, mine = bool(table.meta.get(field, False)), bool(getattr(h, field))
            if applies and theirs != mine:
                raise TpMismatch(
                    f"the costs ({table.source or 'the cost table'}) are for "
                    f"{field} {str(theirs).lower()}, the plan says "
                    f"{str(mine).lower()}: cost the plan with its own header"
                )
        return
    shown = f"tp {own}" + (
        f" with sequence parallelism {'on' if own_sp else 'off'}" if own > 1 else ""
    )
    wanted = f"tp {tp}" + (f" with sequence parallelism {'on' if sp else 'off'}" if tp > 1 else "")
    raise TpMismatch(
        f"the costs ({table.source or 'the cost table'}) are for {shown}, the plan "
        f"runs {wanted}: profile at the plan's tp, or use the analytical model "
        "(--model), which costs any tp"
    )
