"""Small problems with hand-picked costs, for tests whose optimum is known."""

from __future__ import annotations

from dataclasses import replace

from octodsl.costs.table import CostTable, LayerCost, Link
from octodsl.plan import Header, Op, OpKind, Plan, Recompute, Slot
from octodsl.tune.problem import Problem, RecomputeChoice

FREE = Link("none", 0.0, 0.0)


HELD = 18 / 16
"""Of the static bytes a problem's table counts (16 per parameter of a bf16 model), what its
devices hold at zero 0, dp 1 under the runtime the tests' headers imply: DeepSpeed's BF16
optimizer's 18 (octodsl.costs.param_bytes)."""


def problem(
    work: list[float] | list[tuple[float, float, float]],
    devices: int,
    microbatches: int,
    memory: float | None = None,
    act: float = 1.0,
    static: float | list[float] = 0.0,
    link: Link = FREE,
    recompute: RecomputeChoice = Recompute.NONE,
    sel_act: float = 0.0,
    dp: int = 1,
    zero: int = 0,
) -> Problem:
    """A problem over layers of the given F + B + W (split 1:1:1) or (F, B, W) seconds; each
    layer holds `act` bytes per micro-batch (half of it until W; selective recompute drops
    `sel_act` of them for a third of its F) and `static` bytes (one number for all layers, or
    one per layer), which the table counts at 16 per parameter and the devices hold as the
    header's runtime does (`HELD` of them at zero 0, dp 1). No recompute unless asked: the
    tests' optima are known without it."""
    layers = []
    for i, x in enumerate(work):
        f, b, w = (x / 3,) * 3 if isinstance(x, (int, float)) else x
        held = static[i] if isinstance(static, list) else static
        layers.append(
            LayerCost(
                "mlp",
                f,
                b,
                w,
                act,
                act / 2,
                held,
                1,
                1.0,
                sel_f=f / 3 if sel_act else 0.0,
                sel_act=sel_act,
            )
        )
    header = Header(
        name="test",
        devices=devices,
        microbatches=microbatches,
        memory=None if memory is None else int(memory),
        dp=dp,
        zero=zero,
    )
    return Problem(CostTable(layers, "test"), header, link, recompute)


def fuse_backwards(plan: Plan, every: int = 1) -> Plan:
    """`plan` with the backward of every `every`-th micro-batch fused (B as BW, its W dropped)."""

    def fuse(op: Op) -> list[Slot]:
        if op.mb % every or op.kind not in (OpKind.B, OpKind.W):
            return [Slot((op,))]
        return [Slot((Op(OpKind.BW, op.stage, op.mb),))] if op.kind == OpKind.B else []

    return replace(
        plan, schedule=[[x for slot in row for x in fuse(*slot.ops)] for row in plan.schedule]
    )
