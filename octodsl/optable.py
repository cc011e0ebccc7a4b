"""A plan's ops as integer arrays, for the checks that look at every op of a plan at the op limit
(the deadlock walk): one pass over the Op objects, then numpy.

Ops are in the plan's order (device by device, slot by slot); a node is a slot (an overlap group
is one node), numbered in the same order, as dag.build_graph numbers them.
"""

from __future__ import annotations

from dataclasses import dataclass
from operator import attrgetter

import numpy as np

from .plan import OpKind, Plan

KIND_OF_CODE = (OpKind.F, OpKind.B, OpKind.W, OpKind.BW)
"""Op kinds by their code: here, in the simulator's program (sim/program.py) and in the tuner's
constructor (tune/pipeline/construct.py)."""
F, B, W, BW = range(4)
KIND_CODE = {k: i for i, k in enumerate(KIND_OF_CODE)}
"""The code of each op kind."""


@dataclass(frozen=True, slots=True)
class OpTable:
    kind: np.ndarray
    """Each op's kind, as its code (KIND_CODE)."""
    stage: np.ndarray
    mb: np.ndarray
    node: np.ndarray
    """The node (slot) each op belongs to."""
    device: np.ndarray
    """The device whose schedule lists each op."""
    device_nodes: list[range]
    """Each device's nodes."""

    @property
    def num_nodes(self) -> int:
        return self.device_nodes[-1].stop if self.device_nodes else 0

    def keys(self, stages: int, microbatches: int) -> np.ndarray | None:
        """Each op's (kind, stage, mb) as one number below 4 x stages x microbatches, or None
        when an op's stage or micro-batch is outside the plan."""
        s, m = self.stage, self.mb
        if len(s) and (s.min() < 0 or s.max() >= stages or m.min() < 0 or m.max() >= microbatches):
            return None
        return (self.kind.astype(np.int64) * stages + s) * microbatches + m


def op_table(plan: Plan) -> OpTable:
    slots = [slot for device in plan.schedule for slot in device]
    op_groups = list(map(attrgetter("ops"), slots))
    widths = np.fromiter(map(len, op_groups), np.int64, len(op_groups))
    if len(widths) and widths.max() > 1:
        ops = [op for group in op_groups for op in group]
    else:  # no overlap group: one op per slot
        ops = [group[0] for group in op_groups]
    n = len(ops)
    kind = np.fromiter(map(KIND_CODE.__getitem__, map(attrgetter("kind"), ops)), np.int8, n)
    stage = np.fromiter(map(attrgetter("stage"), ops), np.int64, n)
    mb = np.fromiter(map(attrgetter("mb"), ops), np.int64, n)
    node = np.repeat(np.arange(len(slots)), widths)
    lengths = [len(device) for device in plan.schedule]
    node_device = np.repeat(np.arange(len(lengths)), lengths)
    starts = np.concatenate(([0], np.cumsum(lengths))).tolist()
    return OpTable(
        kind,
        stage,
        mb,
        node,
        node_device[node],
        [range(a, b) for a, b in zip(starts[:-1], starts[1:], strict=True)],
    )
