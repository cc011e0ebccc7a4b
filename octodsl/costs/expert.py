"""The time of expert parallelism's all-to-alls on the links an ep group spans (the bytes are
`octodsl.models.ep`'s, where the group's ranks sit `octodsl.mesh`'s)."""

from __future__ import annotations

from dataclasses import dataclass

from .table import Link


@dataclass(frozen=True, slots=True)
class EpLinks:
    """The links of an ep group's all-to-alls: `node` between its ranks in one node, `inter`
    between nodes; `node_ranks` of its ranks share a node (all of them: the group stays inside
    one, `Mesh.ep_ranks_per_node`)."""

    node: Link
    inter: Link
    node_ranks: int

    def describe(self, ep: int) -> str:
        """'nvlink' for a group inside a node, else 'ib-ndr (4 of 16 per node)'."""
        if self.node_ranks >= ep:
            return self.node.name
        return f"{self.inter.name} ({self.node_ranks} of {ep} per node)"


def all_to_all_time(nbytes: float, ep: int, links: EpLinks) -> float:
    """Seconds of one all-to-all in which a rank of an `ep` group sends `nbytes` to its peers
    (and receives as many), nbytes / (ep - 1) to each.

    NCCL's all-to-all is ep - 1 point-to-point sends and receives in one group (ncclGroupStart,
    ncclSend / ncclRecv to every peer; NCCL's "Point-to-point communication" examples, and
    torch.distributed.all_to_all_single on NCCL), each paying the link's latency; nccl-tests
    defines its bus bandwidth as algbw x (n - 1) / n, the bytes that leave the rank over the
    time, so a link's per-GPU bandwidth carries exactly `nbytes`. The peers inside the node and
    those in other nodes are reached over different links at once (NVLink and the GPU's own
    NIC), so the slower side sets the time:

        t = max((q - 1) x node.time(c), (ep - q) x inter.time(c)),  c = nbytes / (ep - 1)

    with q = `links.node_ranks` of the group in one node and Link.time(c) = latency + c /
    bandwidth. Inside one node (q = ep) this is (ep - 1) latencies + nbytes / bandwidth, one
    ring pass's time (`Link.ring(nbytes x ep / (ep - 1), ep, 1)`). 0 at ep 1."""
    if ep <= 1:
        return 0.0
    q = max(1, min(links.node_ranks, ep))
    c = nbytes / (ep - 1)
    inside = (q - 1) * links.node.time(c) if q > 1 else 0.0
    across = (ep - q) * links.inter.time(c) if q < ep else 0.0
    return max(inside, across)
