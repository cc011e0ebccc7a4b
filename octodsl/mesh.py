"""The device mesh of a plan: tp x pp x dp ranks in Megatron's order, and which ranks share a node.

Rank order is Megatron-LM's (`parallel_state`): tp fastest, then dp, then pp, so global rank
r = (pp x dp + d) x tp + t for pipeline device pp, data-parallel copy d, tp rank t. Node of a rank:
r // gpus_per_node. A tp group then sits inside one node whenever tp divides gpus_per_node, and
the pipeline's neighbours sit in other nodes once tp x dp >= gpus_per_node.

Expert parallelism (`ep`) is carved out of dp as Megatron-core orders it (tp, then ep, then the
rest of dp: tp-cp-ep-dp-pp): an ep group is `ep` consecutive dp copies of one tp rank, ranks tp
apart, so it stays inside a node when tp x ep divides gpus_per_node (<= 8 on DGX nodes) and
crosses nodes otherwise.
"""

from __future__ import annotations

from dataclasses import dataclass

from .plan import Header


@dataclass(frozen=True, slots=True)
class Mesh:
    """tp x pp x dp ranks on nodes of `gpus_per_node`."""

    tp: int
    pp: int
    """Pipeline devices (the plan's `devices`); each is a tp group of GPUs."""
    dp: int
    gpus_per_node: int = 8
    ep: int = 1
    """Expert-parallel degree: consecutive dp copies per ep group (divides dp)."""

    @classmethod
    def of(cls, header: Header) -> Mesh:
        return cls(header.tp, header.devices, header.dp, header.gpus_per_node, header.ep)

    @property
    def world(self) -> int:
        """GPUs (processes) of the whole job."""
        return self.tp * self.pp * self.dp

    @property
    def nodes(self) -> int:
        """Nodes the job occupies (the last one possibly partly)."""
        return -(-self.world // self.gpus_per_node)

    def rank(self, pp: int, dp: int = 0, tp: int = 0) -> int:
        """Global rank of (pipeline device, data-parallel copy, tp rank)."""
        return (pp * self.dp + dp) * self.tp + tp

    def coords(self, rank: int) -> tuple[int, int, int]:
        """(pp, dp, tp) of a global rank."""
        rest, tp = divmod(rank, self.tp)
        pp, dp = divmod(rest, self.dp)
        return pp, dp, tp

    def node(self, rank: int) -> int:
        return rank // self.gpus_per_node

    def _straddles(self, first: int, span: int, count: int, step: int) -> bool:
        """Whether for some k < count the ranks first + k*step and first + k*step + span sit in
        different nodes (each check is bounded by gpus_per_node, whatever the mesh's size)."""
        g = self.gpus_per_node
        if span >= g:
            return span > 0
        # The pattern of nodes repeats after g ranks, so g starting points cover every case.
        return any(
            self.node(first + k * step) != self.node(first + k * step + span)
            for k in range(min(count, g))
        )

    @property
    def tp_spans_nodes(self) -> bool:
        """Whether some tp group has GPUs in two nodes (its collectives then leave NVLink)."""
        return self.tp > 1 and self._straddles(0, self.tp - 1, self.pp * self.dp, self.tp)

    def dp_spans_nodes(self, pp: int = 0) -> bool:
        """Whether pipeline device `pp`'s data-parallel groups have GPUs in two nodes."""
        return self.dp > 1 and self._straddles(self.rank(pp), (self.dp - 1) * self.tp, self.tp, 1)

    def dp_ranks_per_node(self, pp: int = 0) -> int:
        """GPUs of pipeline device `pp`'s data-parallel group (its first tp rank's) in the node of
        the group's first rank, at most dp: consecutive copies are tp ranks apart. Each drives
        its own network port, so a ring over the group moves this many ports' worth across nodes."""
        first = self.rank(pp)
        end = (self.node(first) + 1) * self.gpus_per_node
        return max(1, min(self.dp, -(-(end - first) // self.tp)))

    @property
    def ep_spans_nodes(self) -> bool:
        """Whether some ep group has GPUs in two nodes (its all-to-alls then leave NVLink): the
        group of tp rank t and copies j..j + ep - 1 is ranks rank(pp, j) + t + i x tp, i < ep.
        Nodes repeat every gpus_per_node ranks, so gpus_per_node first ranks and tp offsets
        cover every group."""
        if self.ep == 1:
            return False
        groups = self.pp * max(1, self.dp // self.ep)
        span, step = (self.ep - 1) * self.tp, self.ep * self.tp
        return any(
            self._straddles(t, span, groups, step) for t in range(min(self.tp, self.gpus_per_node))
        )

    @property
    def ep_ranks_per_node(self) -> int:
        """GPUs of an ep group that share a node: all ep of them when it stays inside one, else
        the group's ranks (tp apart) that fit in a node, gpus_per_node // tp (at least 1; a node
        boundary inside a tp group is W702's case, costed as if aligned)."""
        if not self.ep_spans_nodes:
            return self.ep
        return max(1, min(self.ep, self.gpus_per_node // self.tp))

    def crosses_nodes(self, a: int, b: int) -> bool:
        """Whether messages between pipeline devices `a` and `b` leave a node: for some
        (dp, tp) coordinate, the two ranks sit in different nodes (the stage's tp ranks move in
        lockstep, so the slowest pair sets the pace)."""
        lo, hi = min(a, b), max(a, b)
        block = self.tp * self.dp
        return hi > lo and self._straddles(self.rank(lo), (hi - lo) * block, block, 1)
