"""Device and link descriptions for the analytical cost model: the built-ins, and a user's own
as device and link files (`costs/device_file.py`), accepted wherever a built-in's name is."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import OctoError
from .attention import AttentionCurve, AttentionModel
from .gemm import GemmModel, Tile
from .table import Link
from .work import Gemm


@dataclass(frozen=True, slots=True)
class Efficiency:
    """Achievable fractions of peak of the work that has no shape model of its own: round
    estimates, not measurements (docs/models-and-costs.md says so; a device file or `octodsl
    calibrate` replaces them)."""

    attention: float = 0.5
    """Attention core of a device without measured kernel curves (`Device.attention` None), of
    the tensor-core peak."""
    scan: float = 0.25
    """Chunked scans built of small matmuls (Mamba2 SSD, gated DeltaNet), of the tensor peak."""
    vector: float = 0.5
    """Elementwise recurrences (Mamba1's selective scan), of the vector (non-tensor) peak."""
    bandwidth: float = 0.8
    """Memory-bound kernels (norms, activations, softmax, gathers, the optimizer step), of the
    memory bandwidth."""


@dataclass(frozen=True, slots=True)
class Overheads:
    """What a sub-layer's F and B cost beyond the kernels the analytical model counts, per op:
    a fixed part (kernel launches, host work between kernels) and a part per activation element
    (tokens x hidden on this GPU: the layout copies, casts and fp32 statistics a byte count of
    the main kernels misses), in bytes at the device's memory bandwidth."""

    f_seconds: float = 0.0
    b_seconds: float = 0.0
    f_bytes: float = 0.0
    b_bytes: float = 0.0
    message_seconds: float = 0.0
    """Each pipeline message's cost beyond its link's time (posting the send and the receive,
    synchronising them)."""


MEGATRON_A100_OVERHEADS = Overheads(0.252e-3, 0.282e-3, 76.8, 9.9, 0.413e-3)
"""Fitted to ZeroBubble's per-op profile (Qi et al. 2024, arXiv 2401.10241, Table 6: T_F, T_B
and T_comm of 1.5B-28.3B GPT models on A100s under Megatron-LM, without FlashAttention as the
paper's code ran them) against this model's F and B of the same stages (least squares, per
sub-layer: seconds + bytes x elements) and T_comm against the message's NVLink time: what
Megatron-style eager PyTorch spends beyond its kernels' roofline. benchmarks/fit_overheads.py
makes it (and benchmarks/fit_overheads.md shows the fit). The GPUs share it (the bytes scale
with each one's bandwidth, the seconds are the host's); docs/models-and-costs.md, "Overheads"."""


@dataclass(frozen=True, slots=True)
class CommSms:
    """SMs a collective's kernel holds while it runs under compute: the compute it overlaps
    runs on the others, so an overlap hides a collective's seconds but costs its share of the
    SMs for as long ("NCCL CTAs won't share an SM with compute kernels", NVIDIA/nccl issue
    #1656, quoting #689). docs/models-and-costs.md, "Overlaps"."""

    tp: int = 0
    """Transformer Engine's userbuffers kernel of an overlapped tensor-parallel collective
    (`overlap_tp_comm`): 16, TE's default `num_sm` (transformer_engine/pytorch/module/base.py,
    `add_ub`, v1.8), which Megatron-LM passes unchanged without a --tp-comm-overlap-cfg. It
    holds them for the reduce-scatters of F and B and the all-gathers of W (the `pipeline`
    and `bulk` methods); the all-gathers of F and B go round a ring exchange on the copy
    engine (`ring_exchange`, `use_ce`), without SMs."""
    dp_node: int = 0
    """NCCL's ring collective of a data-parallel group inside one node (`overlap_grad_reduce`,
    `overlap_param_gather`, ZeRO 2's reduce-scatters): one CTA per channel."""
    dp_per_gpu: int = 0
    """The same across nodes: channels per GPU the group has in a node (NCCL's ring search
    gives each GPU's own NIC one channel, then doubles them, and on Hopper doubles again)."""
    dp_max: int = 0
    """The most channels of a ring across nodes."""

    def dp(self, gpus_per_node: int, spans_nodes: bool) -> int:
        """The SMs of a data-parallel ring with `gpus_per_node` of its GPUs in each node."""
        if not spans_nodes:
            return self.dp_node
        return min(self.dp_max, self.dp_per_gpu * gpus_per_node)


@dataclass(frozen=True, slots=True)
class Device:
    """One pipeline device: peak rates, memory bandwidth and size, and how its kernels reach
    them."""

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
    gemm: GemmModel
    """How its GEMMs' rate depends on their shape (costs/gemm.py)."""
    attention: AttentionModel | None = None
    """Its flash-attention kernel's measured rates (None: `efficiency.attention` of the peak)."""
    efficiency: Efficiency = field(default_factory=Efficiency)
    overheads: Overheads = MEGATRON_A100_OVERHEADS
    """Per-op overheads of a training framework's layers on this device (`Overheads`)."""
    comm_sms: CommSms = CommSms()
    """SMs an overlapped collective takes from the compute under it (`CommSms`; none on a CPU)."""
    node_link: str | Link = "nvlink"
    """The link between GPUs of one node: tensor-parallel collectives, and pipeline messages and
    data-parallel collectives that stay in the node. A built-in's name (`LINKS`), or a device
    file's own link (`get_link` takes either)."""
    inter_node_link: str | Link = "ib-ndr"
    """The link between nodes of the clusters this device is built into, per GPU: pipeline
    messages and data-parallel collectives that leave a node (a name in `LINKS`, or a Link)."""
    source: str = ""
    """Where the figures come from (docs/models-and-costs.md has the whole list)."""

    def matmul_flops(self, dtype: str) -> float:
        """Peak matmul FLOP/s in a compute dtype (`bf16`, `fp16` or `fp32`)."""
        return self.fp32_flops if dtype == "fp32" else self.peak_flops

    @property
    def bandwidth(self) -> float:
        """Achievable bytes per second of memory-bound kernels."""
        return self.mem_bandwidth * self.efficiency.bandwidth

    def overlap_slowdown(self, sms: int) -> float:
        """The fraction of its rate the compute loses while a collective holding `sms` of its
        SMs runs under it (0 on a device without SMs)."""
        return min(1.0, sms / self.gemm.sms) if self.gemm.sms else 0.0


_GB = 10**9
_GIB = 2**30

CUBLAS_TILES = (
    Tile(256, 128),
    Tile(128, 256),
    Tile(128, 128),
    Tile(128, 64, 2 / 3),
    Tile(64, 128, 2 / 3),
    Tile(64, 64, 0.5),
)
"""Output tiles of cuBLAS's tensor-core kernels (NVIDIA, "Matrix Multiplication Background
User's Guide", "Typical tile dimensions in cuBLAS"). A tile of tm x tn loads tm + tn elements
per k step for tm x tn products: below 128 x 128 its operand traffic, not the tensor cores,
bounds it, and the rate falls with tm tn / (tm + tn) (128 x 64: 2/3, 64 x 64: 1/2 of 128 x
128's)."""


def _tensor_core_gemm(
    mamf: float, shape: tuple[int, int, int], sms: int, peak: float, bandwidth: float
) -> GemmModel:
    """The GEMM model of a GPU whose best-shaped bf16 GEMM (`shape`, m x n x k) was measured
    at `mamf` of its peak (Stas Bekman's "Maximum Achievable Matmul FLOPS", ml-engineering,
    compute/accelerator). A tile's epilogue writes its tm x tn outputs (2 bytes each) at the
    SM's share of the bandwidth, while each step of its mainloop does 2 tm tn FLOPs at the SM's
    share of the rate: the epilogue is worth rate / bandwidth steps of k whatever the tile
    (`k_ramp`), which a GEMM over a short k (a weight gradient over one micro-batch's tokens)
    pays most. The mainloop's rate is what makes the model give `mamf` at `shape`; being the
    best of a search over shapes, `mamf` is also the most any shape gets (`GemmModel.ceiling`)."""
    ramp = mamf * peak / bandwidth
    unit = GemmModel(1.0, sms, CUBLAS_TILES, ramp)
    m, n, k = shape
    return GemmModel(
        mamf / unit.efficiency(Gemm(m, n, k), peak, bandwidth, 2), sms, CUBLAS_TILES, ramp, mamf
    )


def _curves(
    seq: tuple[int, ...], by_dim: dict[int, tuple[float, ...]]
) -> tuple[AttentionCurve, ...]:
    return tuple(AttentionCurve(d, seq, t) for d, t in sorted(by_dim.items()))


_FA_SEQ = (512, 1024, 2048, 4096, 8192, 16384)
"""The sequence lengths FlashAttention's benchmarks measure (16k tokens per batch, hidden 2048)."""
A100_ATTENTION = AttentionModel(
    *(_curves(_FA_SEQ, {64: (88, 119, 140, 156, 165, 171), 128: (99, 133, 155, 173, 182, 189)}),)
    * 2,
    source="FlashAttention-2, causal, forward + backward, A100 80GB SXM4 (Dao-AILab/flash-attention "
    "README, assets/flash2_a100_fwd_bwd_benchmark.png)",
)
"""Only forward + backward was measured: both directions run at that rate."""
HOPPER_ATTENTION = AttentionModel(
    _curves(_FA_SEQ, {64: (225, 288, 334, 363, 379, 388), 128: (315, 410, 484, 518, 529, 539)}),
    _curves(_FA_SEQ, {64: (266, 348, 395, 417, 432, 433), 128: (305, 408, 465, 499, 518, 516)}),
    source="cuDNN fused attention (Transformer Engine's on Hopper, as Megatron-LM and NeMo run it), "
    "H100 SXM5: forward causal, backward as published (FlashAttention-3, Shah et al. 2024, "
    "arXiv 2407.08608, Figures 5-6)",
)
"""H100's compute (the H800 and H200 have the same SMs and clocks: the same rates)."""

_A100_BW = 2.039e12
_H100_BW = 3.35e12
_A100_MAMF = (0.869, (1024, 10240, 5120))
"""A100 SXM: 271.2 of 312 TFLOP/s at 1024 x 10240 x 5120 (MAMF)."""
_HOPPER_MAMF = (0.803, (2048, 2048, 13312))
"""H100 SXM: 794.5 of 989 TFLOP/s at 2048 x 2048 x 13312 (MAMF)."""
A100_SMS = 108
"""An A100's SMs (NVIDIA A100 Tensor Core GPU Architecture whitepaper)."""
_A100_GEMM = _tensor_core_gemm(*_A100_MAMF, A100_SMS, 312e12, 0.8 * _A100_BW)
_HOPPER_GEMM = _tensor_core_gemm(*_HOPPER_MAMF, 132, 989.4e12, 0.8 * _H100_BW)
_MAMF_SOURCE = (
    "GEMM: Stas Bekman's Maximum Achievable Matmul FLOPS (ml-engineering, compute/accelerator)"
)
_HOPPER_SOURCE = (
    "NVIDIA H100 Tensor Core GPU datasheet (SXM: 989.4 TFLOP/s dense bf16, 494.7 "
    "TF32, 66.9 fp32; 3.35 TB/s HBM3); " + _MAMF_SOURCE + ", H100 SXM 80.3% at "
    "2048x2048x13312; attention: " + HOPPER_ATTENTION.source
)

_TE_UB_SMS = 16
"""Transformer Engine's userbuffers SMs per overlapped tp collective (`CommSms.tp`)."""
A100_COMM_SMS = CommSms(_TE_UB_SMS, 24, 2, 32)
"""DGX A100 (12 NVLinks per GPU on NVSwitches, a 200 Gb/s NIC per GPU). NCCL's CTAs per ring,
from its topology search (src/graph/search.cc, connect.cc, v2.18-2.21; run on a model of the
node, docs/nccl-channels.md): in one node 12 channels, doubled, 24 (NVIDIA/nccl
issue #1225: "For dgxA100, 12 nvlink and 24 cta for allreduce case"); across nodes one per GPU's
NIC (24 GB/s each, its PCIe link's), doubled: 2 per GPU (NVIDIA/nccl issue #812: 8 channels of
24 GB/s, 192 GB/s on 8 x 200G), up to MAXCHANNELS, 32."""
_H100_COMM = CommSms(_TE_UB_SMS, 24, 4, 16)
"""DGX H100 (18 NVLinks, a 400 Gb/s NIC per GPU), NCCL 2.20-2.21: in one node 12 channels,
doubled, 24 (the search on a model of the node; no log found); across nodes one channel per
GPU's NIC, doubled, and doubled again on Hopper below 16 channels (connect.cc: `nChannels <
16`): 4 per GPU, 16 at 8 GPUs a node (NVIDIA/nccl issue #1453's log on 3 nodes of 8 H100s:
"Channel 00/16"; issue #1291's on one GH200 a node: "Channel 00/04")."""
_H800_COMM = CommSms(_TE_UB_SMS, 16, 4, 16)
"""H800 (8 NVLinks): 16 channels in one node (NVIDIA/nccl issue #892's log: "16 coll
channels"); across nodes as the H100's."""

DEVICES: dict[str, Device] = {
    d.name: d
    for d in (
        Device(
            "H800",
            "NVIDIA H800 SXM (H100 compute, NVLink cut to 400 GB/s)",
            989.4e12,
            494.7e12,
            66.9e12,
            _H100_BW,
            80 * _GB,
            _HOPPER_GEMM,
            HOPPER_ATTENTION,
            comm_sms=_H800_COMM,
            source="H100 SXM's compute and memory: " + _HOPPER_SOURCE,
        ),
        Device(
            "H100",
            "NVIDIA H100 SXM",
            989.4e12,
            494.7e12,
            66.9e12,
            _H100_BW,
            80 * _GB,
            _HOPPER_GEMM,
            HOPPER_ATTENTION,
            comm_sms=_H100_COMM,
            node_link="nvlink4",
            source=_HOPPER_SOURCE,
        ),
        Device(
            "H200",
            "NVIDIA H200 SXM",
            989.4e12,
            494.7e12,
            66.9e12,
            4.8e12,
            141 * _GB,
            _HOPPER_GEMM,
            HOPPER_ATTENTION,
            comm_sms=_H100_COMM,
            node_link="nvlink4",
            source="NVIDIA H200 datasheet (141 GB HBM3e, 4.8 TB/s; H100 SXM's compute): "
            + _HOPPER_SOURCE,
        ),
        Device(
            "A100",
            "NVIDIA A100 SXM 80GB",
            312e12,
            156e12,
            19.5e12,
            _A100_BW,
            80 * _GB,
            _A100_GEMM,
            A100_ATTENTION,
            comm_sms=A100_COMM_SMS,
            node_link="nvlink3",
            inter_node_link="ib-hdr",
            source="NVIDIA A100 Tensor Core GPU datasheet (SXM 80GB: 312 TFLOP/s dense bf16, "
            "156 TF32, 19.5 fp32; 2.039 TB/s HBM2e); " + _MAMF_SOURCE + ", A100 SXM "
            "86.9% at 1024x10240x5120; attention: " + A100_ATTENTION.source,
        ),
        # One core of this machine (an AMD EPYC Zen 4 VM; the executor runs one rank per core
        # with one thread) and half its 24 GiB. Rates as measured with torch: ~95 GFLOP/s fp32
        # and ~200 GFLOP/s bf16 matmul on one thread, ~25 GB/s copy bandwidth.
        Device(
            "cpu",
            "one core of this 2-core CPU (one executor rank), half its memory",
            200e9,
            95e9,
            30e9,
            25e9,
            12 * _GIB,
            GemmModel(0.75),
            efficiency=Efficiency(attention=0.3, scan=0.15, vector=0.3, bandwidth=0.6),
            overheads=Overheads(),
            node_link="loopback",
            inter_node_link="loopback",
            source="measured with torch on this machine (an AMD EPYC Zen 4 VM): ~95 GFLOP/s "
            "fp32 and ~200 GFLOP/s bf16 matmul on one thread, ~25 GB/s copy bandwidth",
        ),
    )
}
"""Built-in devices by name."""

GEMM_CALIBRATION: dict[str, tuple[float, tuple[int, int, int]]] = {
    "H800": _HOPPER_MAMF,
    "H100": _HOPPER_MAMF,
    "H200": _HOPPER_MAMF,
    "A100": _A100_MAMF,
}
"""The measurement each built-in GPU's GEMM model is calibrated on (`_tensor_core_gemm`): the
fraction of the peak its best-shaped bf16 GEMM reaches, and that shape (m, n, k). `octodsl
devices NAME --yaml` writes it as the device file's `gemm: {mamf, shape}`."""

LINKS: dict[str, Link] = {
    link.name: link
    for link in (
        Link(
            "nvlink",
            8e-6,
            160e9,
            "H800 NVLink: 400 GB/s both ways together, 200 GB/s each way; ~80% achieved (H100's "
            "NCCL ring all-reduce reaches 370 of its 450 GB/s each way: 82%)",
        ),
        Link(
            "nvlink4",
            8e-6,
            370e9,
            "H100/H200 NVLink 4: NCCL's ring all-reduce bus bandwidth on 8 GPUs, 370 GB/s "
            '(NVIDIA, GTC24 S62129 / GTC25 S72583, "NCCL Tests Allreduce Bus Bandwidth")',
        ),
        Link(
            "nvlink3",
            8e-6,
            232e9,
            "A100 NVLink 3: NCCL's ring all-reduce bus bandwidth on 8 GPUs, 232 GB/s (of 300 "
            "GB/s each way; NVIDIA, GTC24 S62129)",
        ),
        Link(
            "ib-ndr",
            15e-6,
            46e9,
            "InfiniBand NDR, one 400 Gb/s port per GPU: DGX H100's 8 x 400 Gb/s all-reduce bus "
            "bandwidth across nodes is 370 GB/s (NVIDIA, GTC25 S72583), 46 GB/s a port",
        ),
        Link(
            "ib-hdr",
            15e-6,
            24e9,
            "InfiniBand HDR, one 200 Gb/s port per GPU (DGX A100, NVIDIA Selene): 192 GB/s over "
            "a node's 8 ports (NVIDIA, GTC24 S62129), 24 GB/s a port",
        ),
        Link(
            "loopback",
            200e-6,
            2e9,
            "processes on this machine talking through gloo over TCP loopback: measured ~2 GB/s "
            "for 16 MiB messages; small ones took 0.2-2 ms with both cores busy",
        ),
        Link("none", 0.0, 0.0, "free communication"),
    )
}
"""Built-in point-to-point links by name (per GPU, one direction); `none` means free
communication."""

INTER_NODE_LINK = "ib-ndr"
"""The default link between nodes (InfiniBand NDR, one 400 Gb/s port per GPU) where no device
says otherwise; inside a node each device names its own (`Device.node_link`)."""


FILE_SUFFIXES = (".yaml", ".yml", ".json")
"""A device or link given by a name that ends so is a file (so is any name of a file that
exists, but a built-in's name first)."""


def is_file_name(name: str) -> bool:
    """Whether `name`, not a built-in's, names a device or link file."""
    return Path(name).suffix.lower() in FILE_SUFFIXES or os.path.exists(name)


def builtin_device(name: str) -> Device | None:
    """The built-in device of this name (case-insensitive), else None."""
    for key, device in DEVICES.items():
        if key.lower() == name.lower():
            return device
    return None


def get_device(name: str) -> Device:
    """A built-in device by name (case-insensitive), else a device file by path (YAML or JSON,
    `costs/device_file.py`; read once while it is unchanged). An OctoError lists the built-ins;
    a bad file's names the file (its `path`) and the field."""
    device = builtin_device(name)
    if device is not None:
        return device
    if is_file_name(name):
        from .device_file import load_device

        return load_device(name)
    raise OctoError(
        f"unknown device {name!r} (built-ins: {', '.join(DEVICES)}; or a device "
        "file, .yaml or .json: `octodsl devices` lists the built-ins)"
    )


def get_link(name: str | Link) -> Link:
    """A built-in link by name (case-insensitive), else a link file by path (as `get_device`);
    a Link (a device file's own) as it is. An OctoError lists the built-ins."""
    if isinstance(name, Link):
        return name
    link = LINKS.get(name.lower())
    if link is not None:
        return link
    if is_file_name(name):
        from .device_file import load_link

        return load_link(name)
    raise OctoError(
        f"unknown link {name!r} (built-ins: {', '.join(LINKS)}; or a link file, .yaml or .json)"
    )
