"""Device and link descriptions for the analytical cost model (built-ins; no files)."""

from __future__ import annotations

from dataclasses import dataclass, field

from ..errors import OctoError
from .table import Link


@dataclass(frozen=True, slots=True)
class Efficiency:
    """Achievable fractions of peak, per kind of work (the analytical model's calibration)."""

    gemm: float = 0.7
    """Weight GEMMs (projections, MLP, experts, LM head), of the tensor-core peak."""
    attention: float = 0.5
    """Attention core (flash-attention: scores, softmax, values), of the tensor-core peak."""
    scan: float = 0.25
    """Chunked scans built of small matmuls (Mamba2 SSD, gated DeltaNet), of the tensor peak."""
    vector: float = 0.5
    """Elementwise recurrences (Mamba1's selective scan), of the vector (non-tensor) peak."""
    bandwidth: float = 0.8
    """Memory-bound kernels (norms, activations, softmax, gathers), of the memory bandwidth."""


@dataclass(frozen=True, slots=True)
class Device:
    """One pipeline device: peak rates, memory bandwidth and size."""

    name: str
    description: str
    peak_flops: float
    """Dense bf16/fp16 FLOP/s of the matrix units."""
    fp32_flops: float
    """Dense fp32 matmul FLOP/s (TF32 on tensor-core GPUs)."""
    vector_flops: float
    """fp32 FLOP/s of the vector (non-tensor) units: elementwise recurrences."""
    mem_bandwidth: float
    """Bytes per second."""
    memory: int
    """Bytes."""
    efficiency: Efficiency = field(default_factory=Efficiency)
    node_link: str = "nvlink"
    """The link between GPUs of one node (`LINKS`): tensor-parallel collectives, and pipeline
    messages and data-parallel collectives that stay in the node."""

    def matmul_flops(self, dtype: str) -> float:
        """Peak matmul FLOP/s in a compute dtype (`bf16`, `fp16` or `fp32`)."""
        return self.fp32_flops if dtype == "fp32" else self.peak_flops


_GB = 10**9
_GIB = 2**30

DEVICES: dict[str, Device] = {
    d.name: d for d in (
        Device("H800", "NVIDIA H800 SXM (H100 compute, NVLink cut to 400 GB/s)",
               989.4e12, 494.7e12, 66.9e12, 3.35e12, 80 * _GB),
        Device("H100", "NVIDIA H100 SXM", 989.4e12, 494.7e12, 66.9e12, 3.35e12, 80 * _GB,
               node_link="nvlink4"),
        Device("H200", "NVIDIA H200 SXM", 989.4e12, 494.7e12, 66.9e12, 4.8e12, 141 * _GB,
               node_link="nvlink4"),
        Device("A100", "NVIDIA A100 SXM 80GB", 312e12, 156e12, 19.5e12, 2.039e12, 80 * _GB,
               node_link="nvlink3"),
        # One core of this machine (an AMD EPYC Zen 4 VM; the executor runs one rank per core
        # with one thread) and half its 24 GiB. Rates as measured with torch: ~95 GFLOP/s fp32
        # and ~200 GFLOP/s bf16 matmul on one thread, ~25 GB/s copy bandwidth.
        Device("cpu", "one core of this 2-core CPU (one executor rank), half its memory",
               200e9, 95e9, 30e9, 25e9, 12 * _GIB,
               Efficiency(gemm=0.75, attention=0.3, scan=0.15, vector=0.3, bandwidth=0.6),
               node_link="loopback"),
    )
}
"""Built-in devices by name."""

LINKS: dict[str, Link] = {
    link.name: link for link in (
        # H800 NVLink: 400 GB/s both ways together, 200 GB/s each way; ~80% achieved by NCCL p2p.
        Link("nvlink", 8e-6, 160e9),
        # H100/H200 NVLink 4: 450 GB/s each way.
        Link("nvlink4", 8e-6, 360e9),
        # A100 NVLink 3: 600 GB/s both ways, 300 GB/s each way, ~80% achieved.
        Link("nvlink3", 8e-6, 240e9),
        # InfiniBand NDR, one 400 Gb/s port per GPU: 50 GB/s, ~90% achieved.
        Link("ib-ndr", 15e-6, 45e9),
        # Processes on this machine talking through gloo over TCP loopback: measured ~2 GB/s
        # for 16 MiB messages; small ones took 0.2-2 ms with both cores busy.
        Link("loopback", 200e-6, 2e9),
        Link("none", 0.0, 0.0),
    )
}
"""Built-in point-to-point links by name; `none` means free communication."""


def get_device(name: str) -> Device:
    """A built-in device by name (case-insensitive); an OctoError lists the known ones."""
    for key, device in DEVICES.items():
        if key.lower() == name.lower():
            return device
    raise OctoError(f"unknown device {name!r} (built-ins: {', '.join(DEVICES)})")


def get_link(name: str) -> Link:
    """A built-in link by name; an OctoError lists the known ones."""
    try:
        return LINKS[name.lower()]
    except KeyError:
        raise OctoError(f"unknown link {name!r} (built-ins: {', '.join(LINKS)})") from None
