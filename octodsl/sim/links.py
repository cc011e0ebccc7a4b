"""Which link each transfer of a simulation takes, by where its ranks sit (octodsl.mesh).

- Pipeline messages across the cut between stages s and s + 1 run between the GPUs of two
  pipeline devices (each a tp group; its ranks move in lockstep, so the slowest pair sets the
  pace): on the inter-node link when some pair of them sits in different nodes, else on the
  intra-node one. The placement fixes it per cut, so a compiled program holds it
  (`SimProgram.cut_inter`) and a simulation only picks each cut's time.
- A device's data-parallel collectives run over its dp group: on the inter-node link when the
  group has GPUs in two nodes (`Mesh.dp_spans_nodes`), else on the intra-node one; a dp link
  given explicitly (`--dp-link`) overrides both. Across nodes, a group with k GPUs in each node
  moves k ports' worth: NCCL runs one ring per network port (multi-rail), so the ring's
  bandwidth is k x the inter-node link's, at most the node link's (`dp_link`). With k = 8, 8 x
  24 GB/s reproduces DGX A100's published 192 GB/s across nodes of 8 x HDR.
- The tensor-parallel collectives are in the costs already (StageCost.tp_f/tp_b/tp_w, costed
  on the node's link by the cost model); the simulator only reports them.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from ..costs.devices import CommSms
from ..costs.table import Link
from ..mesh import Mesh


def cut_crosses_nodes(mesh: Mesh, stage_device: Sequence[int] | np.ndarray) -> np.ndarray:
    """Per stage s: True when messages across the cut s|s+1 leave a node (False for the last
    stage, and for a cut between stages of one device, which sends nothing)."""
    S = len(stage_device)
    out = np.zeros(S, bool)
    # Cuts between the same two devices repeat (a V or a loop placement): each pair once.
    seen: dict[tuple[int, int], bool] = {}
    for s in range(S - 1):
        a, b = int(stage_device[s]), int(stage_device[s + 1])
        if a != b:
            key = (min(a, b), max(a, b))
            if key not in seen:
                seen[key] = mesh.crosses_nodes(a, b)
            out[s] = seen[key]
    return out


def dp_spans_nodes(mesh: Mesh) -> np.ndarray:
    """Per pipeline device: True when its data-parallel group has GPUs in two nodes."""
    return np.array([mesh.dp_spans_nodes(d) for d in range(mesh.pp)], bool)


def dp_rails(mesh: Mesh) -> np.ndarray:
    """Per pipeline device: GPUs of its data-parallel group per node (`Mesh.dp_ranks_per_node`)."""
    return np.array([mesh.dp_ranks_per_node(d) for d in range(mesh.pp)], np.int64)


def dp_link(intra: Link, inter: Link, spans_nodes: bool, rails: int) -> Link:
    """The link of a data-parallel ring: `intra` inside one node; across nodes `inter` with
    `rails` ports driven at once (the group's GPUs per node), at most `intra`'s bandwidth."""
    if not spans_nodes:
        return intra
    if rails <= 1 or inter.bandwidth <= 0:
        return inter
    bandwidth = rails * inter.bandwidth
    if intra.bandwidth > 0:
        bandwidth = min(bandwidth, intra.bandwidth)
    return Link(f"{inter.name} x{rails}", inter.latency, bandwidth)


def dp_links(intra: Link, inter: Link, spans_nodes: np.ndarray, rails: np.ndarray) -> list[Link]:
    """Per device: the link of its data-parallel ring (`dp_link`), from whether its group spans
    nodes and its GPUs per node (`dp_spans_nodes`, `dp_rails`)."""
    return [
        dp_link(intra, inter, x, k)
        for x, k in zip(spans_nodes.tolist(), rails.tolist(), strict=True)
    ]


def dp_overlap_slowdown(
    comm: CommSms, sms: int, spans_nodes: np.ndarray, rails: np.ndarray
) -> np.ndarray:
    """Per device: the fraction of its compute's rate a data-parallel collective running under
    it takes: its ring's CTAs (`CommSms.dp`, by whether its group spans nodes and its GPUs per
    node) over the device's SMs (0 without SMs)."""
    if sms <= 0:
        return np.zeros(len(spans_nodes))
    return np.array(
        [
            min(1.0, comm.dp(k, x) / sms)
            for x, k in zip(spans_nodes.tolist(), rails.tolist(), strict=True)
        ]
    )


@functools.lru_cache(maxsize=64)
def _dp_links(
    intra: Link, inter: Link, spans_nodes: tuple[bool, ...], rails: tuple[int, ...]
) -> tuple[Link, ...]:
    """`dp_links`, remembered: every simulation of a search asks for the same few (links of
    the same name and figures give the same rings)."""
    return tuple(dp_links(intra, inter, np.array(spans_nodes, bool), np.array(rails, np.int64)))


def link_times(link: Link, nbytes: np.ndarray) -> np.ndarray:
    """`link.time` of each element, vectorised."""
    nbytes = np.asarray(nbytes, float)
    if link.bandwidth <= 0:
        return np.full(nbytes.shape, link.latency)
    return link.latency + nbytes / link.bandwidth


@dataclass(frozen=True)
class Links:
    """The links of one simulation."""

    intra: Link
    """Inside a node: pipeline messages between devices of one node."""
    inter: Link
    """Between nodes: pipeline messages whose ranks sit in different nodes."""
    dp_given: Link | None
    """The link of every data-parallel collective, when given (None: by where its group sits)."""
    cut_inter: np.ndarray
    """Per stage s: whether the cut s|s+1 is on `inter` (SimProgram.cut_inter)."""
    dp_inter: np.ndarray
    """Per device: whether its dp group spans nodes (SimProgram.dp_inter)."""
    dp_rails: np.ndarray
    """Per device: its dp group's GPUs per node (SimProgram.dp_rails)."""

    @classmethod
    def of(
        cls,
        cut_inter: np.ndarray,
        dp_inter: np.ndarray,
        dp_rails: np.ndarray,
        link: Link,
        inter_link: Link | None = None,
        dp_link: Link | None = None,
    ) -> Links:
        """`link` inside nodes, `inter_link` between them (None: `link` everywhere, as on one
        node), `dp_link` for every data-parallel collective (None: by where its group sits)."""
        return cls(
            link, link if inter_link is None else inter_link, dp_link, cut_inter, dp_inter, dp_rails
        )

    @property
    def dp(self) -> list[Link]:
        """Per device: the link of its data-parallel collectives."""
        if self.dp_given is not None:
            return [self.dp_given] * len(self.dp_inter)
        return list(
            _dp_links(
                self.intra, self.inter, tuple(self.dp_inter.tolist()), tuple(self.dp_rails.tolist())
            )
        )

    def cut_times(self, send_bytes: np.ndarray) -> np.ndarray:
        """Per stage: seconds of one message across its cut (`send_bytes[s]` bytes)."""
        return cut_times(send_bytes, self.cut_inter, self.intra, self.inter)


def cut_times(
    send_bytes: np.ndarray, cut_inter: np.ndarray, intra: Link, inter: Link
) -> np.ndarray:
    """Per stage: seconds of one message of `send_bytes[s]` across its cut, on `inter` where
    `cut_inter[s]`, else on `intra`."""
    within = link_times(intra, send_bytes)
    if inter is intra or not cut_inter.any():
        return within
    return np.where(cut_inter, link_times(inter, send_bytes), within)
